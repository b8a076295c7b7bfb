// Dropless MoE dispatch: (token, slot) pairs grouped into per-expert contiguous blocks,
// gathered rows in, weighted sums back out. Every output row has one owner thread.
#include <string.h>

#include "ops/cpu/vmath.h"
#include "ops/cpu/cpu_ops.h"

// Counting sort by expert, stable in token order: deterministic, O(N*k + E).
void op_moe_plan(int32_t *expert_offsets, int32_t *row_token, int32_t *row_of_slot, const int32_t *topk_idx, int N,
                 int E, int k) {
    memset(expert_offsets, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int s = 0; s < N * k; s++) expert_offsets[topk_idx[s] + 1]++;
    for (int e = 0; e < E; e++) expert_offsets[e + 1] += expert_offsets[e];
    // expert_offsets[e] doubles as the fill cursor, then is restored below.
    for (int s = 0; s < N * k; s++) {
        int32_t row = expert_offsets[topk_idx[s]]++;
        row_token[row] = s / k;
        row_of_slot[s] = row;
    }
    for (int e = E; e > 0; e--) expert_offsets[e] = expert_offsets[e - 1];
    expert_offsets[0] = 0;
}

void op_gather_rows(float *dst, const float *src, const int32_t *rows, int count, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < count; n++) memcpy(dst + (size_t)n * H, src + (size_t)rows[n] * H, (size_t)H * sizeof(float));
}

void op_moe_combine(float *out, const float *resid, const float *y, const float *w, const int32_t *row_of_slot, int N,
                    int k, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * H;
        if (resid != out) memcpy(o, resid + (size_t)n * H, (size_t)H * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *yr = y + (size_t)row_of_slot[(size_t)n * k + j] * H;
            float wj = w[(size_t)n * k + j];
            for (int c = 0; c < H; c++) o[c] += wj * yr[c];
        }
    }
}

void op_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y, const float *w,
                             const int32_t *row_of_slot, int N, int k, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * H;
        for (int j = 0; j < k; j++) {
            size_t row = (size_t)row_of_slot[(size_t)n * k + j];
            const float *yr = y + row * H;
            float *dyr = dy + row * H;
            float wj = w[(size_t)n * k + j];
            dw[(size_t)n * k + j] = vdot(d, yr, H);
            for (int c = 0; c < H; c++) dyr[c] = wj * d[c];
        }
    }
}

void op_moe_uncombine_add(float *dx, const float *dxe, const int32_t *row_of_slot, int N, int k, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dx + (size_t)n * H;
        for (int j = 0; j < k; j++) {
            const float *src = dxe + (size_t)row_of_slot[(size_t)n * k + j] * H;
            for (int c = 0; c < H; c++) d[c] += src[c];
        }
    }
}
