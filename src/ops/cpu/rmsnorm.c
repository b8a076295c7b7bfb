// RMSNorm (eps inside the rsqrt, fp32, as HF OLMoE/Qwen3) forward and backward.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/vmath.h"
#include "ops/cpu/cpu_ops.h"

void op_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int R, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C;
        float *yr = y + (size_t)r * C;
        float s = 1.0f / sqrtf(vdot(xr, xr, C) / (float)C + eps);
        rstd[r] = s;
        for (int c = 0; c < C; c++) yr[c] = xr[c] * s * w[c];
    }
}

// dx for one row: dx = rstd*(dy*w) - x * rstd^3/C * sum(dy*w*x).
static void rmsnorm_backward_row(float *dx, const float *dy, const float *x, const float *w, float rstd, int C,
                                 bool accumulate) {
    float dot = vdot3(dy, w, x, C);
    float k = rstd * rstd * rstd * dot / (float)C;
    for (int c = 0; c < C; c++) {
        float g = rstd * dy[c] * w[c] - x[c] * k;
        dx[c] = accumulate ? dx[c] + g : g;
    }
}

// dw is a sum over rows: rows go in fixed chunks, each chunk sums into its own partial,
// partials are added in chunk order, so the bits do not depend on the thread count.
#define RMSNORM_DW_CHUNK 64

void op_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                         int R, int C, bool accumulate) {
    const int nchunks = (R + RMSNORM_DW_CHUNK - 1) / RMSNORM_DW_CHUNK;
    float *partial = NULL;
    if (dw) {
        partial = malloc((size_t)nchunks * C * sizeof(float));
        if (!partial) {   // out of memory for a small scratch: fall back to the serial sum
            op_rmsnorm_backward_ref(dx, dw, dy, x, w, rstd, R, C, accumulate);
            return;
        }
    }
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < nchunks; ch++) {
        int r0 = ch * RMSNORM_DW_CHUNK, r1 = r0 + RMSNORM_DW_CHUNK < R ? r0 + RMSNORM_DW_CHUNK : R;
        float *p = partial ? partial + (size_t)ch * C : NULL;
        if (p) memset(p, 0, (size_t)C * sizeof(float));
        for (int r = r0; r < r1; r++) {
            const float *dyr = dy + (size_t)r * C, *xr = x + (size_t)r * C;
            if (p)   // before the dx write: dx may alias dy
                for (int c = 0; c < C; c++) p[c] += dyr[c] * xr[c] * rstd[r];
            rmsnorm_backward_row(dx + (size_t)r * C, dyr, xr, w, rstd[r], C, accumulate);
        }
    }
    if (dw) {   // nchunks x C adds: serial is cheaper than another fork/join
        for (int ch = 0; ch < nchunks; ch++)
            for (int c = 0; c < C; c++) dw[c] += partial[(size_t)ch * C + c];
        free(partial);
    }
}

void op_rmsnorm_backward_ref(float *dx, float *dw, const float *dy, const float *x, const float *w,
                             const float *rstd, int R, int C, bool accumulate) {
    for (int r = 0; r < R; r++) {
        const float *dyr = dy + (size_t)r * C, *xr = x + (size_t)r * C;
        if (dw)
            for (int c = 0; c < C; c++) dw[c] += dyr[c] * xr[c] * rstd[r];
        rmsnorm_backward_row(dx + (size_t)r * C, dyr, xr, w, rstd[r], C, accumulate);
    }
}
