// GEMM: OpenBLAS sgemm (OpenMP build: one thread inside our parallel regions, all outside),
// our own product for a single row (M == 1: a decode step, an expert with one token), the
// triple loop as reference, and torch.nn.Linear-shaped helpers.
#include <cblas.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vmath.h"

#define GEMV_BLOCK 256                 // outputs a thread sums at once when B is [K, N]
#define GEMV_MIN_PARALLEL (1u << 16)   // B's elements below which one thread does it all

// One row: C[j] = alpha * sum_p x[p] op(B)[p][j] + beta * C[j] (beta 0: C not read). OpenBLAS's
// sgemm (0.3.21) packs all of B first, ~5x the time of one pass over it at bench-small's decode
// shapes, and its sgemv blocks by the threads' split, so its last bits follow the thread count;
// here each output's sum has one order whatever the threads: a 16-lane dot product (vdot) of
// B's row when B is [N, K], rows of B added in order into a block of outputs when it is [K, N].
static void gemm_one_row(bool trans_b, int N, int K, float alpha, const float *x, const float *B, int ldb,
                         float beta, float *C) {
    const bool parallel = (size_t)N * (size_t)K >= GEMV_MIN_PARALLEL;
    if (trans_b) {
#pragma omp parallel for schedule(static) if (parallel)
        for (int j = 0; j < N; j++) {
            float s = alpha * vdot(B + (size_t)j * ldb, x, K);
            C[j] = beta == 0.0f ? s : s + beta * C[j];
        }
        return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int j0 = 0; j0 < N; j0 += GEMV_BLOCK) {
        const int nb = N - j0 < GEMV_BLOCK ? N - j0 : GEMV_BLOCK;
        float acc[GEMV_BLOCK];
        for (int j = 0; j < nb; j++) acc[j] = 0.0f;
        for (int p = 0; p < K; p++) {
            const float xp = x[p], *b = B + (size_t)p * ldb + j0;
            for (int j = 0; j < nb; j++) acc[j] += xp * b[j];
        }
        for (int j = 0; j < nb; j++) {
            float s = alpha * acc[j];
            C[j0 + j] = beta == 0.0f ? s : s + beta * C[j0 + j];
        }
    }
}

void op_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   // empty sum: C = beta*C (sgemm would also do this, but keep beta==0 exact)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (M == 1 && (!trans_a || lda == 1)) {   // one contiguous row of A (a strided one, rare: sgemm)
        gemm_one_row(trans_b, N, K, alpha, A, B, ldb, beta, C);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

void op_gemm_ref(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int p = 0; p < K; p++) {
                float a = trans_a ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                float b = trans_b ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                acc += (double)a * b;
            }
            float *c = &C[(size_t)i * ldc + j];
            *c = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
}

void op_linear_forward(float *y, const float *x, const float *W, int N, int in, int out, bool accumulate) {
    op_gemm(false, true, N, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
}

void op_linear_backward_input(float *dx, const float *dy, const float *W, int N, int in, int out, bool accumulate) {
    op_gemm(false, false, N, in, out, 1.0f, dy, out, W, in, accumulate ? 1.0f : 0.0f, dx, in);
}

void op_linear_backward_weight(float *dW, const float *dy, const float *x, int N, int in, int out) {
    op_gemm(true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}
