// MoE router: softmax over experts in fp32, top-k (ties to the lower index, as torch.topk
// does in practice), optional renormalisation, and the exact backward of all three.
#include <math.h>

#include "ops/cpu/vmath.h"
#include "ops/cpu/cpu_ops.h"

void op_router_forward(float *probs, float *lse, int32_t *topk_idx, float *topk_w, const float *logits, int N,
                       int E, int k, bool normalize) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * E;
        float *p = probs + (size_t)n * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            p[e] = vexpf(z[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        lse[n] = mx + logf(sum);
        int32_t *idx = topk_idx + (size_t)n * k;
        float *w = topk_w + (size_t)n * k;
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int m = 0; m < j; m++) taken |= idx[m] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            w[j] = p[best];
            wsum += p[best];
        }
        if (normalize)
            for (int j = 0; j < k; j++) w[j] /= wsum;
    }
}

void op_router_backward(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                        const int32_t *topk_idx, const float *topk_w, const float *dprob, float z_coef, int N, int E,
                        int k, bool normalize) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * E, *dw = dtopk_w + (size_t)n * k, *w = topk_w + (size_t)n * k;
        const int32_t *idx = topk_idx + (size_t)n * k;
        float *dz = dlogits + (size_t)n * E;   // holds dL/dprobs first, then dL/dlogits
        for (int e = 0; e < E; e++) dz[e] = dprob ? dprob[e] : 0.0f;
        if (normalize) {
            // w_j = p_j / S, S = sum of the selected p: dp_m = (dw_m - sum_j dw_j w_j) / S
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; j++) {
                s += p[idx[j]];
                dot += dw[j] * w[j];
            }
            for (int j = 0; j < k; j++) dz[idx[j]] += (dw[j] - dot) / s;
        } else {
            for (int j = 0; j < k; j++) dz[idx[j]] += dw[j];
        }
        // softmax: dz_e = p_e * (dp_e - sum p*dp); z-loss lse^2: dz_e += 2*lse*p_e*z_coef
        float sdot = 0.0f;
        for (int e = 0; e < E; e++) sdot += p[e] * dz[e];
        float zc = 2.0f * z_coef * lse[n];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - sdot) + zc * p[e];
    }
}
