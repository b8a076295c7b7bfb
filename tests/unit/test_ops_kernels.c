// Fast kernels against their plain references: GEMM (every transpose, strided), tiled
// attention (GQA, T spanning several blocks, ragged last block), chunked RMSNorm backward;
// plus the MoE dispatch invariants and the router's tie-breaking.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/threads.h"
#include "ops/cpu/vmath.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_ops.h"

static float *random_floats(size_t n, uint64_t seed, double scale) {
    Rng rng;
    rng_seed(&rng, seed);
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&rng));
    return x;
}

// max |a-b| / (max|b| over the array), so tolerances are relative to the data's scale
static double rel_err(const float *a, const float *b, size_t n) {
    double diff = 0.0, mag = 1e-3;   // floor: an all-zero reference (T=1: dq = 0) compares absolutely
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        mag = fmax(mag, fabs((double)b[i]));
    }
    return diff / mag;
}

// M = 1 takes sgemv (a decode step's shape): the same contract, beta 0 included (C not read:
// NaN there must not reach the result; the padding after N untouched).
static void test_gemm_matches_reference(void **state) {
    (void)state;
    const int N = 29, K = 53, pad = 3, Ms[] = {37, 1};
    for (int mi = 0; mi < 2; mi++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                const int M = Ms[mi];
                int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                float *A = random_floats((size_t)(ta ? K : M) * lda, 1, 1.0);
                float *Bm = random_floats((size_t)(tb ? N : K) * ldb, 2, 1.0);
                float *C1 = random_floats((size_t)M * ldc, 3, 1.0);
                float *C2 = malloc((size_t)M * ldc * sizeof(float));
                memcpy(C2, C1, (size_t)M * ldc * sizeof(float));
                op_gemm(ta, tb, M, N, K, 0.7f, A, lda, Bm, ldb, 0.5f, C1, ldc);
                op_gemm_ref(ta, tb, M, N, K, 0.7f, A, lda, Bm, ldb, 0.5f, C2, ldc);
                double e = rel_err(C1, C2, (size_t)M * ldc);
                for (size_t i = 0; i < (size_t)M * ldc; i++) C1[i] = (i % ldc) < (size_t)N ? NAN : -7.0f;
                op_gemm(ta, tb, M, N, K, 0.7f, A, lda, Bm, ldb, 0.0f, C1, ldc);
                op_gemm_ref(ta, tb, M, N, K, 0.7f, A, lda, Bm, ldb, 0.0f, C2, ldc);
                for (int i = 0; i < M; i++)
                    for (int j = N; j < ldc; j++) assert_true(C1[(size_t)i * ldc + j] == -7.0f);
                for (int i = 0; i < M; i++)
                    for (int j = N; j < ldc; j++) C1[(size_t)i * ldc + j] = C2[(size_t)i * ldc + j];
                double e0 = rel_err(C1, C2, (size_t)M * ldc);
                printf("gemm M=%d ta=%d tb=%d rel err %.2e, beta 0 over NaN %.2e\n", M, ta, tb, e, e0);
                assert_true(e < 1e-5);
                assert_true(e0 < 1e-5);
                free(A), free(Bm), free(C1), free(C2);
            }
}

