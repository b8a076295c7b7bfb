// Reductions the host reads back (losses, router statistics, the gradient norm), in double,
// in a fixed order: the same inputs give the same bits on the same GPU (no atomics, and the
// partition into blocks depends only on n, not on the GPU's SM count).
//
//   pass 1: grid of G blocks (G a function of n, at most REDUCE_MAX_BLOCKS); thread t of block b
//           sums elements b*T + t, b*T + t + G*T, ... (T threads per block) in double, in that
//           order; the block's threads are combined by a fixed tree; partial[b] is written.
//           Where x is 16-byte aligned the "elements" are groups of 4 floats (16-byte loads:
//           the scalar loop read the 1B model's gradient at ~2.5 TB/s on an H200), each summed
//           in order, and the n % 4 floats after the last group follow as single elements.
//   pass 2: one block sums partial[0..G) the same way into out[0].
// The order differs from the cpu's sequential loop, so results agree with it to double
// rounding (~1e-16 relative), not bit for bit.
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

template <bool SQUARES> __device__ __forceinline__ double sum_term(float x) {
    double v = (double)x;
    return SQUARES ? v * v : v;
}

template <bool SQUARES> __global__ void sum_partials_kernel(double *partial, const float *x, size_t n) {
    __shared__ double sh[REDUCE_THREADS];
    const size_t stride = (size_t)gridDim.x * REDUCE_THREADS, first = (size_t)blockIdx.x * REDUCE_THREADS + threadIdx.x;
    const size_t groups = ((uintptr_t)x & 15u) == 0 ? n / 4 : 0;
    double s = 0.0;
    for (size_t i = first; i < groups; i += stride) {
        const float4 q = reinterpret_cast<const float4 *>(x)[i];
        s += sum_term<SQUARES>(q.x);
        s += sum_term<SQUARES>(q.y);
        s += sum_term<SQUARES>(q.z);
        s += sum_term<SQUARES>(q.w);
    }
    for (size_t i = 4 * groups + first; i < n; i += stride) s += sum_term<SQUARES>(x[i]);
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
