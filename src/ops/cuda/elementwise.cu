// Element-wise ops of the CUDA backend: residual add, strided (type-converting) copies,
// embedding lookup and its fixed-order backward. The cpu kernels: src/ops/cpu/elementwise.c.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

// ---- add_inplace: y[i] += x[i] -------------------------------------------------------------
// Groups of W elements, grid-stride; with W = PW_VEC the last n % W elements are done one by
// one by the first threads of block 0.
template <typename Ty, typename Tx, int W>
__global__ void add_inplace_kernel(Ty *y, const Tx *x, size_t n) {
    const size_t groups = n / W;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (size_t)gridDim.x * blockDim.x) {
        float a[W], b[W];
        load_vec<W>(y + g * W, a);
        load_vec<W>(x + g * W, b);
#pragma unroll
        for (int j = 0; j < W; j++) a[j] += b[j];
        store_vec<W>(y + g * W, a);
    }
    if (W > 1 && blockIdx.x == 0 && threadIdx.x < n % W) {
        size_t i = groups * W + threadIdx.x;
        y[i] = from_f<Ty>(to_f(y[i]) + to_f(x[i]));
    }
}

void cuda_add_inplace(Backend *be, Buf y, Buf x, size_t n) {
    if (n == 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({y.p, x.p}, {});
    with_num_type(y.t, [&](auto ty) {
        using Ty = decltype(ty);
        with_num_type(x.t, [&](auto tx) {
            using Tx = decltype(tx);
            if (vec)
                add_inplace_kernel<Ty, Tx, PW_VEC><<<pw_grid(be, n / PW_VEC, PW_THREADS), PW_THREADS, 0, st>>>(
                    (Ty *)y.p, (const Tx *)x.p, n);
            else
                add_inplace_kernel<Ty, Tx, 1><<<pw_grid(be, n, PW_THREADS), PW_THREADS, 0, st>>>((Ty *)y.p,
                                                                                                 (const Tx *)x.p, n);
        });
    });
    CUDA_LAUNCHED(be);
}

// ---- copy_2d: dst[r, 0:cols] = src[r, 0:cols] ----------------------------------------------
// Same types: the rows' bytes, 16 at a time where every row start is 16-byte aligned (the
// attention's q/k/v slices of the joined projection: cudaMemcpy2DAsync moved them at 1.5 TB/s
// on an H200), else cudaMemcpy2DAsync. Different types: one thread per W-element group.
template <typename Td, typename Ts, int W>
__global__ void copy_2d_kernel(Td *dst, int dst_stride, const Ts *src, int src_stride, int rows, int cols) {
    const size_t per_row = (size_t)cols / W, items = per_row * rows;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / per_row, c = (i % per_row) * W;
        float v[W];
        load_vec<W>(src + r * src_stride + c, v);
        store_vec<W>(dst + r * dst_stride + c, v);
    }
}

// Strides and row length in 16-byte units.
__global__ void copy_2d_16b_kernel(uint4 *dst, size_t dst_stride, const uint4 *src, size_t src_stride, int rows,
                                   size_t per_row) {
    const size_t items = per_row * rows;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / per_row, c = i % per_row;
        dst[r * dst_stride + c] = src[r * src_stride + c];
    }
}

void cuda_copy_2d(Backend *be, Buf dst, int dst_stride, Buf src, int src_stride, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    if (dst.t == src.t) {
        const size_t es = num_type_size(dst.t), row = (size_t)cols * es;
        const size_t dpitch = (size_t)dst_stride * es, spitch = (size_t)src_stride * es;
        if (((uintptr_t)dst.p | (uintptr_t)src.p | row | dpitch | spitch) % 16 == 0) {
            const size_t per_row = row / 16;
            copy_2d_16b_kernel<<<pw_grid(be, per_row * rows, PW_THREADS), PW_THREADS, 0, st>>>(
                (uint4 *)dst.p, dpitch / 16, (const uint4 *)src.p, spitch / 16, rows, per_row);
            CUDA_LAUNCHED(be);
        } else {
            CUDA_CHECK(be, cudaMemcpy2DAsync(dst.p, dpitch, src.p, spitch, row, (size_t)rows, cudaMemcpyDeviceToDevice, st));
        }
        return;
    }
    const bool vec = pw_vec_ok({dst.p, src.p}, {cols, dst_stride, src_stride});
    with_num_type(dst.t, [&](auto td) {
        using Td = decltype(td);
        with_num_type(src.t, [&](auto ts) {
            using Ts = decltype(ts);
            size_t items = (size_t)rows * cols;
            if (vec)
                copy_2d_kernel<Td, Ts, PW_VEC><<<pw_grid(be, items / PW_VEC, PW_THREADS), PW_THREADS, 0, st>>>(
                    (Td *)dst.p, dst_stride, (const Ts *)src.p, src_stride, rows, cols);
            else
                copy_2d_kernel<Td, Ts, 1><<<pw_grid(be, items, PW_THREADS), PW_THREADS, 0, st>>>(
                    (Td *)dst.p, dst_stride, (const Ts *)src.p, src_stride, rows, cols);
        });
    });
    CUDA_LAUNCHED(be);
}

// ---- embedding_forward: out[n, :] = table[tokens[n], :] ------------------------------------
template <typename To, int W>
__global__ void embedding_forward_kernel(To *out, const float *table, const int32_t *tokens, int N, int H) {
    const size_t per_row = (size_t)H / W, items = per_row * N;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / per_row, c = (i % per_row) * W;
        float v[W];
        load_vec<W>(table + (size_t)tokens[n] * H + c, v);
        store_vec<W>(out + n * H + c, v);
    }
}

