// Rotary position embeddings, HF rotate-half convention. The cpu kernels: src/ops/cpu/rope.c.
#include "ops/cuda/cuda_pointwise.h"
#include "ops/cuda/pointwise_common.cuh"

// Tables exactly as the cpu computes them: inv_freq = (float)(1 / pow(theta, 2i/hd)) in
// double, angle = (float)t * inv_freq in float, cos/sin of the float angle in double rounded to
// float. CUDA's double pow/cos/sin are within 2 ulp of double (glibc's within 1), so after the
// rounding to float the tables agree with the cpu's except, rarely, in the last float bit.
// Built once per run: the double arithmetic does not matter for speed.
__global__ void rope_tables_kernel(float *cos_t, float *sin_t, int T, int hd, float theta) {
    const int half = hd / 2;
    const size_t items = (size_t)T * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / half), i = (int)(idx % half);
        float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)hd));
        float angle = (float)t * inv_freq;
        cos_t[idx] = (float)cos((double)angle);
        sin_t[idx] = (float)sin((double)angle);
    }
}

void cuda_rope_tables(Backend *be, float *cos_t, float *sin_t, int T, int hd, float theta) {
    if (T <= 0 || hd < 2) return;
    const size_t items = (size_t)T * (hd / 2);
    rope_tables_kernel<<<pw_grid(be, items, PW_THREADS), PW_THREADS, 0, cuda_state(be)->stream>>>(cos_t, sin_t, T, hd,
                                                                                                   theta);
    CUDA_LAUNCHED(be);
}

// x[B,T,nh,hd] in place: one thread per W pairs (i, i + half) of one head vector.
// sign = +1 rotates by +angle (forward), -1 by -angle (the transpose: backward).
template <typename Tv, int W>
__global__ void rope_apply_kernel(Tv *x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                                  float sign) {
    const int half = hd / 2;
    const size_t per_row = (size_t)half / W, items = (size_t)B * T * nh * per_row;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < items;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t row = idx / per_row;                           // (b*T + t)*nh + h
        int i = (int)(idx % per_row) * W;
        int t = (int)((row / nh) % T);
        Tv *v = x + row * hd;
        float x1[W], x2[W], c[W], s[W];
        load_vec<W>(v + i, x1);
        load_vec<W>(v + i + half, x2);
        load_vec<W>(cos_t + (size_t)t * half + i, c);
        load_vec<W>(sin_t + (size_t)t * half + i, s);
        float o1[W], o2[W];
#pragma unroll
        for (int j = 0; j < W; j++) {
            float si = sign * s[j];
            o1[j] = rope_rotate(x1[j], x2[j], c[j], si, true);
            o2[j] = rope_rotate(x2[j], x1[j], c[j], si, false);
        }
        store_vec<W>(v + i, o1);
        store_vec<W>(v + i + half, o2);
    }
}

static void rope_apply(Backend *be, Buf x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                       float sign) {
    if (B <= 0 || T <= 0 || nh <= 0 || hd < 2) return;
    cudaStream_t st = cuda_state(be)->stream;
    const int half = hd / 2;
    const bool vec = pw_vec_ok({x.p, cos_t, sin_t}, {half});
    const size_t pairs = (size_t)B * T * nh * half;
    with_num_type(x.t, [&](auto tv) {
        using Tv = decltype(tv);
        if (vec)
            rope_apply_kernel<Tv, PW_VEC><<<pw_grid(be, pairs / PW_VEC, PW_THREADS), PW_THREADS, 0, st>>>(
                (Tv *)x.p, cos_t, sin_t, B, T, nh, hd, sign);
        else
            rope_apply_kernel<Tv, 1><<<pw_grid(be, pairs, PW_THREADS), PW_THREADS, 0, st>>>((Tv *)x.p, cos_t, sin_t, B,
                                                                                          T, nh, hd, sign);
    });
    CUDA_LAUNCHED(be);
}

void cuda_rope_forward(Backend *be, Buf x, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd) {
    rope_apply(be, x, cos_t, sin_t, B, T, nh, hd, 1.0f);
}

void cuda_rope_backward(Backend *be, Buf dx, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd) {
    rope_apply(be, dx, cos_t, sin_t, B, T, nh, hd, -1.0f);
}
