// Causal GQA attention on the GPU: flash-attention-style kernels of our own.
//
// cuDNN first, these kernels as the fallback and the oracle: cuda_attention_forward/backward
// (bottom of this file) hand bf16/f16 training shapes (Tq == Tk, hd 64/128) to cuDNN's fused
// flash attention (cudnn_attention.cu, loaded at run time; deterministic backward) when it
// is there and takes the shape; everything else, and every shape cuDNN declines, runs the
// kernels below. SPES_ATTENTION=ours (or cuda_attention_use_cudnn(false)) runs ours only.
// Why keep our own: a page we can read, test and keep deterministic by construction; the
// tests check cuDNN against both the cpu reference and these kernels.
//
// Contract (src/ops/backend.h): q[B,Tq,nh,hd], k,v[B,Tk,nkv,hd], Tq <= Tk, query i at
// position Tk-Tq+i sees keys 0..Tk-Tq+i; query head h reads kv head h/(nh/nkv).
// out[B,Tq,nh,hd], lse[B,nh,Tq] = logsumexp of the scaled scores (natural log). Nothing of
// size T x T is ever stored: scores live in registers/shared memory one tile at a time.
//
// Two implementations:
//
//  - Tensor-core kernels (fa_*), bf16/fp16 buffers (all of one type), hd 64 or 128,
//    16-byte aligned buffers, Tq >= 16. A block of 4 warps owns a tile of 64 rows; each warp
//    owns 16 of them. Matrix products run on tensor cores through WMMA (nvcuda::wmma,
//    16x16x16 bf16/fp16 fragments, fp32 accumulators); score tiles go through shared memory
//    (fp32) where the softmax reads them row-wise in a known layout (two lanes per row).
//      forward:  block = 64 queries of one (b, h). Q tile in shared memory (and in A
//                fragments), key/value tiles of 64 streamed through shared memory; online
//                softmax (running max m and sum l per row, in log2 units, exp2f), the
//                output accumulator o in registers (a lane holds half a row, fp32).
//      backward (FlashAttention-2): P is recomputed from lse, D_i = rowsum(dO_i * O_i) is
//                computed where needed (no scratch buffer). Two kernels:
//        dK/dV:  block = 64 keys of one (b, kv head). It loops over the query heads of its
//                GQA group, then over the query tiles at or after its keys, in that fixed
//                order, accumulating dV += P^T dO and dK += dS^T Q in fp32 fragments.
//        dQ:     block = 64 queries of one (b, h); loops over key tiles 0.. in order,
//                dQ += dS K.
//    Every output element is written by exactly one block, summed in a fixed order, no
//    atomics: the same inputs give the same bits.
//    P and dS are rounded to the buffer type before their products (as FlashAttention
//    does); row sums (l) and dS use the unrounded fp32 values.
//
//  - SIMT kernels (attn_*_simt): any NumType per buffer (fp32 mode, mixed types), any head
//    dim that is a multiple of 8 up to 256, short query blocks (KV-cache decode). One warp
//    per row (query row for forward and dQ, key row for dK/dV); lanes take 32 keys
//    (queries) at a time for the dot products, then the hd dimensions for the weighted sums.
//    Plain fp32 arithmetic with expf/logf like the cpu kernel: the fp32 mode's reference
//    quality path, and what the tests compare the tensor-core kernels against too
//    (cuda_attention_force_simt).
//
// Other head dims record a failure naming the head dim.
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_attention.h"
#include "ops/cuda/cudnn_attention.h"

using namespace nvcuda;

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// ---- type helpers ------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }

// Butterfly reductions: every lane ends with the same bits (each step adds the same two
// values, a + b == b + a), so the result does not depend on which lane reads it.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
    return x;
}

// =========================================================================================
// SIMT kernels (any type, any hd <= 256 that is a multiple of 8)
// =========================================================================================
constexpr int SIMT_WARPS = 4;             // warps per block, one row each
constexpr int SIMT_MAX_HD = 256;
constexpr int SIMT_PER_LANE = SIMT_MAX_HD / 32;   // dims c = lane + 32*r, r < 8

// sum_c a[c] * x[off + c], a in shared memory (fp32), c in order.
__device__ __forceinline__ float dot_sx(const float *a, Buf x, size_t off, int hd) {
    float acc = 0.0f;
    for (int c = 0; c < hd; c++) acc += a[c] * load_num(x.p, x.t, off + c);
    return acc;
}
// sum_c x[xo + c] * y[yo + c], c in order (D_i = rowsum(dO_i * O_i)).
__device__ __forceinline__ float dot_xx(Buf x, size_t xo, Buf y, size_t yo, int hd) {
    float acc = 0.0f;
    for (int c = 0; c < hd; c++) acc += load_num(x.p, x.t, xo + c) * load_num(y.p, y.t, yo + c);
    return acc;
}

