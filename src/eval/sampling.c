#include "eval/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sample_argmax(const float *logits, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

void sampling_repetition_penalty(float *logits, int V, const int32_t *seen, int n_seen, float penalty, int *mark) {
    memset(mark, 0, (size_t)V * sizeof(int));
    for (int i = 0; i < n_seen; i++) {
        int32_t id = seen[i];
        if (id < 0 || id >= V || mark[id]) continue;
        mark[id] = 1;
        logits[id] = logits[id] < 0 ? logits[id] * penalty : logits[id] / penalty;
    }
}

// Indices ordered by decreasing probability, ties by lower index (a total order, so the
// result does not depend on the sort algorithm).
static int by_prob_desc(const void *a, const void *b, void *probs_arg) {
    const float *probs = probs_arg;
    int i = *(const int *)a, j = *(const int *)b;
    if (probs[i] > probs[j]) return -1;
    if (probs[i] < probs[j]) return 1;
    return i - j;
}

int sampling_candidates(const float *logits, int V, const SamplingParams *params, float *probs, int *index) {
    // probs = softmax(logits / T), in a numerically safe form.
    float max = logits[sample_argmax(logits, V)];
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        probs[i] = expf((logits[i] - max) / params->temperature);
        sum += probs[i];
    }
    for (int i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);

    // Candidates in decreasing probability; keep the top_k, then the nucleus of mass top_p of what
    // top_k kept (transformers' TopPLogitsWarper sees the top-k renormalised), then min_p. Each cut
    // keeps the most likely token.
    for (int i = 0; i < V; i++) index[i] = i;
    qsort_r(index, (size_t)V, sizeof(int), by_prob_desc, probs);
    int keep = V;
    if (params->top_k > 0 && params->top_k < keep) keep = params->top_k;
    if (params->top_p > 0.0f && params->top_p < 1.0f) {
        double kept_mass = 0.0, mass = 0.0;
        for (int r = 0; r < keep; r++) kept_mass += probs[index[r]];
        for (int r = 0; r < keep; r++) {
            mass += probs[index[r]];
            if (mass >= params->top_p * kept_mass) {
                keep = r + 1;
                break;
            }
        }
    }
    if (params->min_p > 0.0f) {
        // MinPLogitsWarper: drop tokens less likely than min_p times the top one (renormalising
        // over the kept ones changes neither side of that comparison's ratio).
        float threshold = params->min_p * probs[index[0]];
        for (int r = 1; r < keep; r++)
            if (probs[index[r]] < threshold) {
                keep = r;
                break;
            }
    }
    return keep;
}

int sample_token(float *logits, int V, const SamplingParams *params, const int32_t *seen, int n_seen, Rng *rng,
                 float *probs, int *index) {
    if (params->repetition_penalty > 0.0f && params->repetition_penalty != 1.0f)
        sampling_repetition_penalty(logits, V, seen, n_seen, params->repetition_penalty, index);
    if (params->temperature <= 0.0f) return sample_argmax(logits, V);
    int keep = sampling_candidates(logits, V, params, probs, index);

    // Draw from the kept candidates, renormalised.
    double kept_mass = 0.0;
    for (int r = 0; r < keep; r++) kept_mass += probs[index[r]];
    double u = rng_uniform(rng) * kept_mass, acc = 0.0;
    for (int r = 0; r < keep; r++) {
        acc += probs[index[r]];
        if (u < acc) return index[r];
    }
    return index[keep - 1];   // rounding left u == kept_mass: the last candidate
}
