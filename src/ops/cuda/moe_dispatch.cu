// Dropless MoE dispatch: the (token, slot) pairs grouped by expert (a stable counting sort),
// gathered rows in, weighted sums back out. The cpu kernels: src/ops/cpu/moe_dispatch.c.
// Every output element has one owner thread; the only reductions (the per-expert counts and
// the dw dot products) run in a fixed order.
#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

// ---- moe_plan -------------------------------------------------------------------------------
// One block per expert e, no scratch, integers only (so the result is exact and deterministic):
//   1. count the slots s in [0, N*k) with topk_idx[s] < e (= offsets[e], the first row of e)
//      and == e;
//   2. walk the slots in order in tiles; warp w of a tile covers PLAN_ITEMS consecutive chunks
//      of 32 slots, takes a ballot of "slot is e" per chunk, and the rank of a slot among e's
//      slots is (slots of e in earlier tiles) + (in earlier warps of this tile) + (in earlier
//      chunks of this warp) + (in earlier lanes of this chunk). Rows of expert e are thus
//      assigned in slot order, i.e. tokens in order: the cpu's stable counting sort exactly.
#define PLAN_THREADS 1024
#define PLAN_ITEMS 16   // chunks of 32 slots per warp and tile

__global__ void moe_plan_kernel(int32_t *offsets, int32_t *row_token, int32_t *row_of_slot, const int32_t *topk_idx,
                                int NK, int E, int k) {
    __shared__ int counts[2];
    __shared__ int warp_total[PLAN_THREADS / 32];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (threadIdx.x < 2) counts[threadIdx.x] = 0;
    __syncthreads();
    int less = 0, same = 0;
    for (int s = threadIdx.x; s < NK; s += blockDim.x) {
        int x = topk_idx[s];
        less += x < e;
        same += x == e;
    }
    less = __reduce_add_sync(0xffffffffu, less);
    same = __reduce_add_sync(0xffffffffu, same);
    if (lane == 0) atomicAdd(&counts[0], less), atomicAdd(&counts[1], same);   // integers: order-free
    __syncthreads();
    const int first = counts[0];
    if (threadIdx.x == 0) {
        offsets[e] = first;
        if (e == E - 1) offsets[E] = first + counts[1];
    }
    const unsigned lt_mask = (1u << lane) - 1u;
    const int tile = nwarps * 32 * PLAN_ITEMS;
    int done = 0;                                         // rows of e assigned in earlier tiles
    for (int base = 0; base < NK; base += tile) {
        const int wbase = base + warp * 32 * PLAN_ITEMS;
        unsigned mask[PLAN_ITEMS];
        int mine = 0;
#pragma unroll
        for (int u = 0; u < PLAN_ITEMS; u++) {
            int s = wbase + u * 32 + lane;
            mask[u] = __ballot_sync(0xffffffffu, s < NK && topk_idx[s] == e);
            mine += __popc(mask[u]);
        }
        __syncthreads();                                  // the previous tile's totals were read
        if (lane == 0) warp_total[warp] = mine;
        __syncthreads();
        int before = done, tile_total = 0;
        for (int v = 0; v < nwarps; v++) {
            if (v == warp) before += tile_total;
            tile_total += warp_total[v];
        }
#pragma unroll
        for (int u = 0; u < PLAN_ITEMS; u++) {
            int s = wbase + u * 32 + lane;
            if (mask[u] >> lane & 1u) {
                int row = first + before + __popc(mask[u] & lt_mask);
                row_of_slot[s] = row;
                row_token[row] = s / k;
            }
            before += __popc(mask[u]);
        }
        done += tile_total;
    }
}

void cuda_moe_plan(Backend *be, int32_t *offsets, int32_t *row_token, int32_t *row_of_slot, const int32_t *topk_idx,
                   int N, int E, int k) {
    if (E <= 0) return;
    moe_plan_kernel<<<E, PLAN_THREADS, 0, cuda_state(be)->stream>>>(offsets, row_token, row_of_slot, topk_idx, N * k,
                                                                     E, k);
    CUDA_LAUNCHED(be);
}

// ---- gather_rows: dst[n, :] = src[rows[n], :] ----------------------------------------------
template <typename Td, typename Ts, int W>
__global__ void gather_rows_kernel(Td *dst, const Ts *src, const int32_t *rows, int count, int H) {
    const size_t per_row = (size_t)H / W, items = per_row * count;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / per_row, c = (i % per_row) * W;
        float v[W];
        load_vec<W>(src + (size_t)rows[n] * H + c, v);
        store_vec<W>(dst + n * H + c, v);
    }
}

void cuda_gather_rows(Backend *be, Buf dst, Buf src, const int32_t *rows, int count, int H) {
    if (count <= 0 || H <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({dst.p, src.p}, {H});
    const size_t items = (size_t)count * H;
    with_num_type(dst.t, [&](auto td) {
        using Td = decltype(td);
        with_num_type(src.t, [&](auto ts) {
            using Ts = decltype(ts);
            if (vec)
                gather_rows_kernel<Td, Ts, PW_VEC><<<pw_grid(be, items / PW_VEC, PW_THREADS), PW_THREADS, 0, st>>>(
                    (Td *)dst.p, (const Ts *)src.p, rows, count, H);
            else
                gather_rows_kernel<Td, Ts, 1><<<pw_grid(be, items, PW_THREADS), PW_THREADS, 0, st>>>(
                    (Td *)dst.p, (const Ts *)src.p, rows, count, H);
        });
    });
    CUDA_LAUNCHED(be);
}

// ---- moe_combine / moe_uncombine_add ---------------------------------------------------------
// out[n, c] = resid[n, c] + sum_j w[n,j] * y[row_of_slot[n*k+j], c]   (w == NULL: weights 1, the
// uncombine, resid == out). Accumulated in fp32 from resid's value, j in order, rounded to out's
// type once. resid may be out (no __restrict__).
template <typename To, typename Ty, int W>
__global__ void combine_kernel(To *out, const To *resid, const Ty *y, const float *w, const int32_t *row_of_slot, int N,
                               int k, int H) {
    const size_t per_row = (size_t)H / W, items = per_row * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / per_row, c = (i % per_row) * W;
        float acc[W];
        load_vec<W>(resid + n * H + c, acc);
        for (int j = 0; j < k; j++) {
            float v[W];
            load_vec<W>(y + (size_t)row_of_slot[n * k + j] * H + c, v);
            if (w) {
                float wj = w[n * k + j];
#pragma unroll
                for (int e = 0; e < W; e++) acc[e] += wj * v[e];
            } else {
#pragma unroll
                for (int e = 0; e < W; e++) acc[e] += v[e];
            }
        }
        store_vec<W>(out + n * H + c, acc);
    }
}

