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
//
// QK-norm with RoPE (qk_norm_rope_forward/backward) runs the same two kernels with the
// rotation folded in: the forward rotates the normalised row before storing it, the backward
// rotates the incoming gradient back as it reads it, and the rows are read from (forward) or
// written into (backward) the joined q|k|v buffers in place (struct Rows). The rotation of a
// lane's 8 values needs the 8 a half-head away, which another lane holds: the loops over a
// row run every lane in every round for that shuffle. Each step rounds where the separate ops
// store (the normalised row, the rotated gradient), so the bits are those of copy_2d, rmsnorm
// and rope run one after another, which is also the fallback where the fusion does not apply.
// The row arithmetic is spelled in rounded intrinsics (__fmul_rn, __fmaf_rn, ...): plain float
// expressions leave ptxas free to contract a product and a sum into an FMA, and it might do so
// in one instantiation of a kernel (with the rotation) and not in the other; dx is evaluated as
// the cpu's ISO C evaluates it ((s*dy)*w - x*k, each product rounded).
#include <stdio.h>

#include <type_traits>

#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

#define RMS_WARPS 8    // rows in flight per block (forward, and backward without dw)

// Where a kernel's strided rows are: row r at (r / rpt) * ld + (r % rpt) * C, rpt rows of C per
// token, tokens ld apart (rpt 1, ld C: dense rows; a per-head QK-norm: rpt = heads, C = hd).
struct Rows {
    int rpt, ld;
};
static inline Rows dense_rows(int C) { return Rows{1, C}; }
__device__ __forceinline__ size_t row_offset(Rows l, int r, int C) {
    return (size_t)(r / l.rpt) * l.ld + (size_t)(r % l.rpt) * C;
}

// RoPE folded into a row pass: head vectors of hd along the row, the row's token at position
// token % T, tables [T, hd/2], sign +1 rotating (forward) or -1 (the transpose). cos_t NULL:
// none. Needs W = PW_VEC and hd/8 groups a head dividing 32 (rope_foldable): then the group a
// half-head from lane l's is lane (l ^ hd/16)'s in the same round. hd at most 32 groups of 8
// (ROPE_FOLD_MAX_HD = 256): hd 512 would give the lane mask 32, outside a warp, and
// __shfl_xor_sync would return the lane's own values (a wrong rotation, no error); the launchers
// check rope_foldable before running a ROPE kernel and record a failure otherwise.
struct RowRope {
    const float *cos_t, *sin_t;
    int T, hd;
    float sign;
};
#define ROPE_FOLD_MAX_HD (32 * PW_VEC)
static_assert(ROPE_FOLD_MAX_HD / 16 < 32, "the pairing lane mask hd/16 must stay inside a warp");
static bool rope_foldable(int hd) {
    return hd >= 2 * PW_VEC && hd <= ROPE_FOLD_MAX_HD && (hd & (hd - 1)) == 0;   // 16, 32, 64, 128, 256
}

// Rotates the W values v of the group at column c (every lane of the warp calls it in the same
// round; `on` false: no group of the row here, the lane only serves the shuffle).
template <int W>
__device__ __forceinline__ void rope_group(float *v, int c, bool on, int token, RowRope rp) {
    static_assert(W == PW_VEC, "the folded rotation pairs 8-element groups");
    float other[W];
    const int mask = rp.hd / 16;   // < 32: hd <= ROPE_FOLD_MAX_HD, checked by the launchers (rope_fold_checked)
#pragma unroll
    for (int j = 0; j < W; j++) other[j] = __shfl_xor_sync(0xffffffffu, v[j], mask);
    if (!on) return;
    const int half = rp.hd / 2, i = c % rp.hd;
    const bool first = i < half;
    const size_t at = (size_t)(token % rp.T) * half + (first ? i : i - half);
    float cs[W], sn[W];
    load_vec<W>(rp.cos_t + at, cs);
    load_vec<W>(rp.sin_t + at, sn);
#pragma unroll
    for (int j = 0; j < W; j++) v[j] = rope_rotate(v[j], other[j], cs[j], rp.sign * sn[j], first);
}

