// Fused cross-entropy + LM z-loss over rows of logits (any NumType), with the gradient
// written in place in the logits' type. The cpu kernel: src/ops/cpu/cross_entropy.c.
//
// One block per row (rows ld elements apart; the LM head pads ld to a multiple of 128, so a
// row of an odd vocabulary still starts 16-byte aligned). Pass 1: each thread keeps an online
// (max, sum of exp(x - max)) over its W-element groups c = tid*W, tid*W + blockDim*W, ... and
// then the row's last V % W columns one each; the pairs are merged by a fixed butterfly
// inside each warp and then across the warps: lse = max + log(sum) in fp32.
// Pass 2 (grad): x = (ce_scale + 2*z_scale*lse) * exp(x - lse), minus ce_scale at the target.
// The row is read twice (the second time mostly from L2) and written once.
#include <stdio.h>

#include "model/model_config.h"
#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

#define CE_THREADS 512

// (m, s) := the merge of (m, s) and (m2, s2): the sum of exp(x - max) over both sets.
// Symmetric in its two arguments (IEEE + commutes), so a butterfly leaves all lanes equal.
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    if (M == -INFINITY) return;                           // both empty (or all -inf): stay (-inf, 0)
    float a = m == -INFINITY ? 0.0f : s * expf(m - M);
    float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - M);
    m = M, s = a + b;
}

__device__ __forceinline__ void warp_lse_merge(float &m, float &s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
}

// Row r's (max, sum) over its columns: vectors of W over [0, Vv), then single elements over
// the tail [Vv, V) (Vv = V rounded down to W; no tail when W == 1).
template <typename T, int W>
__global__ void cross_entropy_kernel(T *logits, int ld, float *ce, float *lse, const int32_t *targets, int V,
                                     float ce_scale, float z_scale, bool grad) {
    __shared__ float sh_m[32], sh_s[32];
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int Vv = V - V % W;
    T *x = logits + (size_t)r * ld;
    const int t = targets[r];
    if (t == IGNORE_INDEX) {
        if (tid == 0) ce[r] = lse[r] = 0.0f;
        if (grad) {
            float z[W];
#pragma unroll
            for (int j = 0; j < W; j++) z[j] = 0.0f;
            for (int c = tid * W; c < Vv; c += blockDim.x * W) store_vec<W>(x + c, z);
            for (int c = Vv + tid; c < V; c += blockDim.x) x[c] = from_f<T>(0.0f);
        }
        return;
    }
    const float x_target = tid == 0 ? to_f(x[t]) : 0.0f;   // read before any thread writes the gradient
    float m = -INFINITY, s = 0.0f;
    for (int c = tid * W; c < Vv; c += blockDim.x * W) {
        float v[W];
        load_vec<W>(x + c, v);
        float vm = v[0];
#pragma unroll
        for (int j = 1; j < W; j++) vm = fmaxf(vm, v[j]);
        if (vm > m) {
            s = m == -INFINITY ? 0.0f : s * expf(m - vm);
            m = vm;
        }
        if (m != -INFINITY)
#pragma unroll
            for (int j = 0; j < W; j++) s += expf(v[j] - m);
    }
    for (int c = Vv + tid; c < V; c += blockDim.x) lse_merge(m, s, to_f(x[c]), 1.0f);
    warp_lse_merge(m, s);
    if (lane == 0) sh_m[warp] = m, sh_s[warp] = s;
    __syncthreads();
    m = lane < nwarps ? sh_m[lane] : -INFINITY;
    s = lane < nwarps ? sh_s[lane] : 0.0f;
    warp_lse_merge(m, s);                                 // every warp the same merge: same bits
    const float l = m + logf(s);
    if (tid == 0) {
        lse[r] = l;
        ce[r] = l - x_target;
    }
    if (!grad) return;
    // d/dx [ce_scale*(lse - x_t) + z_scale*lse^2] = (ce_scale + 2*z_scale*lse)*softmax - ce_scale*onehot
    const float a = ce_scale + 2.0f * z_scale * l;
    for (int c = tid * W; c < Vv; c += blockDim.x * W) {
        float v[W];
        load_vec<W>(x + c, v);
#pragma unroll
        for (int j = 0; j < W; j++) {
            v[j] = a * expf(v[j] - l);
            if (c + j == t) v[j] -= ce_scale;
        }
        store_vec<W>(x + c, v);
    }
    for (int c = Vv + tid; c < V; c += blockDim.x) {
        float g = a * expf(to_f(x[c]) - l);
        x[c] = from_f<T>(c == t ? g - ce_scale : g);
    }
}

void cuda_cross_entropy_rows(Backend *be, Buf logits, int ld, float *ce, float *lse, const int32_t *targets, int R,
                             int V, float ce_scale, float z_scale, bool grad) {
    if (R <= 0 || V <= 0) return;
    if (ld < V) {
        char detail[96];
        snprintf(detail, sizeof detail, "row stride %d is less than the row length %d", ld, V);
        cuda_record_failure(be, "cuda_cross_entropy_rows", detail, __FILE__, __LINE__);
        return;
    }
    cudaStream_t st = cuda_state(be)->stream;
    // Vector loads need aligned rows (the row stride), not a row length of whole vectors: the
    // last V % PW_VEC columns are read one by one.
    const bool vec = pw_vec_ok({logits.p}, {ld});
    with_num_type(logits.t, [&](auto tl) {
        using T = decltype(tl);
        if (vec)
            cross_entropy_kernel<T, PW_VEC><<<R, CE_THREADS, 0, st>>>((T *)logits.p, ld, ce, lse, targets, V,
                                                                      ce_scale, z_scale, grad);
        else
            cross_entropy_kernel<T, 1><<<R, CE_THREADS, 0, st>>>((T *)logits.p, ld, ce, lse, targets, V, ce_scale,
                                                                 z_scale, grad);
    });
    CUDA_LAUNCHED(be);
}
