// Picking the next token from a row of logits, in the order of transformers' generate (5.23):
// the repetition penalty first (a logits processor: greedy decoding gets it too), then greedy
// argmax (temperature 0), or sampling from softmax(logits / temperature) restricted to the top_k
// most likely tokens, then to the smallest set whose probability, renormalised over those, reaches
// top_p (nucleus), then to the tokens at least min_p times as likely as the most likely one.
// Deterministic for an Rng state.
#pragma once
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    float temperature;          // <= 0: greedy argmax
    int top_k;                  // <= 0: no top-k cut
    float top_p;                // >= 1 (or <= 0): no nucleus cut
    float min_p;                // <= 0: no min-p cut
    float repetition_penalty;   // 1 (or <= 0, as in a zeroed struct): none
} SamplingParams;

// Index of the largest logit (the first one on ties, like torch.argmax).
int sample_argmax(const float *logits, int V);

// transformers' RepetitionPenaltyLogitsProcessor on logits[V], in place: each distinct id of
// seen[n_seen] below V (the prompt and the tokens generated so far) has its logit divided by
// `penalty` where positive, multiplied where negative, once however often it occurs. mark holds
// V entries (scratch).
void sampling_repetition_penalty(float *logits, int V, const int32_t *seen, int n_seen, float penalty, int *mark);

// The candidates sampling draws from (temperature > 0): probs[V] = softmax(logits / temperature),
// index[0..return value) the kept token ids in decreasing probability (ties: lower id first).
int sampling_candidates(const float *logits, int V, const SamplingParams *params, float *probs, int *index);

// Samples one token from logits[V] (penalised in place when params has a repetition penalty;
// seen[n_seen]: the ids so far). scratch_probs/scratch_index hold V entries each (the caller owns
// them so a generation loop allocates once).
int sample_token(float *logits, int V, const SamplingParams *params, const int32_t *seen, int n_seen, Rng *rng,
                 float *scratch_probs, int *scratch_index);