// v[0..W) rounded to T and back: the value a separate op would have stored and the next read.
template <typename T, int W> __device__ __forceinline__ void round_as_stored(float *v) {
#pragma unroll
    for (int j = 0; j < W; j++) v[j] = to_f(from_f<T>(v[j]));
}

// Host, before a launch: with a rotation (rope.cos_t set), whether the ROPE kernel can run (the
// vector width, one element type, rope_foldable(hd)); if not, a failure is recorded, so a
// rotation is never dropped silently (the qk_norm_rope entry points choose the separate ops
// before that could happen). Without a rotation: true.
static bool rope_fold_checked(Backend *be, const char *what, const RowRope &rope, bool vec, bool same_types) {
    if (!rope.cos_t || (vec && same_types && rope_foldable(rope.hd))) return true;
    char detail[160];
    snprintf(detail, sizeof detail, "the folded RoPE cannot run here (hd %d, %s, %s); the separate ops must be used",
             rope.hd, vec ? "vector width 8" : "no vector access", same_types ? "one type" : "mixed types");
    cuda_record_failure(be, what, detail, __FILE__, __LINE__);
    return false;
}

// Fused QK-norm + RoPE launches on this backend (forward, backward): cuda_qk_norm_rope_fused_calls.
static void count_fused(Backend *be, int backward) { cuda_state(be)->qk_norm_rope_fused[backward]++; }

// ---- forward --------------------------------------------------------------------------------
// y (dense) = x * rstd * w, x's rows where xrows says; x_copy (dense, or NULL) gets x as read;
// with ROPE the normalised row is rotated (as stored in Ty) before it is stored.
template <typename Ty, typename Tx, int W, bool ROPE>
__global__ void rmsnorm_forward_kernel(Ty *y, Tx *x_copy, float *rstd, const Tx *x, Rows xrows, const float *w, int R,
                                       int C, float eps, RowRope rope) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= R) return;                                  // whole warps leave together
    const Tx *xr = x + row_offset(xrows, r, C);
    Ty *yr = y + (size_t)r * C;
    float ss = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        float v[W];
        load_vec<W>(xr + c, v);
#pragma unroll
        for (int j = 0; j < W; j++) ss = __fmaf_rn(v[j], v[j], ss);
    }
    ss = warp_sum(ss);
    const float s = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[r] = s;
    for (int c0 = 0; c0 < C; c0 += 32 * W) {             // every lane every round (the rotation's shuffle)
        const int c = c0 + lane * W;
        const bool on = c < C;
        float v[W] = {}, g[W];
        if (on) {
            load_vec<W>(xr + c, v);
            if (x_copy) store_vec<W>(x_copy + (size_t)r * C + c, v);
            load_vec<W>(w + c, g);
#pragma unroll
            for (int j = 0; j < W; j++) v[j] = v[j] * s * g[j];
        }
        if constexpr (ROPE) {
            round_as_stored<Ty, W>(v);
            rope_group<W>(v, c, on, r / xrows.rpt, rope);
        }
        if (on) store_vec<W>(yr + c, v);
    }
}