// One warp per (b, query i, head h).
__global__ void __launch_bounds__(SIMT_WARPS * 32)
attn_forward_simt(Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk, int nh, int nkv, int hd,
                  float scale) {
    __shared__ float qs_all[SIMT_WARPS][SIMT_MAX_HD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * SIMT_WARPS + warp;
    if (row >= (size_t)B * Tq * nh) return;            // whole warp; no block barrier below
    const int h = (int)(row % nh), i = (int)((row / nh) % Tq), b = (int)(row / ((size_t)nh * Tq));
    const int g = h / (nh / nkv), visible = Tk - Tq + i + 1;
    const size_t qoff = row * hd;                      // ((b*Tq + i)*nh + h)*hd
    const size_t kvrow0 = ((size_t)b * Tk * nkv + g) * hd, kvstride = (size_t)nkv * hd;
    float *qs = qs_all[warp];
    for (int c = lane; c < hd; c += 32) qs[c] = load_num(q.p, q.t, qoff + c);
    __syncwarp();

    float m = -INFINITY, l = 0.0f, acc[SIMT_PER_LANE];
#pragma unroll
    for (int r = 0; r < SIMT_PER_LANE; r++) acc[r] = 0.0f;
    for (int j0 = 0; j0 < visible; j0 += 32) {
        const int j = j0 + lane;
        float s = -INFINITY;
        if (j < visible) s = dot_sx(qs, k, kvrow0 + (size_t)j * kvstride, hd) * scale;
        // m_new is finite: key 0 (lane 0 of the first chunk) is visible to every query
        const float m_new = fmaxf(m, warp_max(s));
        const float p = j < visible ? expf(s - m_new) : 0.0f, corr = expf(m - m_new);
        l = l * corr + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int r = 0; r < SIMT_PER_LANE; r++) acc[r] *= corr;
        const int n = min(32, visible - j0);
        for (int jj = 0; jj < n; jj++) {
            const float pj = __shfl_sync(kFull, p, jj);
            const size_t vo = kvrow0 + (size_t)(j0 + jj) * kvstride;
#pragma unroll
            for (int r = 0; r < SIMT_PER_LANE; r++) {
                const int c = lane + 32 * r;
                if (c < hd) acc[r] += pj * load_num(v.p, v.t, vo + c);
            }
        }
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int r = 0; r < SIMT_PER_LANE; r++) {
        const int c = lane + 32 * r;
        if (c < hd) store_num(out.p, out.t, qoff + c, acc[r] * inv);
    }
    if (lane == 0) lse[((size_t)b * nh + h) * Tq + i] = m + logf(l);
}

