// GEMM: OpenBLAS sgemm (OpenMP build: one thread inside our parallel regions, all outside),
// sgemv for a single row (M == 1: a decode step, an expert with one token), the triple loop as
// reference, and torch.nn.Linear-shaped helpers.
#include <cblas.h>

#include "ops/cpu/cpu_ops.h"

void op_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   // empty sum: C = beta*C (sgemm would also do this, but keep beta==0 exact)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (M == 1) {
        // One row: y = alpha op(B)^T x + beta y. OpenBLAS's sgemm (0.3.21) packs all of B first,
        // ~5x the time of sgemv's one pass at bench-small's shapes (a decode step's weights).
        // x is A's row (or column, transposed); beta 0 must not read C (it may hold NaN).
        if (beta == 0.0f)
            for (int j = 0; j < N; j++) C[j] = 0.0f;
        const int incx = trans_a ? lda : 1;
        if (trans_b)   // B is [N, K]
            cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, incx, beta, C, 1);
        else           // B is [K, N]
            cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, incx, beta, C, 1);
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
