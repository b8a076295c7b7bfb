// Reductions the host reads back (losses, router statistics, the gradient norm), in double,
// in a fixed order: the same inputs give the same bits on the same GPU (no atomics, and the
// partition into blocks depends only on n, not on the GPU's SM count).
//
//   pass 1: grid of G blocks (G a function of n, at most REDUCE_MAX_BLOCKS); x is cut into
//           groups of 4 floats, x[4i..4i+3], i < n / 4; thread t of block b takes groups
//           b*T + t, b*T + t + G*T, ... (T threads per block) and adds each group's 4 values
//           in order into its double sum; the n % 4 floats after the last group follow as
//           single elements (threads 0..2 of block 0); the block's threads are combined by a
//           fixed tree; partial[b] is written.
//   pass 2: one block sums partial[0..G) the same way into out[0].
// Sums of squares add each term as fma(v, v, s) (v = (double)x[i]), spelled out rather than
// left to the compiler's contraction.
// Alignment changes the loads only, never the order: where x is 16-byte aligned a group is one
// 16-byte load (the scalar loop read the 1B model's gradient at ~2.5 TB/s on an H200),
// elsewhere four 4-byte loads of the same group, so a buffer gives the same bits wherever it
// starts. Each thread issues REDUCE_UNROLL groups' loads before adding any of them (more loads
// in flight per thread), then adds them one group after another: the order, and the bits, of
// one group at a time.
// The order differs from the cpu's sequential loop, so results agree with it to double
// rounding (~1e-16 relative), not bit for bit (bit for bit where every partial sum is exact).
#include "ops/cuda/cuda_common.cuh"

#include "ops/cuda/cuda_ops.h"

#define REDUCE_THREADS 512
#define REDUCE_MAX_BLOCKS 1024
#define REDUCE_ITEMS_PER_THREAD 16   // aim: about this many elements per thread before the grid is capped

// Fixed-order tree over the block's values (sh[REDUCE_THREADS]); returns the sum in thread 0.
__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

#define REDUCE_UNROLL 4   // groups whose loads a thread issues before adding them

// s + v*v (one rounding: fma) or s + v, v = (double)x
template <bool SQUARES> __device__ __forceinline__ double add_term(double s, float x) {
    const double v = (double)x;
    return SQUARES ? fma(v, v, s) : s + v;
}

// Group i, x[4i..4i+3]: one 16-byte load where x is 16-byte aligned, four 4-byte loads elsewhere.
template <bool ALIGNED> __device__ __forceinline__ float4 load_group(const float *x, size_t i) {
    if (ALIGNED) return reinterpret_cast<const float4 *>(x)[i];
    return make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
}

template <bool SQUARES> __device__ __forceinline__ double add_group(double s, float4 q) {
    s = add_term<SQUARES>(s, q.x);
    s = add_term<SQUARES>(s, q.y);
    s = add_term<SQUARES>(s, q.z);
    return add_term<SQUARES>(s, q.w);
}

// This thread's sum: groups first, first + stride, ... below n / 4 in that order, then the
// n % 4 floats after the last group as single elements (the header's order, for both loads).
template <bool SQUARES, bool ALIGNED>
__device__ __forceinline__ double thread_sum(const float *x, size_t n, size_t first, size_t stride) {
    const size_t groups = n / 4;
    double s = 0.0;
    size_t i = first;
    for (; i + (REDUCE_UNROLL - 1) * stride < groups; i += REDUCE_UNROLL * stride) {
        float4 q[REDUCE_UNROLL];
#pragma unroll
        for (int u = 0; u < REDUCE_UNROLL; u++) q[u] = load_group<ALIGNED>(x, i + u * stride);   // all in flight
#pragma unroll
        for (int u = 0; u < REDUCE_UNROLL; u++) s = add_group<SQUARES>(s, q[u]);   // then in order
    }
    for (; i < groups; i += stride) s = add_group<SQUARES>(s, load_group<ALIGNED>(x, i));
    for (i = 4 * groups + first; i < n; i += stride) s = add_term<SQUARES>(s, x[i]);
    return s;
}