static void rmsnorm_forward_launch(Backend *be, Buf y, Buf x_copy, float *rstd, Buf x, Rows xrows, const float *w,
                                   int R, int C, float eps, RowRope rope, bool vec) {
    if (R <= 0 || C <= 0) return;
    if (!rope_fold_checked(be, "rmsnorm forward (QK-norm with RoPE)", rope, vec,
                           y.t == x.t && (!x_copy.p || x_copy.t == x.t)))
        return;
    cudaStream_t st = cuda_state(be)->stream;
    const unsigned grid = cuda_blocks((size_t)R, RMS_WARPS);
    with_num_type(y.t, [&](auto ty) {
        using Ty = decltype(ty);
        with_num_type(x.t, [&](auto tx) {
            using Tx = decltype(tx);
            with_vec_width(vec, [&](auto wv) {
                constexpr int W = decltype(wv)::value;
                if constexpr (W == PW_VEC && std::is_same_v<Ty, Tx>) {   // the fused cases (fewer to compile)
                    if (rope.cos_t) {
                        rmsnorm_forward_kernel<Ty, Tx, W, true><<<grid, RMS_WARPS * 32, 0, st>>>(
                            (Ty *)y.p, (Tx *)x_copy.p, rstd, (const Tx *)x.p, xrows, w, R, C, eps, rope);
                        count_fused(be, 0);
                        return;
                    }
                }   // with a rotation, rope_fold_checked has returned before any other case
                rmsnorm_forward_kernel<Ty, Tx, W, false><<<grid, RMS_WARPS * 32, 0, st>>>(
                    (Ty *)y.p, (Tx *)x_copy.p, rstd, (const Tx *)x.p, xrows, w, R, C, eps, rope);
            });
        });
    });
    CUDA_LAUNCHED(be);
}

void cuda_rmsnorm_forward(Backend *be, Buf y, float *rstd, Buf x, const float *w, int R, int C, float eps) {
    rmsnorm_forward_launch(be, y, Buf{nullptr, x.t}, rstd, x, dense_rows(C), w, R, C, eps, RowRope{},
                           pw_vec_ok({y.p, x.p, w}, {C}));
}

// ---- backward -------------------------------------------------------------------------------
// Shared-memory slot of column c: its low 3 bits XOR bits 5..7. Lane l's element j of a
// W = 8 group (c = 256k + 8l + j) lands in bank 8(l % 4) + (j ^ l / 4): 32 banks for 32 lanes;
// 32 consecutive columns keep their 32 banks. A warp's row holds round_up(C, 8) slots.
__device__ __forceinline__ int dw_slot(int c) { return c ^ ((c >> 5) & 7); }
__host__ __device__ static inline int dw_row_len(int C) { return (C + 7) / 8 * 8; }

// dy's W values at column c as the norm's backward reads them: with ROPE rotated back first
// (and rounded to Tdy, as rope_backward stores them). Every lane calls it in the same round.
template <int W, bool ROPE, typename Tdy>
__device__ __forceinline__ void load_dy(float *a, const Tdy *dyr, int c, bool on, int token, RowRope rope) {
#pragma unroll
    for (int j = 0; j < W; j++) a[j] = 0.0f;
    if (on) load_vec<W>(dyr + c, a);
    if constexpr (ROPE) {
        rope_group<W>(a, c, on, token, rope);
        round_as_stored<Tdy, W>(a);
    }
}

