// RMSNorm forward and backward (eps inside the rsqrt, fp32 statistics). The cpu kernels:
// src/ops/cpu/rmsnorm.c (same formulas, same operation order inside a row).
//
// One warp per row: lane l owns the W-element groups c = l*W, l*W + 32*W, ... of its row, in
// both passes over the row, so a row's reads and writes of one element are by one thread
// (dx may alias dy). Row sums: each lane sums its elements in order, then a fixed butterfly.
//
// dw (backward) without atomics, in a fixed order that depends only on R and C:
//   1. rows are split into blocks of `rpb` consecutive rows; inside a block, warp w takes rows
//      w, w + NW, w + 2*NW, ... and sums dy*x*rstd of its rows into its own shared-memory row;
//      the block then adds its NW warp rows in warp order into partial[block, :] (scratch);
//   2. a column kernel adds partial[0..nblocks) in block order (in 8 fixed segments summed in
//      order) and adds the total to dw.
// A warp's shared row keeps column c at dw_slot(c), a permutation inside each aligned group of
// 8 columns, so that both the lanes' W-element groups (step 1) and 32 consecutive columns (the
// block's sum) fall in 32 different banks; the sums and their order are the same.
#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

#define RMS_WARPS 8    // rows in flight per block (forward, and backward without dw)

// ---- forward --------------------------------------------------------------------------------
template <typename Ty, typename Tx, int W>
__global__ void rmsnorm_forward_kernel(Ty *y, float *rstd, const Tx *x, const float *w, int R, int C, float eps) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= R) return;                                  // whole warps leave together
    const Tx *xr = x + (size_t)r * C;
    Ty *yr = y + (size_t)r * C;
    float ss = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        float v[W];
        load_vec<W>(xr + c, v);
#pragma unroll
        for (int j = 0; j < W; j++) ss += v[j] * v[j];
    }
    ss = warp_sum(ss);
    const float s = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[r] = s;
    for (int c = lane * W; c < C; c += 32 * W) {
        float v[W], g[W];
        load_vec<W>(xr + c, v);
        load_vec<W>(w + c, g);
#pragma unroll
        for (int j = 0; j < W; j++) v[j] = v[j] * s * g[j];
        store_vec<W>(yr + c, v);
    }
}

void cuda_rmsnorm_forward(Backend *be, Buf y, float *rstd, Buf x, const float *w, int R, int C, float eps) {
    if (R <= 0 || C <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({y.p, x.p, w}, {C});
    const unsigned grid = cuda_blocks((size_t)R, RMS_WARPS);
    with_num_type(y.t, [&](auto ty) {
        using Ty = decltype(ty);
        with_num_type(x.t, [&](auto tx) {
            using Tx = decltype(tx);
            if (vec)
                rmsnorm_forward_kernel<Ty, Tx, PW_VEC><<<grid, RMS_WARPS * 32, 0, st>>>((Ty *)y.p, rstd,
                                                                                        (const Tx *)x.p, w, R, C, eps);
            else
                rmsnorm_forward_kernel<Ty, Tx, 1><<<grid, RMS_WARPS * 32, 0, st>>>((Ty *)y.p, rstd, (const Tx *)x.p,
                                                                                   w, R, C, eps);
        });
    });
    CUDA_LAUNCHED(be);
}

// ---- backward -------------------------------------------------------------------------------
// Shared-memory slot of column c: its low 3 bits XOR bits 5..7. Lane l's element j of a
// W = 8 group (c = 256k + 8l + j) lands in bank 8(l % 4) + (j ^ l / 4): 32 banks for 32 lanes;
// 32 consecutive columns keep their 32 banks. A warp's row holds round_up(C, 8) slots.
__device__ __forceinline__ int dw_slot(int c) { return c ^ ((c >> 5) & 7); }
__host__ __device__ static inline int dw_row_len(int C) { return (C + 7) / 8 * 8; }

// dx = rstd*dy*w - x * (rstd^3/C * sum(dy*w*x)), as the cpu's rmsnorm_backward_row.
// Block b handles rows [b*rpb, min((b+1)*rpb, R)). With dw_partial != NULL, dynamic shared
// memory holds NW rows of dw_row_len(C) floats (one per warp) and partial[b, :] is written.
template <typename Tdx, typename Tdy, typename Tx, int W>
__global__ void rmsnorm_backward_kernel(Tdx *dx, float *dw_partial, const Tdy *dy, const Tx *x, const float *w,
                                        const float *rstd, int R, int C, int rpb, bool accumulate) {
    extern __shared__ float warp_dw[];                   // [NW][Cs] when dw_partial, column c at dw_slot(c)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5, Cs = dw_row_len(C);
    const int r0 = blockIdx.x * rpb, r1 = min(r0 + rpb, R);
    float *mine = dw_partial ? warp_dw + (size_t)warp * Cs : nullptr;
    if (mine)
        for (int c = lane; c < Cs; c += 32) mine[c] = 0.0f;   // __syncwarp below orders it before use
    __syncwarp();
    for (int r = r0 + warp; r < r1; r += NW) {
        const Tdy *dyr = dy + (size_t)r * C;
        const Tx *xr = x + (size_t)r * C;
        Tdx *dxr = dx + (size_t)r * C;
        const float s = rstd[r];
        float dot = 0.0f;
        for (int c = lane * W; c < C; c += 32 * W) {
            float a[W], b[W], g[W];
            load_vec<W>(dyr + c, a);
            load_vec<W>(w + c, g);
            load_vec<W>(xr + c, b);
#pragma unroll
            for (int j = 0; j < W; j++) dot += a[j] * g[j] * b[j];
        }
        dot = warp_sum(dot);
        const float k = s * s * s * dot / (float)C;
        for (int c = lane * W; c < C; c += 32 * W) {
            float a[W], b[W], g[W], o[W];
            load_vec<W>(dyr + c, a);                     // before the dx store: dx may alias dy
            load_vec<W>(w + c, g);
            load_vec<W>(xr + c, b);
            if (mine)
#pragma unroll
                for (int j = 0; j < W; j++) mine[dw_slot(c + j)] += a[j] * b[j] * s;   // lane-private columns
            if (accumulate) load_vec<W>(dxr + c, o);
#pragma unroll
            for (int j = 0; j < W; j++) {
                float v = s * a[j] * g[j] - b[j] * k;
                o[j] = accumulate ? o[j] + v : v;
            }
            store_vec<W>(dxr + c, o);
        }
    }
    if (!dw_partial) return;
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int slot = dw_slot(c);
        float t = warp_dw[slot];
        for (int v = 1; v < NW; v++) t += warp_dw[(size_t)v * Cs + slot];
        dw_partial[(size_t)blockIdx.x * C + c] = t;
    }
}