void cuda_embedding_forward(Backend *be, Buf out, const float *table, const int32_t *tokens, int N, int H) {
    if (N <= 0 || H <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    const bool vec = pw_vec_ok({out.p, table}, {H});
    with_num_type(out.t, [&](auto to) {
        using To = decltype(to);
        size_t items = (size_t)N * H;
        if (vec)
            embedding_forward_kernel<To, PW_VEC><<<pw_grid(be, items / PW_VEC, PW_THREADS), PW_THREADS, 0, st>>>(
                (To *)out.p, table, tokens, N, H);
        else
            embedding_forward_kernel<To, 1><<<pw_grid(be, items, PW_THREADS), PW_THREADS, 0, st>>>(
                (To *)out.p, table, tokens, N, H);
    });
    CUDA_LAUNCHED(be);
}

// ---- embedding_backward: dtable[tokens[n], :] += dout[n, :], n in order ---------------------
// No atomics. The positions 0..N-1 are sorted by token with a stable radix sort (CUB), so each
// token's positions come out in increasing order. Then one block per (run of equal tokens,
// column chunk) adds that token's rows into its dtable row in position order:
//   acc = dtable[tok, c]; acc += dout[n1, c]; acc += dout[n2, c]; ...   (n1 < n2 < ...)
// which is exactly the cpu kernel's sequence of fp32 additions, so for fp32 dout the result
// is bit-identical to the cpu's (up to FMA contraction: there is none, these are plain adds).
#define EMB_BWD_THREADS 128
#define EMB_BWD_UNROLL 4    // rows of one token loaded together (independent loads in flight)

__global__ void iota_kernel(int32_t *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}

template <typename Tg, int W>
__global__ void embedding_backward_kernel(float *dtable, const Tg *dout, const int32_t *sorted_tok,
                                          const int32_t *sorted_pos, int N, int H) {
    const int i = blockIdx.x;                                 // a position in sorted order
    const int tok = sorted_tok[i];
    if (i > 0 && sorted_tok[i - 1] == tok) return;            // not the start of its token's run
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * W;
    if (c >= H) return;
    float *d = dtable + (size_t)tok * H + c;
    float acc[W];
    load_vec<W>(d, acc);
    int j = i;
    for (;;) {
        // up to EMB_BWD_UNROLL rows of this token: their loads are independent, the adds stay in order
        int pos[EMB_BWD_UNROLL], m = 0;
#pragma unroll
        for (int u = 0; u < EMB_BWD_UNROLL; u++)
            if (u == m && j < N && sorted_tok[j] == tok) pos[u] = sorted_pos[j++], m++;
        if (m == 0) break;
        float g[EMB_BWD_UNROLL][W];
#pragma unroll
        for (int u = 0; u < EMB_BWD_UNROLL; u++)
            if (u < m) load_vec<W>(dout + (size_t)pos[u] * H + c, g[u]);
#pragma unroll
        for (int u = 0; u < EMB_BWD_UNROLL; u++)
            if (u < m)
#pragma unroll
                for (int e = 0; e < W; e++) acc[e] += g[u][e];
        if (m < EMB_BWD_UNROLL) break;
    }
    store_vec<W>(d, acc);
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void cuda_embedding_backward(Backend *be, float *dtable, Buf dout, const int32_t *tokens, int N, int H) {
    if (N <= 0 || H <= 0) return;
    cudaStream_t st = cuda_state(be)->stream;
    // scratch: sorted tokens [N] | positions [N] | sorted positions [N] | CUB's temporary storage
    size_t cub_bytes = 0;
    CUDA_CHECK(be, cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, (const uint32_t *)nullptr, (uint32_t *)nullptr,
                                                   (const int32_t *)nullptr, (int32_t *)nullptr, N, 0, 31, st));
    const size_t part = align_up((size_t)N * sizeof(int32_t), 256);
    char *scratch = (char *)cuda_scratch(be, 3 * part + cub_bytes);
    if (!scratch) return;
    int32_t *sorted_tok = (int32_t *)scratch, *pos = (int32_t *)(scratch + part),
            *sorted_pos = (int32_t *)(scratch + 2 * part);
    iota_kernel<<<pw_grid(be, (size_t)N, PW_THREADS), PW_THREADS, 0, st>>>(pos, N);
    CUDA_LAUNCHED(be);
    // tokens are >= 0 (validated by the model): 31 key bits, unsigned order = signed order
    CUDA_CHECK(be, cub::DeviceRadixSort::SortPairs(scratch + 3 * part, cub_bytes, (const uint32_t *)tokens,
                                                   (uint32_t *)sorted_tok, (const int32_t *)pos, sorted_pos, N, 0, 31,
                                                   st));
    const bool vec = pw_vec_ok({dtable, dout.p}, {H});
    with_num_type(dout.t, [&](auto tg) {
        using Tg = decltype(tg);
        const int W = vec ? PW_VEC : 1;
        dim3 grid((unsigned)N, (unsigned)((H + EMB_BWD_THREADS * W - 1) / (EMB_BWD_THREADS * W)));
        if (vec)
            embedding_backward_kernel<Tg, PW_VEC><<<grid, EMB_BWD_THREADS, 0, st>>>(dtable, (const Tg *)dout.p,
                                                                                    sorted_tok, sorted_pos, N, H);
        else
            embedding_backward_kernel<Tg, 1><<<grid, EMB_BWD_THREADS, 0, st>>>(dtable, (const Tg *)dout.p, sorted_tok,
                                                                               sorted_pos, N, H);
    });
    CUDA_LAUNCHED(be);
}