// dx = rstd*dy*w - x * (rstd^3/C * sum(dy*w*x)), as the cpu's rmsnorm_backward_row; dy and x
// dense, dx's rows where dxrows says. Block b handles rows [b*rpb, min((b+1)*rpb, R)). With
// dw_partial != NULL, dynamic shared memory holds NW rows of dw_row_len(C) floats (one per
// warp) and partial[b, :] is written.
template <typename Tdx, typename Tdy, typename Tx, int W, bool ROPE>
__global__ void rmsnorm_backward_kernel(Tdx *dx, Rows dxrows, float *dw_partial, const Tdy *dy, const Tx *x,
                                        const float *w, const float *rstd, int R, int C, int rpb, bool accumulate,
                                        RowRope rope) {
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
        Tdx *dxr = dx + row_offset(dxrows, r, C);
        const int token = r / dxrows.rpt;
        const float s = rstd[r];
        float dot = 0.0f;
        for (int c0 = 0; c0 < C; c0 += 32 * W) {         // every lane every round (the rotation's shuffle)
            const int c = c0 + lane * W;
            const bool on = c < C;
            float a[W], b[W], g[W];
            load_dy<W, ROPE>(a, dyr, c, on, token, rope);
            if (!on) continue;
            load_vec<W>(w + c, g);
            load_vec<W>(xr + c, b);
#pragma unroll
            for (int j = 0; j < W; j++) dot = __fmaf_rn(__fmul_rn(a[j], g[j]), b[j], dot);
        }
        dot = warp_sum(dot);
        const float k = s * s * s * dot / (float)C;
        for (int c0 = 0; c0 < C; c0 += 32 * W) {
            const int c = c0 + lane * W;
            const bool on = c < C;
            float a[W], b[W], g[W], o[W];
            load_dy<W, ROPE>(a, dyr, c, on, token, rope);   // before the dx store: dx may alias dy
            if (!on) continue;
            load_vec<W>(w + c, g);
            load_vec<W>(xr + c, b);
            if (mine)
#pragma unroll
                for (int j = 0; j < W; j++)   // lane-private columns
                    mine[dw_slot(c + j)] = __fmaf_rn(__fmul_rn(a[j], b[j]), s, mine[dw_slot(c + j)]);
            if (accumulate) load_vec<W>(dxr + c, o);
#pragma unroll
            for (int j = 0; j < W; j++) {
                const float v = __fsub_rn(__fmul_rn(__fmul_rn(s, a[j]), g[j]), __fmul_rn(b[j], k));
                o[j] = accumulate ? __fadd_rn(o[j], v) : v;
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

static void rmsnorm_backward_launch(Backend *be, Buf dx, Rows dxrows, float *dw, Buf dy, Buf x, const float *w,
                                    const float *rstd, int R, int C, bool accumulate, RowRope rope, bool vec) {
    if (R <= 0 || C <= 0) return;
    if (!rope_fold_checked(be, "rmsnorm backward (QK-norm with RoPE)", rope, vec, dx.t == dy.t && dy.t == x.t)) return;
    cudaStream_t st = cuda_state(be)->stream;
    int rpb = RMS_WARPS, nw = RMS_WARPS, nb = (int)cuda_blocks((size_t)R, RMS_WARPS);
    size_t smem = 0;
    float *partial = nullptr;
    if (dw) {
        rpb = rmsnorm_rows_per_block(R);
        nb = (R + rpb - 1) / rpb;
        // one shared row per warp: as many warps (<= 8) as rows of C floats fit in 48 KiB, at least
        // one. nw from C itself, not from the row's dw_row_len(C) slots, so the warps (and dw's
        // summation order) are those of the unpadded rows; the padding (< 8 floats a warp) may take
        // smem a little over 48 KiB, which the opt-in below allows.
        nw = (int)(48 * 1024 / ((size_t)C * sizeof(float)));
        nw = nw < 1 ? 1 : nw > RMS_WARPS ? RMS_WARPS : nw;
        smem = (size_t)nw * dw_row_len(C) * sizeof(float);
        partial = (float *)cuda_scratch(be, (size_t)nb * C * sizeof(float));
        if (!partial) return;
    }
    with_num_type(dx.t, [&](auto tdx) {
        using Tdx = decltype(tdx);
        with_num_type(dy.t, [&](auto tdy) {
            using Tdy = decltype(tdy);
            with_num_type(x.t, [&](auto tx) {
                using Tx = decltype(tx);
                with_vec_width(vec, [&](auto wv) {
                    constexpr int W = decltype(wv)::value;
                    auto kernel = rmsnorm_backward_kernel<Tdx, Tdy, Tx, W, false>;
                    bool fused = false;   // with a rotation, rope_fold_checked has returned unless this case applies
                    if constexpr (W == PW_VEC && std::is_same_v<Tdx, Tdy> && std::is_same_v<Tdy, Tx>)
                        if (rope.cos_t) {
                            kernel = rmsnorm_backward_kernel<Tdx, Tdy, Tx, W, true>;
                            fused = true;
                        }
                    if (smem > 48 * 1024)   // C > 12288 or so: opt in to more shared memory (fails if the GPU has too little)
                        CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                            (int)smem));
                    kernel<<<nb, nw * 32, smem, st>>>((Tdx *)dx.p, dxrows, partial, (const Tdy *)dy.p,
                                                      (const Tx *)x.p, w, rstd, R, C, rpb, accumulate, rope);
                    if (fused) count_fused(be, 1);
                });
            });
        });
    });
    CUDA_LAUNCHED(be);
    if (dw) {
        column_sum_add_kernel<<<cuda_blocks((size_t)C, 32), dim3(32, COLSUM_SEGS), 0, st>>>(dw, partial, nb, C);
        CUDA_LAUNCHED(be);
    }
}

void cuda_rmsnorm_backward(Backend *be, Buf dx, float *dw, Buf dy, Buf x, const float *w, const float *rstd, int R,
                           int C, bool accumulate) {
    rmsnorm_backward_launch(be, dx, dense_rows(C), dw, dy, x, w, rstd, R, C, accumulate, RowRope{},
                            pw_vec_ok({dx.p, dy.p, x.p, w}, {C}));
}

// ---- QK-norm with RoPE --------------------------------------------------------------------------
// The fused kernels where rope_foldable(hd), the buffers are 16-byte aligned and the strides
// multiples of 8, and every buffer has one type (the model's: the compute type); the separate
// ops otherwise, or when the backend was opened with SPES_CUDA_QK_NORM_ROPE=separate (the same
// bits; for measuring the fusion against them in one run: bench/run_gpu.sh's BENCH_GPU_VARIANT).
// Each fused launch is counted (cuda_qk_norm_rope_fused_calls), so a test can tell which ran.
static bool qk_norm_rope_fused(Backend *be, int hd) {
    return rope_foldable(hd) && !cuda_state(be)->qk_norm_rope_separate;
}

void cuda_qk_norm_rope_fused_calls(Backend *be, uint64_t *forward, uint64_t *backward) {
    if (forward) *forward = cuda_state(be)->qk_norm_rope_fused[0];
    if (backward) *backward = cuda_state(be)->qk_norm_rope_fused[1];
}
void cuda_qk_norm_rope_forward(Backend *be, Buf y, Buf x_copy, float *rstd, Buf x, int ldx, const float *w,
                               const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, bool per_head,
                               float eps) {
    const int N = B * T, width = nh * hd;
    const QkNormRows q = qk_norm_rows(B, T, nh, hd, per_head);
    if (N <= 0 || nh <= 0 || hd < 2) return;
    if (!qk_norm_rope_fused(be, hd) || x_copy.t != x.t || y.t != x.t ||
        !pw_vec_ok({y.p, x_copy.p, x.p, w, cos_t, sin_t}, {ldx, width})) {
        cuda_copy_2d(be, x_copy, width, x, ldx, N, width);
        cuda_rmsnorm_forward(be, y, rstd, x_copy, w, q.rows, q.width, eps);
        cuda_rope_forward(be, y, cos_t, sin_t, B, T, nh, hd);
        return;
    }
    rmsnorm_forward_launch(be, y, x_copy, rstd, x, Rows{per_head ? nh : 1, ldx}, w, q.rows, q.width, eps,
                           RowRope{cos_t, sin_t, T, hd, 1.0f}, true);
}

void cuda_qk_norm_rope_backward(Backend *be, Buf dx, int lddx, float *dw, Buf dy, Buf x, const float *w,
                                const float *rstd, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                                bool per_head) {
    const int N = B * T, width = nh * hd;
    const QkNormRows q = qk_norm_rows(B, T, nh, hd, per_head);
    if (N <= 0 || nh <= 0 || hd < 2) return;
    if (!qk_norm_rope_fused(be, hd) || dx.t != dy.t || dy.t != x.t ||
        !pw_vec_ok({dx.p, dy.p, x.p, w, cos_t, sin_t}, {lddx, width})) {
        cuda_rope_backward(be, dy, cos_t, sin_t, B, T, nh, hd);
        cuda_rmsnorm_backward(be, dy, dw, dy, x, w, rstd, q.rows, q.width, false);
        cuda_copy_2d(be, dx, lddx, dy, width, N, width);
        return;
    }
    rmsnorm_backward_launch(be, dx, Rows{per_head ? nh : 1, lddx}, dw, dy, x, w, rstd, q.rows, q.width, false,
                            RowRope{cos_t, sin_t, T, hd, -1.0f}, true);
}
