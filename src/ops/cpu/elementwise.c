// Row-parallel elementwise kernels: residual add, embedding lookup, SwiGLU.
#include <math.h>
#include <string.h>

#include "ops/cpu/vmath.h"
#include "ops/cpu/cpu_ops.h"

void op_add_inplace(float *y, const float *x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

// Memory-bound and cheap next to the GEMMs around it: serial, no fork/join.
void op_copy_2d(float *dst, int dst_stride, const float *src, int src_stride, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, (size_t)cols * sizeof(float));
}

void op_embedding_forward(float *out, const float *table, const int32_t *tokens, int N, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *row = table + (size_t)tokens[n] * H;
        float *o = out + (size_t)n * H;
        for (int c = 0; c < H; c++) o[c] = row[c];
    }
}

// Threads split the columns, each walks all tokens in order: no races, fixed order.
void op_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int H) {
    const int chunk = 64;
    const int nchunks = (H + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < nchunks; ch++) {
        int c0 = ch * chunk, c1 = c0 + chunk < H ? c0 + chunk : H;
        for (int n = 0; n < N; n++) {
            float *d = dtable + (size_t)tokens[n] * H;
            const float *g = dout + (size_t)n * H;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + vexpf(-x)); }

void op_swiglu_forward(float *a, const float *gu, int R, int I) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *g = gu + (size_t)r * 2 * I, *u = g + I;
        float *o = a + (size_t)r * I;
        for (int i = 0; i < I; i++) o[i] = g[i] * sigmoidf(g[i]) * u[i];
    }
}

// a = silu(g)*u; dgu may alias gu (in place).
// d silu(g)/dg = s*(1 + g*(1-s)), s = sigmoid(g).
void op_swiglu_backward(float *dgu, const float *da, const float *gu, int R, int I) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *g = gu + (size_t)r * 2 * I, *u = g + I, *d = da + (size_t)r * I;
        float *dg = dgu + (size_t)r * 2 * I, *du = dg + I;
        for (int i = 0; i < I; i++) {   // read before write: dgu may alias gu
            float gi = g[i], ui = u[i], di = d[i];
            float s = sigmoidf(gi);
            du[i] = di * gi * s;
            dg[i] = di * ui * s * (1.0f + gi * (1.0f - s));
        }
    }
}