static void check_attention(int B, int T, int nh, int nkv, int hd) {
    size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    float *q = random_floats(nq, 10, 1.0), *k = random_floats(nk, 11, 1.0), *v = random_floats(nk, 12, 1.0);
    float *dout = random_floats(nq, 13, 1.0);
    float *o1 = malloc(nq * 4), *o2 = malloc(nq * 4), *l1 = malloc((size_t)B * nh * T * 4),
          *l2 = malloc((size_t)B * nh * T * 4);
    float *dq1 = malloc(nq * 4), *dq2 = malloc(nq * 4), *dk1 = malloc(nk * 4), *dk2 = malloc(nk * 4),
          *dv1 = malloc(nk * 4), *dv2 = malloc(nk * 4);
    assert_int_equal(op_attention_forward(o1, l1, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    assert_int_equal(op_attention_forward_ref(o2, l2, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    assert_int_equal(op_attention_backward(dq1, dk1, dv1, dout, o2, l2, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    assert_int_equal(op_attention_backward_ref(dq2, dk2, dv2, dout, o2, l2, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    double eo = rel_err(o1, o2, nq), el = rel_err(l1, l2, (size_t)B * nh * T);
    double eq = rel_err(dq1, dq2, nq), ek = rel_err(dk1, dk2, nk), ev = rel_err(dv1, dv2, nk);
    printf("attention B=%d T=%d nh=%d nkv=%d hd=%d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", B, T, nh, nkv, hd,
           eo, el, eq, ek, ev);
    assert_true(eo < 1e-5 && el < 1e-5 && eq < 1e-4 && ek < 1e-4 && ev < 1e-4);
    free(q), free(k), free(v), free(dout), free(o1), free(o2), free(l1), free(l2);
    free(dq1), free(dq2), free(dk1), free(dk2), free(dv1), free(dv2);
}

static void test_attention_matches_reference(void **state) {
    (void)state;
    check_attention(2, 150, 4, 2, 16);   // GQA, 3 query blocks, ragged last one
    check_attention(1, 64, 2, 2, 8);     // exactly one block, MHA
    check_attention(1, 1, 4, 1, 8);      // a single token
}

static void test_rmsnorm_backward_matches_reference(void **state) {
    (void)state;
    const int R = 300, C = 24;
    float *x = random_floats((size_t)R * C, 20, 1.0), *w = random_floats(C, 21, 1.0), *dy = random_floats((size_t)R * C, 22, 1.0);
    float *y = malloc((size_t)R * C * 4), *rstd = malloc(R * 4);
    op_rmsnorm_forward(y, rstd, x, w, R, C, 1e-5f);
    float *dx1 = random_floats((size_t)R * C, 23, 1.0), *dx2 = malloc((size_t)R * C * 4);
    memcpy(dx2, dx1, (size_t)R * C * 4);
    float dw1[24] = {0}, dw2[24] = {0};
    op_rmsnorm_backward(dx1, dw1, dy, x, w, rstd, R, C, true);
    op_rmsnorm_backward_ref(dx2, dw2, dy, x, w, rstd, R, C, true);
    assert_true(rel_err(dx1, dx2, (size_t)R * C) < 1e-6);
    assert_true(rel_err(dw1, dw2, C) < 1e-5);
    free(x), free(w), free(dy), free(y), free(rstd), free(dx1), free(dx2);
}

static void test_router_ties_and_dispatch(void **state) {
    (void)state;
    // token 0: experts 1 and 3 tie for first, 0 and 2 tie below: lower index wins
    const int N = 3, E = 4, k = 2;
    float logits[12] = {0.5f, 2.0f, 0.5f, 2.0f, /**/ 3.0f, 1.0f, 2.0f, 0.0f, /**/ 0.0f, 0.0f, 0.0f, 0.0f};
    float probs[12], lse[3], w[6];
    int32_t idx[6];
    op_router_forward(probs, lse, idx, w, logits, N, E, k, true);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], 0);
    assert_int_equal(idx[3], 2);
    assert_int_equal(idx[4], 0);
    assert_int_equal(idx[5], 1);
    assert_true(fabsf(w[0] + w[1] - 1.0f) < 1e-6f);
    int32_t off[5], row_token[6], row_of_slot[6];
    op_moe_plan(off, row_token, row_of_slot, idx, N, E, k);
    int32_t want_off[5] = {0, 2, 4, 5, 6};
    assert_memory_equal(off, want_off, sizeof want_off);
    for (int s = 0; s < N * k; s++) {
        int row = row_of_slot[s];
        assert_int_equal(row_token[row], s / k);
        assert_true(row >= off[idx[s]] && row < off[idx[s] + 1]);
    }
}

// moe_combine: out = resid + sum_j w y, from a separate residual bit for bit as in place (the MoE
// block writes x_out from x_mid without copying it first), and equal to the sum written out.
static void test_moe_combine_residual_apart(void **state) {
    (void)state;
    const int N = 5, k = 2, H = 7;
    const int32_t row_of_slot[10] = {3, 0, 9, 1, 2, 8, 4, 5, 7, 6};
    float y[10 * 7], w[10], resid[5 * 7], in_place[5 * 7], apart[5 * 7];
    for (int i = 0; i < 10 * H; i++) y[i] = sinf(0.37f * (float)i);
    for (int i = 0; i < N * k; i++) w[i] = 0.1f + 0.05f * (float)i;
    for (int i = 0; i < N * H; i++) resid[i] = in_place[i] = cosf(0.91f * (float)i), apart[i] = 1e30f;
    op_moe_combine(in_place, in_place, y, w, row_of_slot, N, k, H);
    op_moe_combine(apart, resid, y, w, row_of_slot, N, k, H);
    assert_memory_equal(in_place, apart, sizeof apart);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < H; c++) {
            float want = resid[n * H + c];
            for (int j = 0; j < k; j++) want += w[n * k + j] * y[row_of_slot[n * k + j] * H + c];
            assert_float_equal(apart[n * H + c], want, 1e-6);
        }
}

// The table's gemm_residual (D = AB^T + R, R apart or D itself) is the copy of R into D and
// gemm with beta 1 to the bit; R is left as it was, D's padding columns untouched.
static void test_gemm_residual(void **state) {
    (void)state;
    const int M = 9, N = 6, K = 5, ld = N + 3;
    Backend *be = backend_cpu();
    float *A = random_floats((size_t)M * K, 40, 1.0), *B = random_floats((size_t)N * K, 41, 1.0);
    float *R = random_floats((size_t)M * ld, 42, 1.0), *R0 = malloc((size_t)M * ld * sizeof(float));
    float *want = malloc((size_t)M * ld * sizeof(float)), *D = malloc((size_t)M * ld * sizeof(float));
    memcpy(R0, R, (size_t)M * ld * sizeof(float));
    for (int i = 0; i < M * ld; i++) want[i] = D[i] = 1e30f;
    op_copy_2d(want, ld, R, ld, M, N);
    op_gemm(false, true, M, N, K, 0.5f, A, K, B, K, 1.0f, want, ld);
    be->ops->gemm_residual(be, false, true, M, N, K, 0.5f, buf_f32(A), K, buf_f32(B), K, buf_f32(R), buf_f32(D), ld);
    assert_memory_equal(D, want, (size_t)M * ld * sizeof(float));
    assert_memory_equal(R, R0, (size_t)M * ld * sizeof(float));
    // in place: R is D; the padding columns stay R's
    for (int r = 0; r < M; r++)
        for (int c = N; c < ld; c++) want[r * ld + c] = R0[r * ld + c];
    be->ops->gemm_residual(be, false, true, M, N, K, 0.5f, buf_f32(A), K, buf_f32(B), K, buf_f32(R), buf_f32(R), ld);
    assert_memory_equal(R, want, (size_t)M * ld * sizeof(float));
    // and one sum by hand
    double sum = R0[2 * ld + 3];
    for (int j = 0; j < K; j++) sum += 0.5 * A[2 * K + j] * B[3 * K + j];
    assert_float_equal(D[2 * ld + 3], sum, 1e-5);
    free(A), free(B), free(R), free(R0), free(want), free(D);
}

// The table's qk_norm_rope_forward/backward on the cpu: x read out of a joined row (tokens ld
// apart), dx written back into it (its other columns untouched); the same bits as copy, norm
// and rotation one after another; per token and per head.
static void test_qk_norm_rope_joined(void **state) {
    (void)state;
    Backend *be = backend_cpu();
    const int B = 2, T = 5, nh = 3, hd = 8, width = nh * hd, ld = 3 * width + 1, col = width, N = B * T;
    float cos_t[T * hd / 2], sin_t[T * hd / 2];
    op_rope_tables(cos_t, sin_t, T, hd, 10000.0f);
    for (int per_head = 0; per_head < 2; per_head++) {
        const int R = per_head ? N * nh : N, C = per_head ? hd : width;
        float *joined = random_floats((size_t)N * ld, 60, 1.0), *w = random_floats((size_t)C, 61, 1.0);
        float *dy = random_floats((size_t)N * width, 62, 1.0), *dyr = malloc((size_t)N * width * sizeof(float));
        float y[N * width], xc[N * width], rstd[N * nh], yr[N * width], xr[N * width], rr[N * nh];
        float dw[hd * nh], dwr[hd * nh], *dj = malloc((size_t)N * ld * sizeof(float));
        memcpy(dyr, dy, (size_t)N * width * sizeof(float));
        memcpy(dj, joined, (size_t)N * ld * sizeof(float));
        be->ops->qk_norm_rope_forward(be, buf_f32(y), buf_f32(xc), rstd, buf_f32(joined + col), ld, w, cos_t, sin_t, B,
                                      T, nh, hd, per_head, 1e-6f);
        op_copy_2d(xr, width, joined + col, ld, N, width);
        op_rmsnorm_forward(yr, rr, xr, w, R, C, 1e-6f);
        op_rope_forward(yr, cos_t, sin_t, B, T, nh, hd);
        assert_memory_equal(y, yr, sizeof y);
        assert_memory_equal(xc, xr, sizeof xc);
        assert_memory_equal(rstd, rr, (size_t)R * sizeof(float));
        for (int c = 0; c < C; c++) dw[c] = dwr[c] = 0.25f * (float)c;
        be->ops->qk_norm_rope_backward(be, buf_f32(dj + col), ld, dw, buf_f32(dy), buf_f32(xc), w, rstd, cos_t, sin_t,
                                       B, T, nh, hd, per_head);
        op_rope_backward(dyr, cos_t, sin_t, B, T, nh, hd);
        op_rmsnorm_backward(dyr, dwr, dyr, xr, w, rr, R, C, false);
        assert_memory_equal(dw, dwr, (size_t)C * sizeof(float));
        for (int n = 0; n < N; n++)
            for (int j = 0; j < ld; j++) {
                float want = j >= col && j < col + width ? dyr[n * width + j - col] : joined[n * ld + j];
                assert_memory_equal(&dj[n * ld + j], &want, sizeof want);
            }
        free(joined), free(w), free(dy), free(dyr), free(dj);
    }
}

// The vectorisable exp against libm in double: within 3 ulp over the whole useful range.
static void test_vexpf_accuracy(void **state) {
    (void)state;
    double worst = 0.0;
    for (float x = -86.0f; x < 88.7f; x += 3.7e-4f) {
        double want = exp((double)x), err = fabs(vexpf(x) - want) / want;
        if (err > worst) worst = err;
    }
    printf("vexpf worst relative error %.3g (%.2f ulp)\n", worst, worst / 0x1p-24);
    assert_true(worst < 3 * 0x1p-24);
    assert_true(vexpf(-INFINITY) == 0.0f);
    assert_true(vexpf(0.0f) == 1.0f);
    assert_true(isinf(vexpf(100.0f)));
    assert_true(isnan(vexpf(NAN)));
}

// Our kernels give the same bits on 1 and 2 threads (fixed ownership and reduction order).
static void run_kernels(int threads, float *out, float *dq, float *dk, float *dv, float *dx, float *dw) {
    const int B = 2, T = 130, nh = 4, nkv = 2, hd = 16, R = 500, C = 32;
    size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    float *q = random_floats(nq, 30, 1.0), *k = random_floats(nk, 31, 1.0), *v = random_floats(nk, 32, 1.0);
    float *dout = random_floats(nq, 33, 1.0), *lse = malloc((size_t)B * nh * T * 4);
    float *x = random_floats((size_t)R * C, 34, 1.0), *w = random_floats(C, 35, 1.0), *dy = random_floats((size_t)R * C, 36, 1.0);
    float *y = malloc((size_t)R * C * 4), *rstd = malloc(R * 4);
    int saved = threads_get();
    threads_set(threads);
    assert_int_equal(op_attention_forward(out, lse, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    assert_int_equal(op_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    op_rmsnorm_forward(y, rstd, x, w, R, C, 1e-6f);
    memset(dw, 0, C * sizeof(float));
    op_rmsnorm_backward(dx, dw, dy, x, w, rstd, R, C, false);
    threads_set(saved);
    free(q), free(k), free(v), free(dout), free(lse), free(x), free(w), free(dy), free(y), free(rstd);
}

static void test_kernels_independent_of_thread_count(void **state) {
    (void)state;
    size_t nq = 2 * 130 * 4 * 16, nk = 2 * 130 * 2 * 16, nx = 500 * 32;
    float *a[6], *b[6];
    size_t sizes[6] = {nq, nq, nk, nk, nx, 32};
    for (int i = 0; i < 6; i++) a[i] = malloc(sizes[i] * 4), b[i] = malloc(sizes[i] * 4);
    run_kernels(1, a[0], a[1], a[2], a[3], a[4], a[5]);
    run_kernels(2, b[0], b[1], b[2], b[3], b[4], b[5]);
    for (int i = 0; i < 6; i++) {
        assert_memory_equal(a[i], b[i], sizes[i] * 4);
        free(a[i]), free(b[i]);
    }
}

// A one-row GEMM (our product, not OpenBLAS's sgemv, whose bits follow the threads' split):
// the same bits on 1, 2 and 3 threads, at a size that runs threaded, outputs not a multiple of
// the block, both layouts of B.
static void test_one_row_gemm_independent_of_thread_count(void **state) {
    (void)state;
    const int N = 700, K = 333;
    float *x = random_floats(K, 40, 1.0), *Bm = random_floats((size_t)N * K, 41, 1.0);
    float *c1 = malloc(N * sizeof(float)), *c2 = malloc(N * sizeof(float));
    const int saved = threads_get();
    for (int tb = 0; tb < 2; tb++)
        for (int threads = 2; threads <= 3; threads++) {
            threads_set(1);
            op_gemm(false, tb, 1, N, K, 0.9f, x, K, Bm, tb ? K : N, 0.0f, c1, N);
            threads_set(threads);
            op_gemm(false, tb, 1, N, K, 0.9f, x, K, Bm, tb ? K : N, 0.0f, c2, N);
            assert_memory_equal(c1, c2, N * sizeof(float));
        }
    threads_set(saved);
    free(x), free(Bm), free(c1), free(c2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_row_gemm_independent_of_thread_count),
        cmocka_unit_test(test_gemm_matches_reference),
        cmocka_unit_test(test_attention_matches_reference),
        cmocka_unit_test(test_rmsnorm_backward_matches_reference),
        cmocka_unit_test(test_router_ties_and_dispatch),
        cmocka_unit_test(test_moe_combine_residual_apart),
        cmocka_unit_test(test_gemm_residual),
        cmocka_unit_test(test_qk_norm_rope_joined),
        cmocka_unit_test(test_vexpf_accuracy),
        cmocka_unit_test(test_kernels_independent_of_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