// dw[c] += sum_b partial[b, c], b = 0..nb-1: thread (tx, ty) sums segment ty of the blocks in
// order, then ty = 0 adds the 8 segment sums in order. Few threads (C/32 blocks): each loads
// COLSUM_AHEAD values before adding them in order, so the loads overlap.
#define COLSUM_SEGS 8
#define COLSUM_AHEAD 8
__global__ void column_sum_add_kernel(float *dw, const float *partial, int nb, int C) {
    __shared__ float seg_sum[COLSUM_SEGS][32];
    const int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    const int per = (nb + COLSUM_SEGS - 1) / COLSUM_SEGS;
    float s = 0.0f;
    if (c < C)
        for (int b = ty * per, e = min(b + per, nb); b < e; b += COLSUM_AHEAD) {
            float v[COLSUM_AHEAD];
#pragma unroll
            for (int u = 0; u < COLSUM_AHEAD; u++) v[u] = b + u < e ? partial[(size_t)(b + u) * C + c] : 0.0f;
#pragma unroll
            for (int u = 0; u < COLSUM_AHEAD; u++)
                if (b + u < e) s += v[u];
        }
    seg_sum[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = seg_sum[0][tx];
        for (int v = 1; v < COLSUM_SEGS; v++) t += seg_sum[v][tx];
        dw[c] += t;
    }
}

// Rows per block for the dw partial sums: at least 16, at most 1024 blocks. A function of R
// only, so the summation order (and the bits) do not depend on the GPU.
static int rmsnorm_rows_per_block(int R) {
    int rpb = (R + 1023) / 1024;
    return rpb < 16 ? 16 : rpb;
}

void cuda_rmsnorm_backward(Backend *be, Buf dx, float *dw, Buf dy, Buf x, const float *w, const float *rstd, int R,
                           int C, bool accumulate) {
    if (R <= 0 || C <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({dx.p, dy.p, x.p, w}, {C});
    int rpb = RMS_WARPS, nw = RMS_WARPS, nb = (int)cuda_blocks((size_t)R, RMS_WARPS);
    size_t smem = 0;
    float *partial = nullptr;
    if (dw) {
        rpb = rmsnorm_rows_per_block(R);
        nb = (R + rpb - 1) / rpb;
        // one shared row of dw_row_len(C) floats per warp: as many warps (<= 8) as fit in 48 KiB, at least one
        size_t row_bytes = (size_t)dw_row_len(C) * sizeof(float);
        nw = (int)(48 * 1024 / row_bytes);
        nw = nw < 1 ? 1 : nw > RMS_WARPS ? RMS_WARPS : nw;
        smem = (size_t)nw * row_bytes;
        partial = (float *)cuda_scratch(be, (size_t)nb * C * sizeof(float));
        if (!partial) return;
    }
    with_num_type(dx.t, [&](auto tdx) {
        using Tdx = decltype(tdx);
        with_num_type(dy.t, [&](auto tdy) {
            using Tdy = decltype(tdy);
            with_num_type(x.t, [&](auto tx) {
                using Tx = decltype(tx);
                auto kernel = vec ? rmsnorm_backward_kernel<Tdx, Tdy, Tx, PW_VEC> : rmsnorm_backward_kernel<Tdx, Tdy, Tx, 1>;
                if (smem > 48 * 1024)   // C > 12288: opt in to more shared memory (fails if the GPU has too little)
                    CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                kernel<<<nb, nw * 32, smem, st>>>((Tdx *)dx.p, partial, (const Tdy *)dy.p, (const Tx *)x.p, w, rstd, R,
                                                  C, rpb, accumulate);
            });
        });
    });
    CUDA_LAUNCHED(be);
    if (dw) {
        column_sum_add_kernel<<<cuda_blocks((size_t)C, 32), dim3(32, COLSUM_SEGS), 0, st>>>(dw, partial, nb, C);
        CUDA_LAUNCHED(be);
    }
}