// One warp per (b, key j, kv head g): dK_j, dV_j summed over the query heads of the group,
// then over the queries i >= j, in order.
__global__ void __launch_bounds__(SIMT_WARPS * 32)
attn_backward_dkdv_simt(Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q, Buf k, Buf v, int B, int T,
                        int nh, int nkv, int hd, float scale) {
    __shared__ float ks_all[SIMT_WARPS][SIMT_MAX_HD], vs_all[SIMT_WARPS][SIMT_MAX_HD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * SIMT_WARPS + warp;
    if (row >= (size_t)B * T * nkv) return;
    const int g = (int)(row % nkv), j = (int)((row / nkv) % T), b = (int)(row / ((size_t)nkv * T));
    const int group = nh / nkv;
    const size_t kvoff = row * hd, qstride = (size_t)nh * hd;
    float *ks = ks_all[warp], *vs = vs_all[warp];
    for (int c = lane; c < hd; c += 32) {
        ks[c] = load_num(k.p, k.t, kvoff + c);
        vs[c] = load_num(v.p, v.t, kvoff + c);
    }
    __syncwarp();

    float dk_acc[SIMT_PER_LANE], dv_acc[SIMT_PER_LANE];
#pragma unroll
    for (int r = 0; r < SIMT_PER_LANE; r++) dk_acc[r] = dv_acc[r] = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) {
        const size_t qrow0 = ((size_t)b * T * nh + h) * hd;   // q/out/dout row of query 0, head h
        const float *lse_h = lse + ((size_t)b * nh + h) * T;
        for (int i0 = j; i0 < T; i0 += 32) {
            const int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i < T) {
                const size_t qo = qrow0 + (size_t)i * qstride;
                const float s = dot_sx(ks, q, qo, hd) * scale;
                const float dp = dot_sx(vs, dout, qo, hd);
                const float D = dot_xx(dout, qo, out, qo, hd);
                p = expf(s - lse_h[i]);
                ds = p * (dp - D) * scale;
            }
            const int n = min(32, T - i0);
            for (int ii = 0; ii < n; ii++) {
                const float pi = __shfl_sync(kFull, p, ii), dsi = __shfl_sync(kFull, ds, ii);
                const size_t qo = qrow0 + (size_t)(i0 + ii) * qstride;
#pragma unroll
                for (int r = 0; r < SIMT_PER_LANE; r++) {
                    const int c = lane + 32 * r;
                    if (c < hd) {
                        dv_acc[r] += pi * load_num(dout.p, dout.t, qo + c);
                        dk_acc[r] += dsi * load_num(q.p, q.t, qo + c);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < SIMT_PER_LANE; r++) {
        const int c = lane + 32 * r;
        if (c < hd) {
            store_num(dk.p, dk.t, kvoff + c, dk_acc[r]);
            store_num(dv.p, dv.t, kvoff + c, dv_acc[r]);
        }
    }
}

// One warp per (b, query i, head h): dQ_i summed over keys j <= i in order.
__global__ void __launch_bounds__(SIMT_WARPS * 32)
attn_backward_dq_simt(Buf dq, Buf dout, Buf out, const float *lse, Buf q, Buf k, Buf v, int B, int T, int nh,
                      int nkv, int hd, float scale) {
    __shared__ float qs_all[SIMT_WARPS][SIMT_MAX_HD], dos_all[SIMT_WARPS][SIMT_MAX_HD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * SIMT_WARPS + warp;
    if (row >= (size_t)B * T * nh) return;
    const int h = (int)(row % nh), i = (int)((row / nh) % T), b = (int)(row / ((size_t)nh * T));
    const int g = h / (nh / nkv);
    const size_t qo = row * hd, kvrow0 = ((size_t)b * T * nkv + g) * hd, kvstride = (size_t)nkv * hd;
    float *qs = qs_all[warp], *dos = dos_all[warp];
    for (int c = lane; c < hd; c += 32) {
        qs[c] = load_num(q.p, q.t, qo + c);
        dos[c] = load_num(dout.p, dout.t, qo + c);
    }
    __syncwarp();
    const float D = dot_xx(dout, qo, out, qo, hd);     // same order as the dK/dV kernel
    const float lse_i = lse[((size_t)b * nh + h) * T + i];

    float acc[SIMT_PER_LANE];
#pragma unroll
    for (int r = 0; r < SIMT_PER_LANE; r++) acc[r] = 0.0f;
    for (int j0 = 0; j0 <= i; j0 += 32) {
        const int j = j0 + lane;
        float ds = 0.0f;
        if (j <= i) {
            const size_t ko = kvrow0 + (size_t)j * kvstride;
            const float s = dot_sx(qs, k, ko, hd) * scale;
            const float dp = dot_sx(dos, v, ko, hd);
            ds = expf(s - lse_i) * (dp - D) * scale;
        }
        const int n = min(32, i + 1 - j0);
        for (int jj = 0; jj < n; jj++) {
            const float dsj = __shfl_sync(kFull, ds, jj);
            const size_t ko = kvrow0 + (size_t)(j0 + jj) * kvstride;
#pragma unroll
            for (int r = 0; r < SIMT_PER_LANE; r++) {
                const int c = lane + 32 * r;
                if (c < hd) acc[r] += dsj * load_num(k.p, k.t, ko + c);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < SIMT_PER_LANE; r++) {
        const int c = lane + 32 * r;
        if (c < hd) store_num(dq.p, dq.t, qo + c, acc[r]);
    }
}

// =========================================================================================
// Tensor-core kernels (bf16 / fp16, hd 64 or 128)
// =========================================================================================
constexpr int FA_WARPS = 4, FA_THREADS = FA_WARPS * 32;
constexpr int FA_BQ = 64;                 // query rows per block (16 per warp)
constexpr int FA_BK = 64;                 // key rows per tile
constexpr int FA_MIN_TQ = 16;             // shorter query blocks (decode) take the SIMT path

__host__ __device__ constexpr size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

// Shared-memory layout, in bytes, for head dim HD. Row strides are padded (+8 halves, +4
// floats) against bank conflicts; WMMA needs 32-byte aligned fragment pointers, which every
// offset below keeps (16-row blocks, 16-column steps, 128-byte aligned arrays).
template <int HD> struct FaLayout {
    static constexpr int LDT = HD + 8;              // 16-bit tiles [rows][HD]
    static constexpr int LDS = FA_BK + 4;           // fp32 score tile per warp [16][64]
    static constexpr int LDO = HD + 4;              // fp32 staging per warp [16][HD]
    static constexpr int LDP = FA_BK + 8;           // 16-bit P / dS tile per warp [16][64]
    static constexpr size_t tile = align128((size_t)64 * LDT * 2);          // one [64][HD] 16-bit tile
    static constexpr size_t scores = align128((size_t)FA_WARPS * 16 * LDS * 4);
    static constexpr size_t ostage = align128((size_t)FA_WARPS * 16 * LDO * 4);
    static constexpr size_t ptile = align128((size_t)FA_WARPS * 16 * LDP * 2);
    static constexpr size_t stats = align128((size_t)2 * 64 * 4);           // lse, D of 64 rows
    // forward: Q, K, V tiles | per-warp fp32 [16][max(64, HD)] (scores, then P V) | P
    static constexpr size_t fwd_scores = (ostage > scores ? ostage : scores);
    static constexpr size_t fwd_bytes = 3 * tile + fwd_scores + ptile;
    // backward kernels: four 16-bit tiles | stats | per-warp scores | P/dS. The final fp32
    // accumulators are staged over two of the tiles (after a block barrier).
    static constexpr size_t bwd_bytes = 4 * tile + stats + scores + ptile;
    static_assert(ostage <= 2 * tile, "accumulator staging must fit in two tiles");
};

// dst[row][0:HD] (stride LDT) = src rows r0 .. r0+ROWS-1 (row stride `stride` elements),
// zero for rows >= rend. 16-byte vectors: HD % 8 == 0 and src 16-byte aligned (checked on
// the host). All threads of the block take part.
template <typename T, int HD, int ROWS>
__device__ __forceinline__ void fa_load_rows(T *dst, const T *src, size_t stride, int r0, int rend) {
    constexpr int VPR = HD / 8, LDT = FaLayout<HD>::LDT;
    for (int idx = threadIdx.x; idx < ROWS * VPR; idx += FA_THREADS) {
        const int rr = idx / VPR, cv = idx % VPR;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + rr < rend) val = *reinterpret_cast<const uint4 *>(src + (size_t)(r0 + rr) * stride + cv * 8);
        *reinterpret_cast<uint4 *>(dst + rr * LDT + cv * 8) = val;
    }
}

// lse (in log2 units) and D = rowsum(dO * O) of rows i0 .. i0+63 of one head, zero for rows
// >= T. Two threads per row, each half of the head dim in order, then summed (a fixed order:
// the dK/dV and dQ kernels get the same bits).
template <typename T, int HD>
__device__ __forceinline__ void fa_load_stats(float *lse_s, float *D_s, const T *dout0, const T *out0, size_t stride,
                                              const float *lse_h, int i0, int T_) {
    const int rr = threadIdx.x >> 1, half = threadIdx.x & 1, i = i0 + rr;
    float d = 0.0f;
    if (i < T_) {
        const T *a = dout0 + (size_t)i * stride + half * (HD / 2), *o = out0 + (size_t)i * stride + half * (HD / 2);
#pragma unroll 8
        for (int c = 0; c < HD / 2; c++) d += to_f32(a[c]) * to_f32(o[c]);
    }
    d += __shfl_xor_sync(kFull, d, 1);
    if (half == 0) {
        D_s[rr] = d;
        lse_s[rr] = i < T_ ? lse_h[i] * kLog2e : 0.0f;
    }
}

// Writes a warp's 16 staged fp32 rows (stride ld) to global rows r0 .. (< rend).
template <typename T, int HD>
__device__ __forceinline__ void fa_store_rows(T *dst0, size_t stride, const float *stage, int ld, int r0, int rend,
                                              int lane) {
    for (int rr = 0; rr < 16 && r0 + rr < rend; rr++)
        for (int c = lane; c < HD; c += 32) dst0[(size_t)(r0 + rr) * stride + c] = from_f32<T>(stage[rr * ld + c]);
}

// C[16][16*NF] (row-major fp32, ld ldc) = A[16][16*KF] (row-major, lda) @ B, B being
// [16*KF][16*NF] stored row-major (B_COL = false: B[k][n] at b[k*ldb + n]) or as its
// transpose (B_COL = true: B[k][n] at b[n*ldb + k]). One warp.
template <typename T, int KF, int NF, bool B_COL>
__device__ __forceinline__ void warp_gemm_store(float *c, int ldc, const T *a, int lda, const T *bm, int ldb) {
    using BLayout = typename std::conditional<B_COL, wmma::col_major, wmma::row_major>::type;
#pragma unroll
    for (int n = 0; n < NF; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < KF; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> fb;
            wmma::load_matrix_sync(fa, a + kk * 16, lda);
            wmma::load_matrix_sync(fb, B_COL ? bm + n * 16 * ldb + kk * 16 : bm + kk * 16 * ldb + n * 16, ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
    }
}

// acc[n] += A[16][16*KF] (row-major, lda) @ B[16*KF][16*NF] (row-major, ldb). One warp.
template <typename T, int KF, int NF>
__device__ __forceinline__ void warp_gemm_acc(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[NF],
                                              const T *a, int lda, const T *bm, int ldb) {
#pragma unroll
    for (int kk = 0; kk < KF; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
        for (int n = 0; n < NF; n++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
            wmma::load_matrix_sync(fb, bm + kk * 16 * ldb + n * 16, ldb);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// ---- forward ----------------------------------------------------------------------------
// grid (ceil(Tq/64), nh, B); the longest query tiles (most keys) are launched first.
template <typename T, int HD>
__global__ void __launch_bounds__(FA_THREADS)
fa_forward(T *out, float *lse, const T *q, const T *k, const T *v, int Tq, int Tk, int nh, int nkv,
           float scale_log2) {
    using L = FaLayout<HD>;
    extern __shared__ __align__(128) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem);
    T *Ks = reinterpret_cast<T *>(smem + L::tile);
    T *Vs = reinterpret_cast<T *>(smem + 2 * L::tile);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *Sw = reinterpret_cast<float *>(smem + 3 * L::tile) + warp * 16 * L::LDO;      // [16][LDO]
    T *Pw = reinterpret_cast<T *>(smem + 3 * L::tile + L::fwd_scores) + warp * 16 * L::LDP;

    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv), q0 = qt * FA_BQ, past = Tk - Tq;
    const size_t qstride = (size_t)nh * HD, kstride = (size_t)nkv * HD;
    const T *qb = q + (size_t)b * Tq * qstride + (size_t)h * HD;      // + i*qstride: query i
    const T *kb = k + (size_t)b * Tk * kstride + (size_t)g * HD;      // + j*kstride: key j
    const T *vb = v + (size_t)b * Tk * kstride + (size_t)g * HD;

    fa_load_rows<T, HD, FA_BQ>(Qs, qb, qstride, q0, Tq);
    __syncthreads();
    const T *Qw = Qs + warp * 16 * L::LDT;

    // This lane's softmax row (two lanes per row, interleaved columns c = 2t + half).
    const int r = lane >> 1, half = lane & 1;
    const int qi = q0 + warp * 16 + r;
    const int qpos = past + min(qi, Tq - 1);          // padding rows (qi >= Tq) are never stored
    const int warp_last = past + min(q0 + warp * 16 + 15, Tq - 1);
    const int kend = past + min(q0 + FA_BQ, Tq);      // keys [0, kend) are visible to the block
    float m = -INFINITY, l = 0.0f, o[HD / 2];
#pragma unroll
    for (int t = 0; t < HD / 2; t++) o[t] = 0.0f;

    for (int k0 = 0; k0 < kend; k0 += FA_BK) {
        __syncthreads();                                // the previous K/V tiles are consumed
        fa_load_rows<T, HD, FA_BK>(Ks, kb, kstride, k0, kend);
        fa_load_rows<T, HD, FA_BK>(Vs, vb, kstride, k0, kend);
        __syncthreads();
        if (k0 > warp_last) continue;                   // every key here is after this warp's queries

        // S = Q_w K^T  [16][64] fp32
        warp_gemm_store<T, HD / 16, FA_BK / 16, true>(Sw, L::LDO, Qw, L::LDT, Ks, L::LDT);
        __syncwarp();
        // online softmax of this row's 32 columns (log2 units); m_new is finite: key 0 is in
        // the first tile, visible to every row, and every warp processes the first tile
        float s[FA_BK / 2], mx = -INFINITY;
#pragma unroll
        for (int t = 0; t < FA_BK / 2; t++) {
            const int c = 2 * t + half;
            s[t] = k0 + c <= qpos ? Sw[r * L::LDO + c] * scale_log2 : -INFINITY;
            mx = fmaxf(mx, s[t]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
        const float m_new = fmaxf(m, mx), corr = exp2f(m - m_new);
        float psum = 0.0f;
#pragma unroll
        for (int t = 0; t < FA_BK / 2; t++) {
            const float p = exp2f(s[t] - m_new);        // masked: exp2(-inf) = 0
            psum += p;
            Pw[r * L::LDP + 2 * t + half] = from_f32<T>(p);
        }
        psum += __shfl_xor_sync(kFull, psum, 1);
        l = l * corr + psum;
        m = m_new;
        __syncwarp();
        // P V  [16][HD] fp32 (over the scores, already read)
        warp_gemm_store<T, FA_BK / 16, HD / 16, false>(Sw, L::LDO, Pw, L::LDP, Vs, L::LDT);
        __syncwarp();
#pragma unroll
        for (int t = 0; t < HD / 2; t++) o[t] = o[t] * corr + Sw[r * L::LDO + 2 * t + half];
        __syncwarp();
    }

    // out = o / l, staged through Sw for coalesced row writes
    const float inv = 1.0f / l;
#pragma unroll
    for (int t = 0; t < HD / 2; t++) Sw[r * L::LDO + 2 * t + half] = o[t] * inv;
    if (half == 0 && qi < Tq) lse[((size_t)b * nh + h) * Tq + qi] = (m + log2f(l)) * kLn2;
    __syncwarp();
    T *ob = out + (size_t)b * Tq * qstride + (size_t)h * HD;
    fa_store_rows<T, HD>(ob, qstride, Sw, L::LDO, q0 + warp * 16, Tq, lane);
}

// ---- backward: dK, dV -------------------------------------------------------------------
// grid (ceil(T/64), nkv, B); block kt owns keys kt*64 .. +63 of kv head g. Warp w owns keys
// k0 + 16w .. +15 and works on transposed tiles: S^T = K_w Q^T [16 keys][64 queries].
template <typename T, int HD>
__global__ void __launch_bounds__(FA_THREADS)
fa_backward_dkdv(T *dk, T *dv, const T *dout, const T *out, const float *lse, const T *q, const T *k, const T *v,
                 int T_, int nh, int nkv, float scale, float scale_log2) {
    using L = FaLayout<HD>;
    extern __shared__ __align__(128) unsigned char smem[];
    T *Ks = reinterpret_cast<T *>(smem);
    T *Vs = reinterpret_cast<T *>(smem + L::tile);
    T *Qs = reinterpret_cast<T *>(smem + 2 * L::tile);
    T *dOs = reinterpret_cast<T *>(smem + 3 * L::tile);
    float *lse_s = reinterpret_cast<float *>(smem + 4 * L::tile), *D_s = lse_s + 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *Sw = reinterpret_cast<float *>(smem + 4 * L::tile + L::stats) + warp * 16 * L::LDS;
    T *Pw = reinterpret_cast<T *>(smem + 4 * L::tile + L::stats + L::scores) + warp * 16 * L::LDP;

    const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, group = nh / nkv;
    const int k0 = kt * FA_BK;
    const size_t qstride = (size_t)nh * HD, kstride = (size_t)nkv * HD;
    const T *kb = k + (size_t)b * T_ * kstride + (size_t)g * HD;
    const T *vb = v + (size_t)b * T_ * kstride + (size_t)g * HD;
    fa_load_rows<T, HD, FA_BK>(Ks, kb, kstride, k0, T_);
    fa_load_rows<T, HD, FA_BK>(Vs, vb, kstride, k0, T_);
    const T *Kw = Ks + warp * 16 * L::LDT, *Vw = Vs + warp * 16 * L::LDT;

    const int r = lane >> 1, half = lane & 1;
    const int j = k0 + warp * 16 + r;                   // this lane's key row
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dKf[HD / 16], dVf[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dKf[n], 0.0f), wmma::fill_fragment(dVf[n], 0.0f);

    for (int h = g * group; h < (g + 1) * group; h++) {
        const size_t hoff = (size_t)b * T_ * qstride + (size_t)h * HD;
        const float *lse_h = lse + ((size_t)b * nh + h) * T_;
        for (int i0 = k0; i0 < T_; i0 += FA_BQ) {       // query tiles at or after the keys (FA_BQ == FA_BK)
            __syncthreads();                            // previous Q/dO tiles consumed (and K/V loaded)
            fa_load_rows<T, HD, FA_BQ>(Qs, q + hoff, qstride, i0, T_);
            fa_load_rows<T, HD, FA_BQ>(dOs, dout + hoff, qstride, i0, T_);
            fa_load_stats<T, HD>(lse_s, D_s, dout + hoff, out + hoff, qstride, lse_h, i0, T_);
            __syncthreads();

            // P^T[j][i] = exp(scale*S^T - lse_i), 0 where i < j (causal) or i >= T
            warp_gemm_store<T, HD / 16, FA_BQ / 16, true>(Sw, L::LDS, Kw, L::LDT, Qs, L::LDT);
            __syncwarp();
            float p[FA_BQ / 2];
#pragma unroll
            for (int t = 0; t < FA_BQ / 2; t++) {
                const int c = 2 * t + half, i = i0 + c;
                p[t] = (i >= j && i < T_) ? exp2f(Sw[r * L::LDS + c] * scale_log2 - lse_s[c]) : 0.0f;
                Pw[r * L::LDP + c] = from_f32<T>(p[t]);
            }
            __syncwarp();
            // dV += P^T dO
            warp_gemm_acc<T, FA_BQ / 16, HD / 16>(dVf, Pw, L::LDP, dOs, L::LDT);
            // dP^T = V_w dO^T
            warp_gemm_store<T, HD / 16, FA_BQ / 16, true>(Sw, L::LDS, Vw, L::LDT, dOs, L::LDT);
            __syncwarp();                               // also: the dV product has read Pw
#pragma unroll
            for (int t = 0; t < FA_BQ / 2; t++) {
                const int c = 2 * t + half;
                Pw[r * L::LDP + c] = from_f32<T>(p[t] * (Sw[r * L::LDS + c] - D_s[c]) * scale);   // dS^T
            }
            __syncwarp();
            // dK += dS^T Q
            warp_gemm_acc<T, FA_BQ / 16, HD / 16>(dKf, Pw, L::LDP, Qs, L::LDT);
        }
    }

    // Stage the fp32 accumulators over the Q/dO tiles (every warp is done with them).
    __syncthreads();
    float *stage = reinterpret_cast<float *>(smem + 2 * L::tile) + warp * 16 * L::LDO;
    T *dkb = dk + (size_t)b * T_ * kstride + (size_t)g * HD, *dvb = dv + (size_t)b * T_ * kstride + (size_t)g * HD;
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(stage + n * 16, dVf[n], L::LDO, wmma::mem_row_major);
    __syncwarp();
    fa_store_rows<T, HD>(dvb, kstride, stage, L::LDO, k0 + warp * 16, T_, lane);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(stage + n * 16, dKf[n], L::LDO, wmma::mem_row_major);
    __syncwarp();
    fa_store_rows<T, HD>(dkb, kstride, stage, L::LDO, k0 + warp * 16, T_, lane);
}

// ---- backward: dQ -----------------------------------------------------------------------
// grid (ceil(T/64), nh, B); block owns queries q0 .. q0+63 of head h; key tiles in order.
template <typename T, int HD>
__global__ void __launch_bounds__(FA_THREADS)
fa_backward_dq(T *dq, const T *dout, const T *out, const float *lse, const T *q, const T *k, const T *v, int T_,
               int nh, int nkv, float scale, float scale_log2) {
    using L = FaLayout<HD>;
    extern __shared__ __align__(128) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem);
    T *dOs = reinterpret_cast<T *>(smem + L::tile);
    T *Ks = reinterpret_cast<T *>(smem + 2 * L::tile);
    T *Vs = reinterpret_cast<T *>(smem + 3 * L::tile);
    float *lse_s = reinterpret_cast<float *>(smem + 4 * L::tile), *D_s = lse_s + 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *Sw = reinterpret_cast<float *>(smem + 4 * L::tile + L::stats) + warp * 16 * L::LDS;
    T *dSw = reinterpret_cast<T *>(smem + 4 * L::tile + L::stats + L::scores) + warp * 16 * L::LDP;

    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (nh / nkv), q0 = qt * FA_BQ;
    const size_t qstride = (size_t)nh * HD, kstride = (size_t)nkv * HD;
    const size_t hoff = (size_t)b * T_ * qstride + (size_t)h * HD;
    const T *kb = k + (size_t)b * T_ * kstride + (size_t)g * HD;
    const T *vb = v + (size_t)b * T_ * kstride + (size_t)g * HD;
    fa_load_rows<T, HD, FA_BQ>(Qs, q + hoff, qstride, q0, T_);
    fa_load_rows<T, HD, FA_BQ>(dOs, dout + hoff, qstride, q0, T_);
    fa_load_stats<T, HD>(lse_s, D_s, dout + hoff, out + hoff, qstride, lse + ((size_t)b * nh + h) * T_, q0, T_);
    __syncthreads();
    const T *Qw = Qs + warp * 16 * L::LDT, *dOw = dOs + warp * 16 * L::LDT;

    const int r = lane >> 1, half = lane & 1;
    const int i = q0 + warp * 16 + r;                   // this lane's query row
    const float lse_i = lse_s[warp * 16 + r], D_i = D_s[warp * 16 + r];
    const int warp_last = min(q0 + warp * 16 + 15, T_ - 1);
    const int kend = min(q0 + FA_BQ, T_);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dQf[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dQf[n], 0.0f);

    for (int k0 = 0; k0 < kend; k0 += FA_BK) {
        __syncthreads();
        fa_load_rows<T, HD, FA_BK>(Ks, kb, kstride, k0, kend);
        fa_load_rows<T, HD, FA_BK>(Vs, vb, kstride, k0, kend);
        __syncthreads();
        if (k0 > warp_last) continue;

        // P = exp(scale*S - lse), 0 where j > i
        warp_gemm_store<T, HD / 16, FA_BK / 16, true>(Sw, L::LDS, Qw, L::LDT, Ks, L::LDT);
        __syncwarp();
        float p[FA_BK / 2];
#pragma unroll
        for (int t = 0; t < FA_BK / 2; t++) {
            const int c = 2 * t + half;
            p[t] = k0 + c <= i ? exp2f(Sw[r * L::LDS + c] * scale_log2 - lse_i) : 0.0f;
        }
        __syncwarp();
        // dP = dO_w V^T; dS = P * (dP - D) * scale
        warp_gemm_store<T, HD / 16, FA_BK / 16, true>(Sw, L::LDS, dOw, L::LDT, Vs, L::LDT);
        __syncwarp();
#pragma unroll
        for (int t = 0; t < FA_BK / 2; t++) {
            const int c = 2 * t + half;
            dSw[r * L::LDP + c] = from_f32<T>(p[t] * (Sw[r * L::LDS + c] - D_i) * scale);
        }
        __syncwarp();
        // dQ += dS K
        warp_gemm_acc<T, FA_BK / 16, HD / 16>(dQf, dSw, L::LDP, Ks, L::LDT);
    }

    __syncthreads();                                    // stage over the K/V tiles
    float *stage = reinterpret_cast<float *>(smem + 2 * L::tile) + warp * 16 * L::LDO;
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(stage + n * 16, dQf[n], L::LDO, wmma::mem_row_major);
    __syncwarp();
    fa_store_rows<T, HD>(dq + hoff, qstride, stage, L::LDO, q0 + warp * 16, T_, lane);
}

// =========================================================================================
// host side
// =========================================================================================
bool g_force_simt = false;

bool attn_args_ok(Backend *be, const char *what, int B, int Tq, int Tk, int nh, int nkv, int hd) {
    char detail[160];
    detail[0] = 0;
    if (B < 0 || Tq < 0 || Tk < Tq || nh <= 0 || nkv <= 0 || nh % nkv != 0)
        snprintf(detail, sizeof detail, "bad shape B=%d Tq=%d Tk=%d nh=%d nkv=%d (need Tq <= Tk, nkv | nh)", B, Tq,
                 Tk, nh, nkv);
    else if (hd < 8 || hd > SIMT_MAX_HD || hd % 8 != 0)
        snprintf(detail, sizeof detail, "head dim %d is not supported (a multiple of 8, at most %d)", hd,
                 SIMT_MAX_HD);
    if (!detail[0]) return true;
    cuda_record_failure(be, what, detail, __FILE__, __LINE__);
    return false;
}

// The tensor-core path: every buffer bf16 (or every one f16), 16-byte aligned, hd 64/128,
// and enough shared memory on this device.
bool fa_usable(Backend *be, const Buf *bufs, int nbufs, int hd, int rows, size_t smem_bytes) {
    if (g_force_simt || rows < FA_MIN_TQ || (hd != 64 && hd != 128)) return false;
    const NumType t = bufs[0].t;
    if (t != NUM_BF16 && t != NUM_F16) return false;
    for (int i = 0; i < nbufs; i++)
        if (bufs[i].t != t || !cuda_aligned16(bufs[i].p)) return false;
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cuda_state(be)->device) != cudaSuccess)
        return false;
    return smem_bytes <= (size_t)optin;
}

template <typename T, int HD>
void fa_forward_launch(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk, int nh, int nkv) {
    const size_t smem = FaLayout<HD>::fwd_bytes;
    CUDA_CHECK(be, cudaFuncSetAttribute(fa_forward<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((unsigned)((Tq + FA_BQ - 1) / FA_BQ), (unsigned)nh, (unsigned)B);
    const float scale_log2 = kLog2e / sqrtf((float)HD);
    fa_forward<T, HD><<<grid, FA_THREADS, smem, cuda_state(be)->stream>>>(
        (T *)out.p, lse, (const T *)q.p, (const T *)k.p, (const T *)v.p, Tq, Tk, nh, nkv, scale_log2);
    CUDA_LAUNCHED(be);
}

template <typename T, int HD>
void fa_backward_launch(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q, Buf k,
                        Buf v, int B, int seq, int nh, int nkv) {
    const size_t smem = FaLayout<HD>::bwd_bytes;
    const float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * kLog2e;
    const unsigned tiles = (unsigned)((seq + FA_BQ - 1) / FA_BQ);
    cudaStream_t st = cuda_state(be)->stream;
    CUDA_CHECK(be, cudaFuncSetAttribute(fa_backward_dkdv<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
    fa_backward_dkdv<T, HD><<<dim3(tiles, (unsigned)nkv, (unsigned)B), FA_THREADS, smem, st>>>(
        (T *)dk.p, (T *)dv.p, (const T *)dout.p, (const T *)out.p, lse, (const T *)q.p, (const T *)k.p,
        (const T *)v.p, seq, nh, nkv, scale, scale_log2);
    CUDA_LAUNCHED(be);
    CUDA_CHECK(be, cudaFuncSetAttribute(fa_backward_dq<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
    fa_backward_dq<T, HD><<<dim3(tiles, (unsigned)nh, (unsigned)B), FA_THREADS, smem, st>>>(
        (T *)dq.p, (const T *)dout.p, (const T *)out.p, lse, (const T *)q.p, (const T *)k.p, (const T *)v.p, seq, nh,
        nkv, scale, scale_log2);
    CUDA_LAUNCHED(be);
}

template <typename T>
void fa_forward_dispatch(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk, int nh,
                         int nkv, int hd) {
    if (hd == 64) fa_forward_launch<T, 64>(be, out, lse, q, k, v, B, Tq, Tk, nh, nkv);
    else fa_forward_launch<T, 128>(be, out, lse, q, k, v, B, Tq, Tk, nh, nkv);
}

template <typename T>
void fa_backward_dispatch(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q, Buf k,
                          Buf v, int B, int seq, int nh, int nkv, int hd) {
    if (hd == 64) fa_backward_launch<T, 64>(be, dq, dk, dv, dout, out, lse, q, k, v, B, seq, nh, nkv);
    else fa_backward_launch<T, 128>(be, dq, dk, dv, dout, out, lse, q, k, v, B, seq, nh, nkv);
}

size_t fa_smem(int hd, bool backward) {
    if (hd == 64) return backward ? FaLayout<64>::bwd_bytes : FaLayout<64>::fwd_bytes;
    return backward ? FaLayout<128>::bwd_bytes : FaLayout<128>::fwd_bytes;
}

int g_use_cudnn = -1;   // -1: not yet read from SPES_ATTENTION
const char *g_last_impl[2];

bool use_cudnn() {
    if (g_use_cudnn < 0) {
        const char *e = getenv("SPES_ATTENTION");
        g_use_cudnn = !(e && strcmp(e, "ours") == 0);
    }
    return g_use_cudnn == 1;
}

} // namespace

extern "C" void cuda_attention_force_simt(bool on) { g_force_simt = on; }
extern "C" void cuda_attention_use_cudnn(bool on) { g_use_cudnn = on ? 1 : 0; }
extern "C" bool cuda_attention_using_cudnn(void) { return use_cudnn(); }
extern "C" const char *cuda_attention_last_impl(bool backward) { return g_last_impl[backward ? 1 : 0]; }

extern "C" void cuda_attention_forward(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk,
                                       int nh, int nkv, int hd) {
    if (!attn_args_ok(be, "attention forward", B, Tq, Tk, nh, nkv, hd) || B == 0 || Tq == 0) return;
    // cuDNN first (training shapes: Tq == Tk; the KV-cache forward stays on our kernel).
    if (Tq != Tk || g_force_simt || !use_cudnn())
        cuda_cudnn_attention_not_offered(false, Tq != Tk ? "the KV-cache forward (Tq < Tk) runs ours"
                                                : g_force_simt ? "SIMT kernels forced" : "SPES_ATTENTION=ours");
    else if (cuda_cudnn_attention_forward(be, out, lse, q, k, v, B, Tq, nh, nkv, hd)) {
        g_last_impl[0] = "cudnn";
        return;
    }
    Buf bufs[4] = {out, q, k, v};
    if (fa_usable(be, bufs, 4, hd, Tq, fa_smem(hd, false))) {
        g_last_impl[0] = "tensor-core";
        if (q.t == NUM_BF16) fa_forward_dispatch<__nv_bfloat16>(be, out, lse, q, k, v, B, Tq, Tk, nh, nkv, hd);
        else fa_forward_dispatch<__half>(be, out, lse, q, k, v, B, Tq, Tk, nh, nkv, hd);
        return;
    }
    g_last_impl[0] = "simt";
    const size_t rows = (size_t)B * Tq * nh;
    attn_forward_simt<<<cuda_blocks(rows, SIMT_WARPS), SIMT_WARPS * 32, 0, cuda_state(be)->stream>>>(
        out, lse, q, k, v, B, Tq, Tk, nh, nkv, hd, 1.0f / sqrtf((float)hd));
    CUDA_LAUNCHED(be);
}

extern "C" void cuda_attention_backward(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse,
                                        Buf q, Buf k, Buf v, int B, int T, int nh, int nkv, int hd) {
    if (!attn_args_ok(be, "attention backward", B, T, T, nh, nkv, hd) || B == 0 || T == 0) return;
    if (g_force_simt || !use_cudnn())
        cuda_cudnn_attention_not_offered(true, g_force_simt ? "SIMT kernels forced" : "SPES_ATTENTION=ours");
    else if (cuda_cudnn_attention_backward(be, dq, dk, dv, dout, out, lse, q, k, v, B, T, nh, nkv, hd)) {
        g_last_impl[1] = "cudnn";
        return;
    }
    Buf bufs[8] = {dq, dk, dv, dout, out, q, k, v};
    if (fa_usable(be, bufs, 8, hd, T, fa_smem(hd, true))) {
        g_last_impl[1] = "tensor-core";
        if (q.t == NUM_BF16)
            fa_backward_dispatch<__nv_bfloat16>(be, dq, dk, dv, dout, out, lse, q, k, v, B, T, nh, nkv, hd);
        else fa_backward_dispatch<__half>(be, dq, dk, dv, dout, out, lse, q, k, v, B, T, nh, nkv, hd);
        return;
    }
    g_last_impl[1] = "simt";
    const float scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = cuda_state(be)->stream;
    attn_backward_dkdv_simt<<<cuda_blocks((size_t)B * T * nkv, SIMT_WARPS), SIMT_WARPS * 32, 0, st>>>(
        dk, dv, dout, out, lse, q, k, v, B, T, nh, nkv, hd, scale);
    CUDA_LAUNCHED(be);
    attn_backward_dq_simt<<<cuda_blocks((size_t)B * T * nh, SIMT_WARPS), SIMT_WARPS * 32, 0, st>>>(
        dq, dout, out, lse, q, k, v, B, T, nh, nkv, hd, scale);
    CUDA_LAUNCHED(be);
}