static void combine(Backend *be, Buf out, Buf resid, Buf y, const float *w, const int32_t *row_of_slot, int N, int k,
                    int H) {
    if (N <= 0 || H <= 0 || k <= 0) return;
    if (resid.t != out.t) {
        char detail[96];
        snprintf(detail, sizeof detail, "the residual is %s, the output %s (they must match)", num_type_name(resid.t),
                 num_type_name(out.t));
        cuda_record_failure(be, "moe_combine", detail, __FILE__, __LINE__);
        return;
    }
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({out.p, resid.p, y.p}, {H});
    const size_t items = (size_t)N * H;
    with_num_type(out.t, [&](auto to) {
        using To = decltype(to);
        with_num_type(y.t, [&](auto ty) {
            using Ty = decltype(ty);
            if (vec)
                combine_kernel<To, Ty, PW_VEC><<<pw_grid(be, items / PW_VEC, PW_THREADS), PW_THREADS, 0, st>>>(
                    (To *)out.p, (const To *)resid.p, (const Ty *)y.p, w, row_of_slot, N, k, H);
            else
                combine_kernel<To, Ty, 1><<<pw_grid(be, items, PW_THREADS), PW_THREADS, 0, st>>>(
                    (To *)out.p, (const To *)resid.p, (const Ty *)y.p, w, row_of_slot, N, k, H);
        });
    });
    CUDA_LAUNCHED(be);
}

void cuda_moe_combine(Backend *be, Buf out, Buf resid, Buf y, const float *w, const int32_t *row_of_slot, int N, int k,
                      int H) {
    combine(be, out, resid, y, w, row_of_slot, N, k, H);
}

void cuda_moe_uncombine_add(Backend *be, Buf dx, Buf dxe, const int32_t *row_of_slot, int N, int k, int H) {
    combine(be, dx, dx, dxe, nullptr, row_of_slot, N, k, H);
}

// ---- moe_combine_backward ---------------------------------------------------------------------
// One warp per pair (n, j): dy[row] = w[n,j] * dout[n]; dw[n,j] = dot(dout[n], y[row]) with
// each lane summing its columns in order and a fixed butterfly across the lanes.
#define COMBINE_BWD_WARPS 8

template <typename Tdy, typename Td, typename Ty, int W>
__global__ void combine_backward_kernel(Tdy *dy, float *dw, const Td *dout, const Ty *y, const float *w,
                                        const int32_t *row_of_slot, int N, int k, int H) {
    const int lane = threadIdx.x & 31;
    const size_t pair = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);   // n*k + j
    if (pair >= (size_t)N * k) return;                    // whole warps leave together
    const size_t n = pair / k, row = (size_t)row_of_slot[pair];
    const Td *d = dout + n * H;
    const Ty *yr = y + row * H;
    Tdy *dyr = dy + row * H;
    const float wj = w[pair];
    float dot = 0.0f;
    for (int c = lane * W; c < H; c += 32 * W) {
        float a[W], b[W];
        load_vec<W>(d + c, a);
        load_vec<W>(yr + c, b);
#pragma unroll
        for (int e = 0; e < W; e++) {
            dot += a[e] * b[e];
            a[e] = wj * a[e];
        }
        store_vec<W>(dyr + c, a);
    }
    dot = warp_sum(dot);
    if (lane == 0) dw[pair] = dot;
}

void cuda_moe_combine_backward(Backend *be, Buf dy, float *dw, Buf dout, Buf y, const float *w,
                               const int32_t *row_of_slot, int N, int k, int H) {
    if (N <= 0 || k <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({dy.p, dout.p, y.p}, {H});
    const unsigned grid = cuda_blocks((size_t)N * k, COMBINE_BWD_WARPS);
    with_num_type(dy.t, [&](auto tdy) {
        using Tdy = decltype(tdy);
        with_num_type(dout.t, [&](auto td) {
            using Td = decltype(td);
            with_num_type(y.t, [&](auto ty) {
                using Ty = decltype(ty);
                if (vec)
                    combine_backward_kernel<Tdy, Td, Ty, PW_VEC><<<grid, COMBINE_BWD_WARPS * 32, 0, st>>>(
                        (Tdy *)dy.p, dw, (const Td *)dout.p, (const Ty *)y.p, w, row_of_slot, N, k, H);
                else
                    combine_backward_kernel<Tdy, Td, Ty, 1><<<grid, COMBINE_BWD_WARPS * 32, 0, st>>>(
                        (Tdy *)dy.p, dw, (const Td *)dout.p, (const Ty *)y.p, w, row_of_slot, N, k, H);
            });
        });
    });
    CUDA_LAUNCHED(be);
}
