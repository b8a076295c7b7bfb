// Multi-tensor fused AdamW: one launch updates every trainable tensor (fp32 master p, moments
// m and v) and writes the low-precision compute copy from the new p in the same pass.
//
// Arithmetic: torch's single-tensor AdamW exactly as src/ops/cpu/adamw.c evaluates it, every
// operation a separately rounded float op (__fmul_rn & co. forbid nvcc's FMA contraction; the
// cpu build is ISO C, which does not contract either; sqrt and division are IEEE-rounded
// without fast-math). So the GPU and the cpu give the same bits for p, m and v:
//   g  = g * grad_scale                 (clipping / unscaling; the gradient buffer is not written)
//   p  = p * decay_mul
//   m  = m + w1 * (g - m)
//   v  = v * beta2;  v = v + (w2 * g) * g
//   p  = p + neg_step_size * (m / (sqrt(v) / bc2_sqrt + eps))
//   compute = (compute type) p          (round to nearest even)
//
// Work split: tensor i gets ceil(n_i / ADAMW_CHUNK) blocks; a block finds its tensor by
// binary search over the blocks' prefix (first_block) in the launch's descriptors, which
// travel by value in the kernel parameters, ADAMW_BATCH tensors a launch (the per-tensor
// decay_mul follows the lr schedule). No upload: a copy from pageable host memory may wait
// for the stream, which would hold the host while AdamW runs under the next forward on the
// aux queue (overlap_step.h) instead of letting it queue that forward. A tensor
// whose buffers are all 16-byte aligned is read and written PW_VEC elements a thread with
// 16-byte accesses (the scalar loop ran at ~3.5 TB/s on an H200), the last n % PW_VEC one at a
// time; the arithmetic per element is the same either way.
#include "ops/cuda/pointwise_common.cuh"

#include <string.h>

#include "ops/cuda/cuda_ops.h"

#define ADAMW_THREADS 256
#define ADAMW_CHUNK (ADAMW_THREADS * PW_VEC)
#define ADAMW_BATCH 48   // descriptors a launch: 48 x 72 bytes and the scalars (3492 bytes) fit the 4 KB of parameters

struct AdamWDesc {
    float *p;
    const float *g;
    float *m, *v;
    void *c;                // compute copy or NULL
    size_t n;
    size_t first_block;     // blocks before this tensor's
    float decay_mul;
    int c_type;             // NumType of c
    int vec;                // p, g, m, v (and c) 16-byte aligned: PW_VEC elements a thread
};

struct AdamWBatch {        // one launch's tensors, passed by value
    AdamWDesc d[ADAMW_BATCH];
    int count;
};
static_assert(sizeof(AdamWBatch) + sizeof(AdamWScalars) <= 4096, "AdamW's kernel parameters exceed 4 KB");

