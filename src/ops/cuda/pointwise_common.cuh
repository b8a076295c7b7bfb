// Helpers shared by the pointwise / row-wise kernels (engineer B's files: elementwise.cu,
// rmsnorm.cu, rope.cu, router.cu, moe_dispatch.cu, cross_entropy.cu). Everything here is
// static / inline: each .cu file gets its own copy.
//
// Kernels are templates over the element types of their buffers (float, __nv_bfloat16,
// __half), chosen at run time from the Buf's NumType by with_num_type(). Arithmetic is fp32.
//
// Vector access: PW_VEC (8) consecutive elements moved with 16-byte loads/stores (one for
// bf16/f16, two for fp32). A kernel uses it when every pointer it vectorises is 16-byte
// aligned and every row length / stride is a multiple of 8 elements (pw_vec_ok); otherwise
// the same kernel runs with a vector width of 1 (plain element access). Both paths compute
// the same values in the same order, so the choice never changes results.
#pragma once
#include <stdint.h>

#include <initializer_list>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"

#define PW_VEC 8            // elements per vector access
#define PW_THREADS 256      // default block size

// ---- element conversion ---------------------------------------------------------------------
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// ---- vector access ------------------------------------------------------------------------
// 16 bytes of T: 4 floats or 8 bf16/f16.
template <typename T> struct alignas(16) Pack16 {
    static constexpr int N = 16 / (int)sizeof(T);
    T e[N];
};

// f[0..W) = p[0..W) as floats. W == PW_VEC: p must be 16-byte aligned; W == 1: any p.
template <int W, typename T> __device__ __forceinline__ void load_vec(const T *p, float *f) {
    if constexpr (W == 1) {
        f[0] = to_f(p[0]);
    } else {
        static_assert(W == PW_VEC, "vector width is 1 or PW_VEC");
        constexpr int P = Pack16<T>::N;
#pragma unroll
        for (int q = 0; q < W / P; q++) {
            Pack16<T> pk = reinterpret_cast<const Pack16<T> *>(p)[q];
#pragma unroll
            for (int j = 0; j < P; j++) f[q * P + j] = to_f(pk.e[j]);
        }
    }
}

// p[0..W) = f[0..W) rounded to T (round to nearest even).
template <int W, typename T> __device__ __forceinline__ void store_vec(T *p, const float *f) {
    if constexpr (W == 1) {
        p[0] = from_f<T>(f[0]);
    } else {
        static_assert(W == PW_VEC, "vector width is 1 or PW_VEC");
        constexpr int P = Pack16<T>::N;
#pragma unroll
        for (int q = 0; q < W / P; q++) {
            Pack16<T> pk;
#pragma unroll
            for (int j = 0; j < P; j++) pk.e[j] = from_f<T>(f[q * P + j]);
            reinterpret_cast<Pack16<T> *>(p)[q] = pk;
        }
    }
}

// Host: every length / stride in lens[] is a multiple of PW_VEC and every pointer aligned.
static inline bool pw_vec_ok(std::initializer_list<const void *> ptrs, std::initializer_list<long long> lens) {
    for (const void *p : ptrs)
        if (!cuda_aligned16(p)) return false;
    for (long long n : lens)
        if (n % PW_VEC != 0) return false;
    return true;
}

// ---- run-time type dispatch ---------------------------------------------------------------
// f(T{}) with T the C++ type of NumType t: with_num_type(b.t, [&](auto tag) { using T = decltype(tag); ... }).
template <typename F> static inline void with_num_type(NumType t, F &&f) {
    switch (t) {
    case NUM_BF16: f(__nv_bfloat16{}); break;
    case NUM_F16: f(__half{}); break;
    default: f(float{}); break;
    }
}

// f(std::integral_constant<int, W>{}) with W = PW_VEC when vec, else 1: the vector width a kernel
// template is launched with, as a compile-time value (decltype(w)::value).
template <typename F> static inline void with_vec_width(bool vec, F &&f) {
    if (vec) f(std::integral_constant<int, PW_VEC>{});
    else f(std::integral_constant<int, 1>{});
}

// ---- RoPE arithmetic ------------------------------------------------------------------------
// One rotate-half output: own*c - other*s for an element of a head's first half (first), own*c
// + other*s for one of its second half; s is the signed sine. Each product rounded on its own
// (no FMA contraction), as the cpu computes it; rope.cu and the QK-norm kernels share it, so a
// fused rotation gives the bits of the separate one.
__device__ __forceinline__ float rope_rotate(float own, float other, float c, float s, bool first) {
    const float a = __fmul_rn(own, c), b = __fmul_rn(other, s);
    return first ? __fsub_rn(a, b) : __fadd_rn(a, b);
}

// ---- launch geometry ----------------------------------------------------------------------
// Blocks for a grid-stride loop over `items` with `threads` per block: enough to fill the GPU
// (a few waves of blocks per SM), never more than the work needs. Results never depend on it.
static inline unsigned pw_grid(Backend *be, size_t items, unsigned threads) {
    size_t cap = (size_t)(cuda_state(be)->num_sms > 0 ? cuda_state(be)->num_sms : 80) * 16;
    size_t b = cuda_blocks(items, threads);
    return (unsigned)(b < cap ? b : cap);
}

// ---- warp reductions (fixed butterfly: every lane gets the same bits) ----------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same value returned to
// every thread. Warp sums, then warp 0 sums the warps' results in the same butterfly order.
// `shared` holds 32 floats. Contains __syncthreads: every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();                      // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : 0.0f;
    return warp_sum(v);
}
