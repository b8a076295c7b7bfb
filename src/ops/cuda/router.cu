// MoE router: softmax over experts (fp32), logsumexp, top-k (descending, ties to the lower
// index), optional renormalisation, and the exact backward of all three. The cpu kernels:
// src/ops/cpu/router.c (same formulas and, per token, the same order of the k-term sums).
//
// One warp per token; lane l owns experts e = l, l + 32, ... (E is any size).
#include <string.h>

#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

#define ROUTER_WARPS 8   // tokens per block

// (value, index) of the better of two candidates: larger value, then lower index; index -1 is
// "none". A strict total order on valid pairs, so the butterfly gives every lane the same pair.
__device__ __forceinline__ void better_of(float &v, int &i, float v2, int i2) {
    if (i2 >= 0 && (i < 0 || v2 > v || (v2 == v && i2 < i))) v = v2, i = i2;
}

__global__ void router_forward_kernel(float *probs, float *lse, int32_t *topk_idx, float *topk_w,
                                      const float *logits, int N, int E, int k, bool normalize) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;                                   // whole warps leave together
    const float *z = logits + (size_t)n * E;
    float *p = probs + (size_t)n * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, z[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
        float pe = expf(z[e] - mx);
        p[e] = pe;                                        // this lane reads it back below
        sum += pe;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] = p[e] / sum;
    if (lane == 0) lse[n] = mx + logf(sum);
    // top-k without a "taken" set: pick j is the best expert strictly after pick j-1 in the
    // order (prob descending, index ascending), which is what the cpu's taken-set loop selects.
    int32_t *idx = topk_idx + (size_t)n * k;
    float *w = topk_w + (size_t)n * k;
    float prev_v = INFINITY, wsum = 0.0f;
    int prev_i = -1;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = -1;
        for (int e = lane; e < E; e += 32) {
            float v = p[e];
            bool after_prev = v < prev_v || (v == prev_v && e > prev_i);
            if (after_prev && (bi < 0 || v > bv)) bv = v, bi = e;   // e ascending: ties keep the lower index
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            better_of(bv, bi, v2, i2);
        }
        if (bi < 0) {
            // Nothing after the previous pick in the order: NaN probabilities (an fp16 overflow
            // upstream makes the whole row NaN). The cpu's loop then takes the lowest expert not
            // yet taken, which for such a row is the next index (0, 1, ..., k-1).
            __syncwarp();   // p[] was written by other lanes
            bi = prev_i + 1;
            bv = p[bi];
        }
        if (lane == 0) idx[j] = bi, w[j] = bv;
        wsum += bv;
        prev_v = bv, prev_i = bi;
    }
    if (normalize && lane == 0)
        for (int j = 0; j < k; j++) w[j] /= wsum;
}

void cuda_router_forward(Backend *be, float *probs, float *lse, int32_t *topk_idx, float *topk_w,
                         const float *logits, int N, int E, int k, bool normalize) {
    if (N <= 0 || E <= 0) return;
    router_forward_kernel<<<cuda_blocks((size_t)N, ROUTER_WARPS), ROUTER_WARPS * 32, 0, cuda_state(be)->stream>>>(
        probs, lse, topk_idx, topk_w, logits, N, E, k, normalize);
    CUDA_LAUNCHED(be);
}

// dprob[E] is a host array. Up to ROUTER_DPROB_INLINE experts it travels by value in the kernel
// parameters (no copy, no sync, nothing to keep alive); beyond, it is copied into scratch with
// cudaMemcpyAsync (pageable source: the driver stages it before returning).
#define ROUTER_DPROB_INLINE 256
typedef struct {
    float v[ROUTER_DPROB_INLINE];
} DprobInline;

enum { DPROB_NONE = 0, DPROB_INLINE, DPROB_DEVICE };

__global__ void router_backward_kernel(float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                                       const int32_t *topk_idx, const float *topk_w, int dprob_mode,
                                       DprobInline dprob_inline, const float *dprob_dev, float z_coef, int N, int E,
                                       int k, bool normalize) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *p = probs + (size_t)n * E, *dw = dtopk_w + (size_t)n * k, *w = topk_w + (size_t)n * k;
    const int32_t *idx = topk_idx + (size_t)n * k;
    float *dz = dlogits + (size_t)n * E;                  // dL/dprobs first, then dL/dlogits
    // w_j = p_j / S, S = sum of the selected p: dp_m = (dw_m - sum_j dw_j w_j) / S
    float s = 0.0f, dot = 0.0f;
    if (normalize)
        for (int j = 0; j < k; j++) {                     // every lane, the cpu's order
            s += p[idx[j]];
            dot += dw[j] * w[j];
        }
    float sdot = 0.0f;
    for (int e = lane; e < E; e += 32) {
        float d = dprob_mode == DPROB_INLINE ? dprob_inline.v[e] : dprob_mode == DPROB_DEVICE ? dprob_dev[e] : 0.0f;
        for (int j = 0; j < k; j++)                       // top-k ids are distinct: at most one match
            if (idx[j] == e) d += normalize ? (dw[j] - dot) / s : dw[j];
        dz[e] = d;                                        // this lane reads it back below
        sdot += p[e] * d;
    }
    sdot = warp_sum(sdot);
    // softmax: dz_e = p_e * (dp_e - sum p*dp); z-loss lse^2: dz_e += 2*lse*p_e*z_coef
    const float zc = 2.0f * z_coef * lse[n];
    for (int e = lane; e < E; e += 32) dz[e] = p[e] * (dz[e] - sdot) + zc * p[e];
}

void cuda_router_backward(Backend *be, float *dlogits, const float *dtopk_w, const float *probs, const float *lse,
                          const int32_t *topk_idx, const float *topk_w, const float *dprob, float z_coef, int N,
                          int E, int k, bool normalize) {
    if (N <= 0 || E <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    DprobInline inl;
    memset(&inl, 0, sizeof inl);
    int mode = DPROB_NONE;
    float *dev = nullptr;
    if (dprob && E <= ROUTER_DPROB_INLINE) {
        memcpy(inl.v, dprob, (size_t)E * sizeof(float));
        mode = DPROB_INLINE;
    } else if (dprob) {
        dev = (float *)cuda_scratch(be, (size_t)E * sizeof(float));
        if (!dev) return;
        CUDA_CHECK(be, cudaMemcpyAsync(dev, dprob, (size_t)E * sizeof(float), cudaMemcpyHostToDevice, st));
        mode = DPROB_DEVICE;
    }
    router_backward_kernel<<<cuda_blocks((size_t)N, ROUTER_WARPS), ROUTER_WARPS * 32, 0, st>>>(
        dlogits, dtopk_w, probs, lse, topk_idx, topk_w, mode, inl, dev, z_coef, N, E, k, normalize);
    CUDA_LAUNCHED(be);
}