// One element's update, in the order the header gives.
__device__ __forceinline__ void adamw_element(float &p, float &m, float &v, float g_raw, float decay_mul,
                                              const AdamWScalars &s) {
    float g = __fmul_rn(g_raw, s.grad_scale);
    p = __fmul_rn(p, decay_mul);
    m = __fadd_rn(m, __fmul_rn(s.w1, __fsub_rn(g, m)));
    v = __fmul_rn(v, s.beta2);
    v = __fadd_rn(v, __fmul_rn(__fmul_rn(s.w2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
    p = __fadd_rn(p, __fmul_rn(s.neg_step_size, __fdiv_rn(m, denom)));
}

// The vector path's stores: p[0..8) = f[0..8) as explicit 16-byte global stores. Through the
// descriptor's pointers nvcc 13.0 split the packed stores of load_vec's partner store_vec (the
// bf16 compute copy into eight 2-byte stores, a float pack in part into 4-byte ones: read in
// the PTX), which the kernels with pointer parameters do not see.
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ uint32_t bits_of(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __nv_bfloat162 round2(float a, float b, __nv_bfloat16) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ __half2 round2(float a, float b, __half) { return __floats2half2_rn(a, b); }

__device__ __forceinline__ void store8(float *p, const float *f) {
    __stwb(reinterpret_cast<float4 *>(p), make_float4(f[0], f[1], f[2], f[3]));
    __stwb(reinterpret_cast<float4 *>(p) + 1, make_float4(f[4], f[5], f[6], f[7]));
}
template <typename T> __device__ __forceinline__ void store8(T *p, const float *f) {   // bf16 / f16
    const T tag{};
    __stwb(reinterpret_cast<uint4 *>(p),
           make_uint4(bits_of(round2(f[0], f[1], tag)), bits_of(round2(f[2], f[3], tag)),
                      bits_of(round2(f[4], f[5], tag)), bits_of(round2(f[6], f[7], tag))));
}

// c[i..i+PW_VEC) = p[0..PW_VEC) in c's type (16-byte aligned).
__device__ __forceinline__ void store_compute_vec(void *c, NumType t, size_t i, const float *p) {
    switch (t) {
    case NUM_BF16: store8((__nv_bfloat16 *)c + i, p); break;
    case NUM_F16: store8((__half *)c + i, p); break;
    default: store8((float *)c + i, p); break;
    }
}

__global__ void adamw_kernel(const AdamWBatch batch, AdamWScalars s) {
    size_t b = blockIdx.x;
    // last tensor whose first_block <= b (tensors with n == 0 were left out on the host)
    int lo = 0, hi = batch.count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (batch.d[mid].first_block <= b) lo = mid;
        else hi = mid - 1;
    }
    const AdamWDesc d = batch.d[lo];
    size_t start = (b - d.first_block) * ADAMW_CHUNK, end = start + ADAMW_CHUNK;
    if (end > d.n) end = d.n;
    size_t vec_end = start;   // [start, vec_end): PW_VEC elements a thread
    if (d.vec) {
        vec_end = start + (end - start) / PW_VEC * PW_VEC;
        for (size_t i = start + (size_t)PW_VEC * threadIdx.x; i < vec_end; i += (size_t)PW_VEC * ADAMW_THREADS) {
            float p[PW_VEC], g[PW_VEC], m[PW_VEC], v[PW_VEC];
            load_vec<PW_VEC>(d.p + i, p);
            load_vec<PW_VEC>(d.g + i, g);
            load_vec<PW_VEC>(d.m + i, m);
            load_vec<PW_VEC>(d.v + i, v);
#pragma unroll
            for (int j = 0; j < PW_VEC; j++) adamw_element(p[j], m[j], v[j], g[j], d.decay_mul, s);
            store8(d.p + i, p);
            store8(d.m + i, m);
            store8(d.v + i, v);
            if (d.c) store_compute_vec(d.c, (NumType)d.c_type, i, p);
        }
    }
    for (size_t i = vec_end + threadIdx.x; i < end; i += ADAMW_THREADS) {
        float p = d.p[i], m = d.m[i], v = d.v[i];
        adamw_element(p, m, v, d.g[i], d.decay_mul, s);
        d.p[i] = p;
        d.m[i] = m;
        d.v[i] = v;
        if (d.c) store_num(d.c, (NumType)d.c_type, i, p);
    }
}

// Launches the batch's tensors (blocks: their ceil(n / ADAMW_CHUNK) summed) and empties it.
static void adamw_launch(Backend *be, AdamWBatch *batch, size_t blocks, const AdamWScalars *s) {
    if (batch->count == 0) return;
    adamw_kernel<<<(unsigned)blocks, ADAMW_THREADS, 0, cuda_state(be)->stream>>>(*batch, *s);
    CUDA_LAUNCHED(be);
    batch->count = 0;
}

extern "C" void cuda_adamw(Backend *be, const AdamWTensor *t, int count, const AdamWScalars *s) {
    AdamWBatch batch;
    memset(&batch, 0, sizeof batch);
    size_t blocks = 0;   // the batch's so far
    for (int i = 0; i < count; i++) {
        if (t[i].n == 0) continue;
        const size_t tensor_blocks = (t[i].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
        if (batch.count == ADAMW_BATCH || blocks + tensor_blocks > 0x7fffffffu) {
            adamw_launch(be, &batch, blocks, s);
            blocks = 0;
        }
        if (tensor_blocks > 0x7fffffffu) {
            cuda_record_failure(be, "cuda_adamw", "a tensor too large for one launch", __FILE__, __LINE__);
            return;
        }
        AdamWDesc &d = batch.d[batch.count++];
        d.p = t[i].p;
        d.g = t[i].g;
        d.m = t[i].m;
        d.v = t[i].v;
        d.c = t[i].compute.p;
        d.c_type = (int)t[i].compute.t;
        d.n = t[i].n;
        d.first_block = blocks;
        d.decay_mul = t[i].decay_mul;
        d.vec = cuda_aligned16(d.p) && cuda_aligned16(d.g) && cuda_aligned16(d.m) && cuda_aligned16(d.v) && cuda_aligned16(d.c);
        blocks += tensor_blocks;
    }
    adamw_launch(be, &batch, blocks, s);
}