template <bool SQUARES> __global__ void sum_partials_kernel(double *partial, const float *x, size_t n) {
    __shared__ double sh[REDUCE_THREADS];
    const size_t stride = (size_t)gridDim.x * REDUCE_THREADS, first = (size_t)blockIdx.x * REDUCE_THREADS + threadIdx.x;
    const double s = ((uintptr_t)x & 15u) == 0 ? thread_sum<SQUARES, true>(x, n, first, stride)
                                               : thread_sum<SQUARES, false>(x, n, first, stride);
    double total = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// out[0] = sum of partial[0..count) (one block)
__global__ void sum_final_kernel(double *out, const double *partial, int count) {
    __shared__ double sh[REDUCE_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += REDUCE_THREADS) s += partial[i];
    double total = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = total;
}

// Pass 1's block count for n values (its partials live in the reduction scratch).
static int sum_blocks(size_t n) {
    size_t want = (n + (size_t)REDUCE_THREADS * REDUCE_ITEMS_PER_THREAD - 1) /
                  ((size_t)REDUCE_THREADS * REDUCE_ITEMS_PER_THREAD);
    return (int)(want < 1 ? 1 : want > REDUCE_MAX_BLOCKS ? REDUCE_MAX_BLOCKS : want);
}

// The sum into out, or with out NULL into the reduction scratch one double past the partials
// (nothing allocated per call); returns where the sum is, NULL when the scratch failed.
static double *sum_any(Backend *be, double *out, const float *x, size_t n, bool squares) {
    cudaStream_t stream = cuda_state(be)->stream;
    const int blocks = sum_blocks(n);
    double *partial = NULL;
    if (n > 0 || !out) {
        size_t slots = (size_t)blocks + (out ? 0 : 1);
        partial = (double *)cuda_scratch_slot(be, CUDA_SCRATCH_REDUCE, slots * sizeof(double));
        if (!partial) return NULL;
        if (!out) out = partial + blocks;
    }
    if (n == 0) {
        CUDA_CHECK(be, cudaMemsetAsync(out, 0, sizeof(double), stream));   // +0.0
        return out;
    }
    if (squares) sum_partials_kernel<true><<<blocks, REDUCE_THREADS, 0, stream>>>(partial, x, n);
    else sum_partials_kernel<false><<<blocks, REDUCE_THREADS, 0, stream>>>(partial, x, n);
    CUDA_LAUNCHED(be);
    sum_final_kernel<<<1, REDUCE_THREADS, 0, stream>>>(out, partial, blocks);
    CUDA_LAUNCHED(be);
    return out;
}

extern "C" void cuda_sum(Backend *be, double *out, const float *x, size_t n, bool squares) {
    sum_any(be, out, x, n, squares);
}

// The same fixed blocking for any n (the cpu's 16384-element blocks are its own partition;
// the result agrees with it to double rounding). The sum lands in the reduction scratch, one
// double past the partials, so a step's norm allocates nothing.
extern "C" int cuda_grad_sum_squares(Backend *be, const float *x, size_t n, double *host_out) {
    const double *sum = sum_any(be, NULL, x, n, true);
    return be->ops->download(be, host_out, sum, sum ? sizeof(double) : 0);
}

// out[e] = (sum_n x[n, e]) / N: one block per column, threads over rows (fixed tree).
__global__ void column_means_kernel(double *out, const float *x, int N, int E) {
    __shared__ double sh[REDUCE_THREADS];
    int e = blockIdx.x;
    double s = 0.0;
    for (int n = threadIdx.x; n < N; n += REDUCE_THREADS) s += (double)x[(size_t)n * E + e];
    double total = block_sum(s, sh);
    if (threadIdx.x == 0) out[e] = total / N;
}

__global__ void fill_nan_kernel(double *out, int E) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < E) out[e] = __longlong_as_double(0x7ff8000000000000ll);
}

extern "C" void cuda_column_means(Backend *be, double *out, const float *x, int N, int E) {
    if (E <= 0) return;
    if (N <= 0) {   // 0/0 as the cpu computes it: NaN per column
        fill_nan_kernel<<<cuda_blocks((size_t)E, 256), 256, 0, cuda_state(be)->stream>>>(out, E);
        CUDA_LAUNCHED(be);
        return;
    }
    column_means_kernel<<<E, REDUCE_THREADS, 0, cuda_state(be)->stream>>>(out, x, N, E);
    CUDA_LAUNCHED(be);
}
