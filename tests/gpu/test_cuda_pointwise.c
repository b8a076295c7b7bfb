// The pointwise / row-wise CUDA ops (src/ops/cuda/cuda_pointwise.h: elementwise.cu,
// rmsnorm.cu, rope.cu, router.cu, moe_dispatch.cu, cross_entropy.cu) against their cpu
// kernels (src/ops/cpu/cpu_ops.h), called through the cuda backend's table.
//
// Every case: random inputs from a fixed seed; outputs poisoned (0xFF bytes: NaN) before each
// run so an unwritten element fails; both vector paths (16-byte loads: rows a multiple of 8
// elements, aligned) and scalar paths (odd widths, or a pointer one element off alignment);
// fp32 and bf16 buffers (mixed where an op mixes them in the model: fp32 residual stream,
// bf16 activations); edge shapes (one row, widths not a multiple of 32, E not a power of two,
// k = 1 and k = E, E above the router's inline-dprob limit, rows of NaN logits (the router
// picks valid experts, as the cpu does), ignored targets, several moe_plan
// tiles). Reductions run twice and must give the same bits.
//
// Tolerances (u = unit roundoff: fp32 2^-24, bf16 2^-8; errors relative to max|ref| unless
// said otherwise). bf16 inputs are rounded on the host before the cpu reference sees them, so
// input rounding never counts; what remains:
//  - exact ops (copies, gathers, add, embedding forward/backward, uncombine, combine-backward
//    dy): the GPU does the same fp32 operations in the same order as the cpu, then one
//    rounding to the output type, which the reference gets too: tolerance 0.
//  - fp32 outputs of sums in another order (row norms, softmax sums, dot products, FMA
//    contraction): 1e-5 (observed errors are ~sqrt(n) u |terms| ~ 1e-6 for n <= 50k).
//  - a bf16 output of an fp32 value v: |round(v) - ref| <= u|v| + |v - ref|, so
//    2^-8 + 1e-5 relative to max|ref|.
//  - rmsnorm dw: sums of R terms dy*x*rstd in blocks (both sides), checked per column against
//    4 sqrt(R) u sum_r|term| + 1e-6 max|dw| (random-walk bound of a length-R summation; one
//    missing or doubled row changes a column by ~|term|, ~sqrt(R)/(4 u R) >> 1 times that).
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/timer.h"
#include "gpu/gpu_test.h"
#include "model/model_config.h"
#ifdef SPES_WITH_CUDA
#include "ops/cuda/cuda_pointwise.h"
#endif

static const double FP32_TOL = 1e-5;

static Backend *backend_for(NumType t) {
    return cuda_test_backend(t == NUM_F32 ? PRECISION_FP32 : t == NUM_F16 ? PRECISION_AMP_FP16 : PRECISION_AMP_BF16);
}

// Tolerance of an fp32 value of relative accuracy FP32_TOL stored in t.
static double stored_tol(NumType t) { return t == NUM_F32 ? FP32_TOL : gt_unit_roundoff(t) + FP32_TOL; }

// Device int32 array from host.
static int32_t *upload_ints(Backend *be, const int32_t *x, size_t n) {
    return gt_upload_bytes(be, x, n * sizeof(int32_t));
}
static int32_t *download_ints(Backend *be, const int32_t *d, size_t n) {
    return gt_download_bytes(be, d, n * sizeof(int32_t));
}
static void check_ints(const char *what, const int32_t *got, const int32_t *ref, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != ref[i]) fail_msg("%s: [%zu] got %d ref %d", what, i, got[i], ref[i]);
    printf("  %-40s identical (%zu ints)\n", what, n);
}

// The same buffer one element further on: misaligned for 16-byte access (the scalar path).
// Callers allocate one extra element.
static Buf shifted(Buf b, bool shift) { return shift ? buf_at(b, 1) : b; }

// A random permutation prefix: out[0..k) distinct values of [0, E).
static void random_distinct(Rng *rng, int32_t *out, int k, int E) {
    int32_t *perm = malloc((size_t)E * sizeof(int32_t));
    assert_non_null(perm);
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int j = 0; j < k; j++) {
        int m = j + (int)rng_below(rng, (uint64_t)(E - j));
        int32_t t = perm[j];
        perm[j] = perm[m], perm[m] = t;
        out[j] = perm[j];
    }
    free(perm);
}

// ---- the table ------------------------------------------------------------------------------
static void test_table_entries(void **state) {
    (void)state;
    Backend *be = backend_for(NUM_F32);
#ifdef SPES_WITH_CUDA
    const BackendOps *o = be->ops;
    assert_ptr_equal(o->add_inplace, cuda_add_inplace);
    assert_ptr_equal(o->copy_2d, cuda_copy_2d);
    assert_ptr_equal(o->embedding_forward, cuda_embedding_forward);
    assert_ptr_equal(o->embedding_backward, cuda_embedding_backward);
    assert_ptr_equal(o->rmsnorm_forward, cuda_rmsnorm_forward);
    assert_ptr_equal(o->rmsnorm_backward, cuda_rmsnorm_backward);
    assert_ptr_equal(o->rope_tables, cuda_rope_tables);
    assert_ptr_equal(o->rope_forward, cuda_rope_forward);
    assert_ptr_equal(o->rope_backward, cuda_rope_backward);
    assert_ptr_equal(o->qk_norm_rope_forward, cuda_qk_norm_rope_forward);
    assert_ptr_equal(o->qk_norm_rope_backward, cuda_qk_norm_rope_backward);
    assert_ptr_equal(o->router_forward, cuda_router_forward);
    assert_ptr_equal(o->router_backward, cuda_router_backward);
    assert_ptr_equal(o->moe_plan, cuda_moe_plan);
    assert_ptr_equal(o->gather_rows, cuda_gather_rows);
    assert_ptr_equal(o->moe_combine, cuda_moe_combine);
    assert_ptr_equal(o->moe_combine_backward, cuda_moe_combine_backward);
    assert_ptr_equal(o->moe_uncombine_add, cuda_moe_uncombine_add);
    assert_ptr_equal(o->cross_entropy_rows, cuda_cross_entropy_rows);
#else
    (void)be;
#endif
}

// ---- add_inplace ------------------------------------------------------------------------------
// y (ty) += x (tx); n not a multiple of 8 (the vector path's scalar tail).
static void check_add(NumType ty, NumType tx, size_t n, bool shift) {
    printf("add_inplace y %s x %s n %zu%s\n", num_type_name(ty), num_type_name(tx), n, shift ? " (misaligned)" : "");
    Backend *be = backend_for(ty);
    float *y = gt_random(n, 11, 1.0), *x = gt_random(n, 12, 1.0);
    gt_round_host(y, n, ty), gt_round_host(x, n, tx);
    Buf dy = gt_alloc(be, n + 1, ty), dx = gt_alloc(be, n + 1, tx);
    Buf yy = shifted(dy, shift), xx = shifted(dx, shift);
    gt_upload_into(be, yy, y, n), gt_upload_into(be, xx, x, n);
    be->ops->add_inplace(be, yy, xx, n);
    float *got = gt_download(be, yy, n);
    op_add_inplace(y, x, n);
    gt_round_host(y, n, ty);
    gt_check("y", got, y, n, 0.0);   // one fp32 add, one rounding: exact
    free(got), free(y), free(x);
    gt_free(be, dy), gt_free(be, dx);
}

static void test_add_inplace(void **state) {
    (void)state;
    check_add(NUM_F32, NUM_F32, 100003, false);
    check_add(NUM_F32, NUM_BF16, 100003, false);
    check_add(NUM_BF16, NUM_BF16, 4096, false);
    check_add(NUM_BF16, NUM_F32, 77, false);
    check_add(NUM_F32, NUM_F32, 1001, true);
    check_add(NUM_F32, NUM_F32, 1, false);
}

// ---- copy_2d ----------------------------------------------------------------------------------
// The columns past `cols` of each dst row must stay untouched (poison).
static void check_copy_2d(NumType td, NumType ts, int rows, int cols, int dst_stride, int src_stride) {
    printf("copy_2d %s <- %s rows %d cols %d strides %d %d\n", num_type_name(td), num_type_name(ts), rows, cols,
           dst_stride, src_stride);
    Backend *be = backend_for(td == NUM_F32 ? ts : td);
    size_t ns = (size_t)rows * src_stride, nd = (size_t)rows * dst_stride;
    float *src = gt_random(ns, 21, 2.0);
    gt_round_host(src, ns, ts);
    Buf s = gt_upload(be, src, ns, ts), d = gt_alloc(be, nd, td);
    be->ops->copy_2d(be, d, dst_stride, s, src_stride, rows, cols);
    float *got = gt_download(be, d, nd);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dst_stride; c++) {
            float g = got[(size_t)r * dst_stride + c];
            if (c >= cols) {
                if (!isnan(g)) fail_msg("copy_2d wrote past its columns: [%d,%d] = %g", r, c, g);
                continue;
            }
            float ref = gt_round(src[(size_t)r * src_stride + c], td);
            if (g != ref) fail_msg("copy_2d [%d,%d] got %.9g ref %.9g", r, c, g, ref);
        }
    printf("  %-40s exact, padding untouched\n", "dst");
    free(got), free(src);
    gt_free(be, s), gt_free(be, d);
}

static void test_copy_2d(void **state) {
    (void)state;
    check_copy_2d(NUM_F32, NUM_F32, 37, 100, 129, 101);     // same type, rows not 16-byte aligned: cudaMemcpy2DAsync
    check_copy_2d(NUM_BF16, NUM_BF16, 37, 64, 72, 192);     // same type, 16-byte rows (a q slice of qkv)
    check_copy_2d(NUM_F32, NUM_F32, 300, 12, 16, 12);       // same type, 16-byte rows, one 16-byte gap
    check_copy_2d(NUM_BF16, NUM_F32, 37, 64, 72, 128);      // converting, vector path
    check_copy_2d(NUM_F32, NUM_BF16, 5, 64, 64 + 8, 64);
    check_copy_2d(NUM_BF16, NUM_F32, 9, 30, 33, 31);        // converting, scalar path
    check_copy_2d(NUM_F16, NUM_F32, 1, 1, 1, 1);
}

// ---- embedding ----------------------------------------------------------------------------------
static void check_embedding(NumType t, int N, int H, int V, bool skewed) {
    printf("embedding %s N %d H %d V %d%s\n", num_type_name(t), N, H, V, skewed ? " (skewed tokens)" : "");
    Backend *be = backend_for(t);
    int32_t *tok = gt_random_ints((size_t)N, 31, V);
    if (skewed)   // most positions on token 3: one long run of equal tokens in the sorted order
        for (int n = 0; n < N; n++)
            if (n % 10 != 0) tok[n] = 3;
    float *table = gt_random((size_t)V * H, 32, 1.0);
    float *dout = gt_random((size_t)N * H, 33, 1.0), *dtable0 = gt_random((size_t)V * H, 34, 0.5);
    gt_round_host(dout, (size_t)N * H, t);
    int32_t *dtok = upload_ints(be, tok, (size_t)N);
    // forward
    float *dtab = gt_upload(be, table, (size_t)V * H, NUM_F32).p;
    Buf out = gt_alloc(be, (size_t)N * H, t);
    be->ops->embedding_forward(be, out, dtab, dtok, N, H);
    float *got = gt_download(be, out, (size_t)N * H), *ref = malloc((size_t)N * H * sizeof(float));
    op_embedding_forward(ref, table, tok, N, H);
    gt_round_host(ref, (size_t)N * H, t);
    gt_check("embedding forward", got, ref, (size_t)N * H, 0.0);
    free(got), free(ref);
    // backward: accumulates into dtable; the cpu's order of fp32 adds exactly (see elementwise.cu)
    Buf g = gt_upload(be, dout, (size_t)N * H, t);
    float *d1 = gt_upload(be, dtable0, (size_t)V * H, NUM_F32).p, *d2 = gt_upload(be, dtable0, (size_t)V * H, NUM_F32).p;
    be->ops->embedding_backward(be, d1, g, dtok, N, H);
    be->ops->embedding_backward(be, d2, g, dtok, N, H);
    got = gt_download(be, buf_f32(d1), (size_t)V * H);
    ref = gt_copy_floats(dtable0, (size_t)V * H);
    op_embedding_backward(ref, dout, tok, N, H);
    gt_check("embedding backward dtable", got, ref, (size_t)V * H, 0.0);
    gt_check_same_bits(be, "embedding backward, run twice", d1, d2, (size_t)V * H * sizeof(float));
    free(got), free(ref);
    gt_free(be, out), gt_free(be, g);
    backend_free(be, dtab), backend_free(be, d1), backend_free(be, d2), backend_free(be, dtok);
    free(tok), free(table), free(dout), free(dtable0);
}

static void test_embedding(void **state) {
    (void)state;
    check_embedding(NUM_F32, 300, 64, 20, false);
    check_embedding(NUM_BF16, 300, 64, 20, false);
    check_embedding(NUM_F32, 257, 37, 1000, false);    // H not a multiple of 8: scalar path
    check_embedding(NUM_F32, 4099, 2048, 50, true);    // runs longer than the 4-row unroll, 2 column blocks
    check_embedding(NUM_BF16, 1, 8, 3, false);
}

// ---- RMSNorm ---------------------------------------------------------------------------------
static void check_rmsnorm_forward(NumType ty, NumType tx, int R, int C) {
    printf("rmsnorm forward y %s x %s R %d C %d\n", num_type_name(ty), num_type_name(tx), R, C);
    Backend *be = backend_for(ty);
    size_t n = (size_t)R * C;
    float *x = gt_random(n, 41, 1.5), *w = gt_random_uniform((size_t)C, 42, 0.5, 1.5);
    gt_round_host(x, n, tx);
    Buf dx = gt_upload(be, x, n, tx), dy = gt_alloc(be, n, ty);
    float *dw = gt_upload(be, w, (size_t)C, NUM_F32).p, *drstd = gt_alloc(be, (size_t)R, NUM_F32).p;
    be->ops->rmsnorm_forward(be, dy, drstd, dx, dw, R, C, 1e-6f);
    float *y = gt_download(be, dy, n), *rstd = gt_download(be, buf_f32(drstd), (size_t)R);
    float *ry = malloc(n * sizeof(float)), *rr = malloc((size_t)R * sizeof(float));
    op_rmsnorm_forward(ry, rr, x, w, R, C, 1e-6f);
    gt_check("rstd", rstd, rr, (size_t)R, FP32_TOL);
    gt_check("y", y, ry, n, stored_tol(ty));
    free(x), free(w), free(y), free(rstd), free(ry), free(rr);
    gt_free(be, dx), gt_free(be, dy), backend_free(be, dw), backend_free(be, drstd);
}

static void test_rmsnorm_forward(void **state) {
    (void)state;
    check_rmsnorm_forward(NUM_F32, NUM_F32, 67, 64);
    check_rmsnorm_forward(NUM_F32, NUM_F32, 1, 100);       // C % 8 != 0: scalar path
    check_rmsnorm_forward(NUM_BF16, NUM_F32, 130, 2048);   // fp32 residual -> bf16 activations
    check_rmsnorm_forward(NUM_BF16, NUM_BF16, 333, 128);   // QK-norm per head
    check_rmsnorm_forward(NUM_F32, NUM_F32, 9, 20);        // C < 32: idle lanes
}

// Per column: |got - ref| <= 4 sqrt(R) u sum_r |dy*x*rstd| + 1e-6 max|ref| (see the header).
static void check_dw(const char *what, const float *got, const float *ref, const float *dw0, const float *dy,
                     const float *x, const float *rstd, int R, int C) {
    double mx = 0.0, worst = 0.0;
    for (int c = 0; c < C; c++) mx = fmax(mx, fabs(ref[c]));
    for (int c = 0; c < C; c++) {
        double s = fabs(dw0[c]);
        for (int r = 0; r < R; r++) s += fabs((double)dy[(size_t)r * C + c] * x[(size_t)r * C + c] * rstd[r]);
        double bound = 4.0 * sqrt((double)R + 1) * 0x1p-24 * s + 1e-6 * mx;
        double e = fabs((double)got[c] - ref[c]);
        if (!(e <= bound)) fail_msg("%s [%d]: got %.9g ref %.9g (bound %.3g)", what, c, got[c], ref[c], bound);
        worst = fmax(worst, e / bound);
    }
    printf("  %-40s within bound (worst %.2f of it)\n", what, worst);
}

// dw in the order rmsnorm.cu's two kernels sum it (its header): blocks of rpb rows
// (rmsnorm_rows_per_block), NW warps (as many rows of C floats as fit in 48 KiB, 1 to 8), warp w
// taking rows w, w + NW, ... of its block into its own sum, fma(dy*x, rstd, acc) row by row;
// the block adds its warps' sums in warp order; the blocks' sums go in 8 segments of
// ceil(nb/8) blocks, each summed in block order from 0, the segments in order, the total added
// to dw. That order decides the bits of every run, so it is spelled out here and compared bit
// for bit (check_dw only bounds the error, and cannot see a change of order).
static float *rmsnorm_dw_in_kernel_order(const float *dw0, const float *dy, const float *x, const float *rstd, int R,
                                         int C) {
    int rpb = (R + 1023) / 1024, nw = (int)(48 * 1024 / ((size_t)C * sizeof(float)));
    rpb = rpb < 16 ? 16 : rpb;
    nw = nw < 1 ? 1 : nw > 8 ? 8 : nw;
    const int nb = (R + rpb - 1) / rpb, per = (nb + 7) / 8;
    float *dw = malloc((size_t)C * sizeof(float)), *partial = malloc((size_t)nb * sizeof(float));
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < nb; b++) {
            const int r0 = b * rpb, r1 = r0 + rpb < R ? r0 + rpb : R;
            float t = 0.0f;
            for (int w = 0; w < nw; w++) {
                float acc = 0.0f;
                for (int r = r0 + w; r < r1; r += nw) {
                    const float p = dy[(size_t)r * C + c] * x[(size_t)r * C + c];   // rounded, as __fmul_rn
                    acc = fmaf(p, rstd[r], acc);
                }
                t = w == 0 ? acc : t + acc;
            }
            partial[b] = t;
        }
        float total = 0.0f;
        for (int s = 0; s < 8; s++) {
            float seg = 0.0f;
            for (int b = s * per; b < nb && b < (s + 1) * per; b++) seg += partial[b];
            total = s == 0 ? seg : total + seg;
        }
        dw[c] = dw0[c] + total;
    }
    free(partial);
    return dw;
}

// dx (tdx), dy (tdy), x (tx); dw when with_dw (starting from random values: it accumulates);
// accumulate: dx += ...; alias: dx is dy's buffer (only without accumulate, same types).
static void check_rmsnorm_backward(NumType tdx, NumType tdy, NumType tx, int R, int C, bool with_dw, bool accumulate,
                                   bool alias) {
    printf("rmsnorm backward dx %s dy %s x %s R %d C %d%s%s%s\n", num_type_name(tdx), num_type_name(tdy),
           num_type_name(tx), R, C, with_dw ? " dw" : "", accumulate ? " accumulate" : "", alias ? " dx=dy" : "");
    Backend *be = backend_for(tdx == NUM_F32 ? tdy : tdx);
    size_t n = (size_t)R * C;
    float *x = gt_random(n, 51, 1.5), *dy = gt_random(n, 52, 1.0), *dx0 = gt_random(n, 53, 1.0);
    float *w = gt_random_uniform((size_t)C, 54, 0.5, 1.5), *dw0 = gt_random((size_t)C, 55, 1.0);
    float *rstd = malloc((size_t)R * sizeof(float)), *ytmp = malloc(n * sizeof(float));
    gt_round_host(x, n, tx), gt_round_host(dy, n, tdy), gt_round_host(dx0, n, tdx);
    op_rmsnorm_forward(ytmp, rstd, x, w, R, C, 1e-6f);
    // reference
    float *rdx = gt_copy_floats(dx0, n), *rdw = gt_copy_floats(dw0, (size_t)C);
    op_rmsnorm_backward(rdx, with_dw ? rdw : NULL, dy, x, w, rstd, R, C, accumulate);
    // device, twice (determinism of dw)
    Buf ddy = gt_upload(be, dy, n, tdy), ddx = alias ? ddy : (accumulate ? gt_upload(be, dx0, n, tdx) : gt_alloc(be, n, tdx));
    Buf ddx2 = alias ? gt_upload(be, dy, n, tdy) : (accumulate ? gt_upload(be, dx0, n, tdx) : gt_alloc(be, n, tdx));
    Buf ddy2 = alias ? ddx2 : ddy;
    Buf dxx = gt_upload(be, x, n, tx);
    float *dw = gt_upload(be, w, (size_t)C, NUM_F32).p, *drstd = gt_upload(be, rstd, (size_t)R, NUM_F32).p;
    float *ddw = gt_upload(be, dw0, (size_t)C, NUM_F32).p, *ddw2 = gt_upload(be, dw0, (size_t)C, NUM_F32).p;
    be->ops->rmsnorm_backward(be, ddx, with_dw ? ddw : NULL, ddy, dxx, dw, drstd, R, C, accumulate);
    be->ops->rmsnorm_backward(be, ddx2, with_dw ? ddw2 : NULL, ddy2, dxx, dw, drstd, R, C, accumulate);
    float *gdx = gt_download(be, ddx, n);
    gt_check("dx", gdx, rdx, n, stored_tol(tdx));
    gt_check_same_bits(be, "dx, run twice", ddx.p, ddx2.p, n * num_type_size(tdx));
    float *gdw = gt_download(be, buf_f32(ddw), (size_t)C);
    if (with_dw) {
        check_dw("dw", gdw, rdw, dw0, dy, x, rstd, R, C);
        float *odw = rmsnorm_dw_in_kernel_order(dw0, dy, x, rstd, R, C);
        for (int c = 0; c < C; c++)
            if (memcmp(&gdw[c], &odw[c], sizeof(float)) != 0)
                fail_msg("dw [%d]: %.9g, the order of rmsnorm.cu's header gives %.9g (the kernels' summation "
                         "order changed, or this test's copy of it is wrong)", c, gdw[c], odw[c]);
        printf("  %-40s the same bits as rmsnorm.cu's order\n", "dw");
        free(odw);
        gt_check_same_bits(be, "dw, run twice", ddw, ddw2, (size_t)C * sizeof(float));
    }
    free(x), free(dy), free(dx0), free(w), free(dw0), free(rstd), free(ytmp), free(rdx), free(rdw), free(gdx), free(gdw);
    gt_free(be, ddy), gt_free(be, ddx2), gt_free(be, dxx);
    if (!alias) gt_free(be, ddx);
    backend_free(be, dw), backend_free(be, drstd), backend_free(be, ddw), backend_free(be, ddw2);
}

static void test_rmsnorm_backward(void **state) {
    (void)state;
    check_rmsnorm_backward(NUM_F32, NUM_F32, NUM_F32, 67, 64, true, false, false);
    check_rmsnorm_backward(NUM_F32, NUM_F32, NUM_F32, 1, 100, true, true, false);      // one row, scalar path
    check_rmsnorm_backward(NUM_F32, NUM_F32, NUM_F32, 3000, 96, true, false, true);    // 188 dw blocks, dx = dy
    check_rmsnorm_backward(NUM_F32, NUM_F32, NUM_F32, 40000, 24, true, true, false);   // 40 rows per dw block
    check_rmsnorm_backward(NUM_F32, NUM_BF16, NUM_F32, 130, 2048, true, true, false);  // residual: bf16 dy, fp32 dx
    check_rmsnorm_backward(NUM_BF16, NUM_BF16, NUM_BF16, 1000, 128, true, false, true); // QK-norm, in place
    check_rmsnorm_backward(NUM_BF16, NUM_BF16, NUM_F32, 50, 2048, false, false, false); // no dw
    check_rmsnorm_backward(NUM_F32, NUM_F32, NUM_F32, 17, 20000, true, false, false);   // C > 12288: opt-in shared memory
    check_rmsnorm_backward(NUM_F32, NUM_F32, NUM_F32, 300, 1755, true, false, false);   // 7 warps of 1760 padded floats: opt-in
}

// ---- RoPE ------------------------------------------------------------------------------------
static void test_rope_tables(void **state) {
    (void)state;
    Backend *be = backend_for(NUM_F32);
    const int cases[][2] = {{100, 64}, {4096, 128}, {7, 20}};
    const float thetas[] = {10000.0f, 500000.0f, 10000.0f};
    for (int i = 0; i < 3; i++) {
        int T = cases[i][0], hd = cases[i][1];
        size_t n = (size_t)T * (hd / 2);
        printf("rope tables T %d hd %d theta %g\n", T, hd, thetas[i]);
        float *dc = gt_alloc(be, n, NUM_F32).p, *ds = gt_alloc(be, n, NUM_F32).p;
        be->ops->rope_tables(be, dc, ds, T, hd, thetas[i]);
        float *c = gt_download(be, buf_f32(dc), n), *s = gt_download(be, buf_f32(ds), n);
        float *rc = malloc(n * sizeof(float)), *rs = malloc(n * sizeof(float));
        op_rope_tables(rc, rs, T, hd, thetas[i]);
        size_t differ = 0;
        for (size_t j = 0; j < n; j++) differ += (c[j] != rc[j]) + (s[j] != rs[j]);
        printf("  %zu of %zu values differ from the cpu's in some bit\n", differ, 2 * n);
        // same float angle, cos/sin in double rounded to float: at most one float ulp (2^-24 for |v| < 1)
        gt_check("cos", c, rc, n, 0x1p-23);
        gt_check("sin", s, rs, n, 0x1p-23);
        free(c), free(s), free(rc), free(rs);
        backend_free(be, dc), backend_free(be, ds);
    }
}

static void check_rope(NumType t, int B, int T, int nh, int hd, int pos0) {
    printf("rope %s B %d T %d nh %d hd %d first position %d\n", num_type_name(t), B, T, nh, hd, pos0);
    Backend *be = backend_for(t);
    const int half = hd / 2, Ttab = pos0 + T;
    size_t n = (size_t)B * T * nh * hd, nt = (size_t)Ttab * half;
    float *ct = malloc(nt * sizeof(float)), *st = malloc(nt * sizeof(float));
    op_rope_tables(ct, st, Ttab, hd, 10000.0f);
    float *dct = gt_upload(be, ct, nt, NUM_F32).p, *dst = gt_upload(be, st, nt, NUM_F32).p;
    float *x = gt_random(n, 61, 1.0);
    gt_round_host(x, n, t);
    Buf dx = gt_upload(be, x, n, t);
    const float *c0 = dct + (size_t)pos0 * half, *s0 = dst + (size_t)pos0 * half;
    be->ops->rope_forward(be, dx, c0, s0, B, T, nh, hd);
    float *got = gt_download(be, dx, n), *ref = gt_copy_floats(x, n);
    op_rope_forward(ref, ct + (size_t)pos0 * half, st + (size_t)pos0 * half, B, T, nh, hd);
    gt_check("forward", got, ref, n, stored_tol(t));
    // backward from the (rounded) forward output
    gt_round_host(ref, n, t);
    gt_upload_into(be, dx, ref, n);
    be->ops->rope_backward(be, dx, c0, s0, B, T, nh, hd);
    free(got);
    got = gt_download(be, dx, n);
    op_rope_backward(ref, ct + (size_t)pos0 * half, st + (size_t)pos0 * half, B, T, nh, hd);
    gt_check("backward", got, ref, n, stored_tol(t));
    free(got), free(ref), free(x), free(ct), free(st);
    gt_free(be, dx), backend_free(be, dct), backend_free(be, dst);
}

static void test_rope(void **state) {
    (void)state;
    check_rope(NUM_F32, 2, 5, 3, 64, 0);
    check_rope(NUM_BF16, 2, 33, 4, 128, 0);
    check_rope(NUM_F32, 1, 3, 2, 20, 0);      // half = 10: scalar path
    check_rope(NUM_BF16, 1, 1, 16, 64, 17);   // decode: one position, tables offset
}

// ---- QK-norm with RoPE ---------------------------------------------------------------------------
// qk_norm_rope_forward/backward (fused where the rotation folds: hd 16..256 a power of two,
// aligned rows, one type) against the separate GPU ops on the same inputs, to the bit (y, the
// kept copy of x, rstd; dx in its strided rows, every other column of the joined buffer
// untouched; dw), and in fp32 against the cpu. x is read out of a joined buffer (tokens ld apart,
// at column `col` of it); tables offset by pos0 (a KV-cache chunk). Which path ran is asserted
// through the backend's count of fused launches (cuda_qk_norm_rope_fused_calls): without it, a
// fusion condition failing quietly would compare the separate ops with themselves. The fallback
// cases (hd not foldable, ld odd, x one element off, mixed types, the SPES_CUDA_QK_NORM_ROPE
// switch) must take the separate ops, checked the same way. Outputs have a poisoned guard after
// them that must stay untouched.
typedef struct {
    NumType t;          // y, the kept copy of x, dy (and the joined buffer unless `mixed`)
    int B, T, nh, hd;
    bool per_head;
    int ld, col, pos0;
    bool mixed;         // the joined buffer (x, dx) fp32, the rest t: mixed types
    bool frozen;        // dw NULL: a frozen norm (the backward's launch without dw partials)
    bool fuses;         // the fused kernels must run, forward and backward (else the separate ops)
} QkCase;

enum { GUARD = 64 };   // elements after an output, poisoned, that must stay so

// The GUARD elements after b's first n: still the poison's 0xFF bytes.
static void check_guard(Backend *be, const char *what, Buf b, size_t n) {
    const size_t bytes = GUARD * num_type_size(b.t);
    unsigned char *h = gt_download_bytes(be, buf_at(b, n).p, bytes);
    for (size_t i = 0; i < bytes; i++)
        if (h[i] != 0xff) fail_msg("%s: written past its %zu elements (guard byte %zu)", what, n, i);
    printf("  %-40s untouched\n", what);
    free(h);
}

// The backend's fused qk_norm_rope launches so far (forward, backward).
static void qk_fused_calls(Backend *be, uint64_t *fwd, uint64_t *bwd) {
#ifdef SPES_WITH_CUDA
    cuda_qk_norm_rope_fused_calls(be, fwd, bwd);
#else
    (void)be;
    *fwd = *bwd = 0;
#endif
}

// Fails unless the op just run took the path `fused` says: `before` is the count before it.
static void check_path(Backend *be, const char *what, bool backward, uint64_t before, bool fused) {
    uint64_t f, b;
    qk_fused_calls(be, &f, &b);
    const uint64_t ran = (backward ? b : f) - before;
    printf("  %-40s %s\n", what, ran == 1 ? "fused kernel" : ran == 0 ? "separate ops" : "?");
    if (ran != (fused ? 1u : 0u))
        fail_msg("%s: %llu fused launches, expected %d (the %s)", what, (unsigned long long)ran, fused ? 1 : 0,
                 fused ? "fused kernel" : "separate ops");
}

// be NULL: the test backend of c.t's precision.
static void check_qk_norm_rope(Backend *be, QkCase c) {
    const NumType t = c.t, tj = c.mixed ? NUM_F32 : t;
    const int B = c.B, T = c.T, nh = c.nh, hd = c.hd, ld = c.ld, col = c.col, pos0 = c.pos0;
    const bool per_head = c.per_head;
    printf("qk_norm_rope %s (joined %s) B %d T %d nh %d hd %d %s ld %d col %d first position %d%s: %s\n",
           num_type_name(t), num_type_name(tj), B, T, nh, hd, per_head ? "per head" : "per token", ld, col, pos0,
           c.frozen ? ", frozen (no dw)" : "", c.fuses ? "fused" : "separate ops");
    if (!be) be = backend_for(t);
    const int N = B * T, width = nh * hd, half = hd / 2, R = per_head ? N * nh : N, C = per_head ? hd : width;
    const size_t nj = (size_t)N * ld, n = (size_t)N * width, nt = (size_t)(pos0 + T) * half;
    float *joined = gt_random(nj, 71, 1.5), *w = gt_random_uniform((size_t)C, 72, 0.5, 1.5);
    float *dy = gt_random(n, 73, 1.0), *dw0 = gt_random((size_t)C, 74, 1.0);
    float *ct = malloc(nt * sizeof(float)), *st = malloc(nt * sizeof(float));
    gt_round_host(joined, nj, tj), gt_round_host(dy, n, t);
    op_rope_tables(ct, st, pos0 + T, hd, 10000.0f);
    float *dct = gt_upload(be, ct, nt, NUM_F32).p, *dst = gt_upload(be, st, nt, NUM_F32).p;
    const float *c0 = dct + (size_t)pos0 * half, *s0 = dst + (size_t)pos0 * half;
    float *dw_ = gt_upload(be, w, (size_t)C, NUM_F32).p;
    Buf dj = gt_upload(be, joined, nj, tj), x = buf_at(dj, (size_t)col);
    uint64_t fwd0, bwd0;
    qk_fused_calls(be, &fwd0, &bwd0);

    // forward: the op (1) and the separate ops (2); outputs with a guard after them
    Buf y1 = gt_alloc(be, n + GUARD, t), y2 = gt_alloc(be, n, t), xc1 = gt_alloc(be, n + GUARD, t),
        xc2 = gt_alloc(be, n, t);
    float *r1 = gt_alloc(be, (size_t)R + GUARD, NUM_F32).p, *r2 = gt_alloc(be, (size_t)R, NUM_F32).p;
    be->ops->qk_norm_rope_forward(be, y1, xc1, r1, x, ld, dw_, c0, s0, B, T, nh, hd, per_head, 1e-6f);
    check_path(be, "forward ran", false, fwd0, c.fuses);
    be->ops->copy_2d(be, xc2, width, x, ld, N, width);
    be->ops->rmsnorm_forward(be, y2, r2, xc2, dw_, R, C, 1e-6f);
    be->ops->rope_forward(be, y2, c0, s0, B, T, nh, hd);
    gt_check_same_bits(be, "y, op = separate ops", y1.p, y2.p, n * num_type_size(t));
    gt_check_same_bits(be, "x kept, op = separate ops", xc1.p, xc2.p, n * num_type_size(t));
    gt_check_same_bits(be, "rstd, op = separate ops", r1, r2, (size_t)R * sizeof(float));
    check_guard(be, "guard after y", y1, n);
    check_guard(be, "guard after x kept", xc1, n);
    check_guard(be, "guard after rstd", buf_f32(r1), (size_t)R);

    // backward into the joined buffer (its other columns must stay as they are)
    Buf dy1 = gt_upload(be, dy, n, t), dy2 = gt_upload(be, dy, n, t);
    Buf dj1 = gt_alloc(be, nj + GUARD, tj), dj2 = gt_upload(be, joined, nj, tj);
    gt_upload_into(be, dj1, joined, nj);
    float *dw1 = gt_upload(be, dw0, (size_t)C, NUM_F32).p, *dw2 = gt_upload(be, dw0, (size_t)C, NUM_F32).p;
    be->ops->qk_norm_rope_backward(be, buf_at(dj1, (size_t)col), ld, c.frozen ? NULL : dw1, dy1, xc1, dw_, r1, c0, s0,
                                   B, T, nh, hd, per_head);
    check_path(be, "backward ran", true, bwd0, c.fuses);
    be->ops->rope_backward(be, dy2, c0, s0, B, T, nh, hd);
    be->ops->rmsnorm_backward(be, dy2, c.frozen ? NULL : dw2, dy2, xc1, dw_, r1, R, C, false);
    be->ops->copy_2d(be, buf_at(dj2, (size_t)col), ld, dy2, width, N, width);
    gt_check_same_bits(be, "dx (joined), op = separate ops", dj1.p, dj2.p, nj * num_type_size(tj));
    gt_check_same_bits(be, "dw, op = separate ops", dw1, dw2, (size_t)C * sizeof(float));
    if (c.frozen) {   // dw1 was not passed: still dw0
        float *g = gt_download(be, buf_f32(dw1), (size_t)C);
        gt_check("dw untouched (frozen)", g, dw0, (size_t)C, 0.0);
        free(g);
    }
    check_guard(be, "guard after the joined gradient", dj1, nj);
    float *gj = gt_download(be, dj1, nj);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < ld; j++)
            if (j < col || j >= col + width)
                if (gj[(size_t)r * ld + j] != joined[(size_t)r * ld + j])
                    fail_msg("joined gradient: token %d column %d outside the slice was written", r, j);

    if (t == NUM_F32 && tj == NUM_F32) {   // the cpu: the same three ops each way
        float *xr = malloc(n * sizeof(float)), *ry = malloc(n * sizeof(float)), *rr = malloc((size_t)R * sizeof(float));
        float *rdy = gt_copy_floats(dy, n), *rdw = gt_copy_floats(dw0, (size_t)C);
        op_copy_2d(xr, width, joined + col, ld, N, width);
        op_rmsnorm_forward(ry, rr, xr, w, R, C, 1e-6f);
        op_rope_forward(ry, ct + (size_t)pos0 * half, st + (size_t)pos0 * half, B, T, nh, hd);
        float *gy = gt_download(be, y1, n);
        gt_check("y against the cpu", gy, ry, n, FP32_TOL);
        op_rope_backward(rdy, ct + (size_t)pos0 * half, st + (size_t)pos0 * half, B, T, nh, hd);
        float *g_rstd = gt_download(be, buf_f32(r1), (size_t)R);   // the GPU's rstd, as the backward used
        op_rmsnorm_backward(rdy, c.frozen ? NULL : rdw, rdy, xr, w, g_rstd, R, C, false);
        float *gdx = malloc(n * sizeof(float));
        op_copy_2d(gdx, width, gj + col, ld, N, width);
        gt_check("dx against the cpu", gdx, rdy, n, FP32_TOL);
        float *gdw = gt_download(be, buf_f32(dw1), (size_t)C);
        gt_check("dw against the cpu", gdw, rdw, (size_t)C, 1e-4);
        free(xr), free(ry), free(rr), free(rdy), free(rdw), free(gy), free(g_rstd), free(gdx), free(gdw);
    }
    free(joined), free(w), free(dy), free(dw0), free(ct), free(st), free(gj);
    Buf bufs[] = {dj, y1, y2, xc1, xc2, dy1, dy2, dj1, dj2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(be, bufs[i]);
    void *ptrs[] = {dct, dst, dw_, r1, r2, dw1, dw2};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) backend_free(be, ptrs[i]);
}

static void test_qk_norm_rope(void **state) {
    (void)state;
    const NumType BF = NUM_BF16, F32 = NUM_F32, F16 = NUM_F16;
    const QkCase cases[] = {
        {BF, 2, 256, 12, 64, false, 3 * 768, 0, 0, .fuses = true},       // the 1B model's q
        {BF, 2, 33, 4, 64, false, 3 * 256, 256, 0, .fuses = true},       // k, at column qd
        {BF, 1, 17, 6, 128, true, 3 * 768, 768, 0, .fuses = true},       // per-head norm
        {BF, 2, 9, 8, 16, true, 3 * 128, 128, 0, .fuses = true},         // per head, hd 16: rows of two lanes
        {BF, 1, 5, 4, 256, true, 3 * 1024, 0, 0, .fuses = true},         // per head, hd 256: lanes l ^ 16
        {F32, 2, 5, 3, 32, false, 2 * 96 + 8, 96, 0, .fuses = true},     // C 96: lanes past the row
        {F32, 3, 7, 5, 16, false, 80, 0, 0, .fuses = true},              // hd 16: pairs on lanes l ^ 1
        {BF, 1, 9, 2, 256, false, 3 * 512, 512, 0, .fuses = true},       // hd 256: lanes l ^ 16
        {F32, 2, 6, 4, 64, true, 3 * 256, 0, 0, .fuses = true},          // per head, fp32
        {BF, 1, 1, 16, 64, false, 3 * 1024, 1024, 17, .fuses = true},    // decode: one position, tables offset
        {F16, 2, 16, 8, 128, false, 3 * 1024, 1024, 0, .fuses = true},   // fp16 (the fp16 AMP model)
        {F16, 2, 7, 4, 64, true, 3 * 256, 256, 0, .fuses = true},        // fp16, per head
        {BF, 2, 8, 4, 64, true, 3 * 256, 256, 0, .frozen = true, .fuses = true},     // frozen norm: no dw
        {F32, 2, 5, 6, 32, false, 3 * 192, 0, 0, .frozen = true, .fuses = true},     // frozen, fp32 (the cpu too)
        {F32, 2, 4, 2, 48, false, 3 * 96, 96, 0, .fuses = false},        // hd 48: the separate ops
        {BF, 2, 8, 4, 64, false, 3 * 256 + 3, 256, 0, .fuses = false},   // ld odd: the separate ops
        {BF, 2, 8, 4, 64, false, 3 * 256, 1, 0, .fuses = false},         // x one element off: the separate ops
        {BF, 2, 8, 4, 64, false, 3 * 256, 256, 0, .mixed = true, .fuses = false},    // fp32 joined, bf16 rest
        {F32, 2, 4, 2, 48, false, 3 * 96, 96, 0, .frozen = true, .fuses = false},    // frozen, separate ops
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_qk_norm_rope(NULL, cases[i]);

    // The switch, read when a backend opens: one opened with it takes the separate ops.
    (void)backend_for(NUM_BF16);   // skips without a GPU
    Backend *sep = NULL;
    setenv("SPES_CUDA_QK_NORM_ROPE", "separate", 1);
    int rc = backend_open("cuda", PRECISION_AMP_BF16, &sep);
    unsetenv("SPES_CUDA_QK_NORM_ROPE");
    if (rc != SPES_OK) fail_msg("backend_open(cuda): %s", spes_last_error());
    check_qk_norm_rope(sep, (QkCase){BF, 2, 33, 4, 64, false, 3 * 256, 256, 0, .fuses = false});
    check_qk_norm_rope(sep, (QkCase){BF, 2, 8, 4, 64, true, 3 * 256, 256, 0, .frozen = true, .fuses = false});
    backend_close(sep);
    // the switch is that backend's own: the test's backend (opened without it) still fuses
    check_qk_norm_rope(NULL, (QkCase){BF, 2, 33, 4, 64, false, 3 * 256, 256, 0, .fuses = true});
}

// ---- router ------------------------------------------------------------------------------------
// Logits: per token a random permutation of E well-separated values (no near-ties between the
// cpu's and the GPU's exp), or with `ties` values from {-1, 0, 1} (exact ties: equal logits give
// bit-equal probabilities on both sides, so the tie-breaking itself is compared).
static float *router_logits(int N, int E, bool ties, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    float *z = malloc((size_t)N * E * sizeof(float));
    int32_t *perm = malloc((size_t)E * sizeof(int32_t));
    assert_true(z && perm);
    for (int n = 0; n < N; n++) {
        random_distinct(&rng, perm, E, E);
        for (int e = 0; e < E; e++)
            z[(size_t)n * E + e] = ties ? (float)((int)rng_below(&rng, 3) - 1) : 4.0f * (float)perm[e] / (float)E - 2.0f;
    }
    free(perm);
    return z;
}

// One router forward on both sides: the cpu's outputs (p, lse, idx, w), the device buffers
// (logits dz; outputs dp, dl, di, dw) and the GPU's outputs read back (gp, gl, gi, gw).
typedef struct {
    float *p, *lse, *w, *gp, *gl, *gw;
    int32_t *idx, *gi;
    float *dz, *dp, *dl, *dw;
    int32_t *di;
} RouterRun;

static RouterRun router_run(Backend *be, const float *z, int N, int E, int k, bool normalize) {
    size_t ne = (size_t)N * E, nk = (size_t)N * k;
    RouterRun r;
    r.p = malloc(ne * sizeof(float)), r.lse = malloc((size_t)N * sizeof(float)), r.w = malloc(nk * sizeof(float));
    r.idx = malloc(nk * sizeof(int32_t));
    op_router_forward(r.p, r.lse, r.idx, r.w, z, N, E, k, normalize);
    r.dz = gt_upload(be, z, ne, NUM_F32).p;
    r.dp = gt_alloc(be, ne, NUM_F32).p, r.dl = gt_alloc(be, (size_t)N, NUM_F32).p, r.dw = gt_alloc(be, nk, NUM_F32).p;
    r.di = gt_alloc_bytes(be, nk * sizeof(int32_t));
    be->ops->router_forward(be, r.dp, r.dl, r.di, r.dw, r.dz, N, E, k, normalize);
    r.gp = gt_download(be, buf_f32(r.dp), ne), r.gl = gt_download(be, buf_f32(r.dl), (size_t)N);
    r.gw = gt_download(be, buf_f32(r.dw), nk);
    r.gi = download_ints(be, r.di, nk);
    return r;
}

static void router_run_free(Backend *be, RouterRun *r) {
    free(r->p), free(r->lse), free(r->w), free(r->idx), free(r->gp), free(r->gl), free(r->gw), free(r->gi);
    backend_free(be, r->dz), backend_free(be, r->dp), backend_free(be, r->dl), backend_free(be, r->dw);
    backend_free(be, r->di);
}

static void check_router(int N, int E, int k, bool normalize, bool ties, bool with_dprob) {
    printf("router N %d E %d k %d%s%s%s\n", N, E, k, normalize ? " normalize" : "", ties ? " ties" : "",
           with_dprob ? " dprob" : "");
    Backend *be = backend_for(NUM_F32);
    size_t ne = (size_t)N * E, nk = (size_t)N * k;
    float *z = router_logits(N, E, ties, 71);
    RouterRun r = router_run(be, z, N, E, k, normalize);
    gt_check("probs", r.gp, r.p, ne, FP32_TOL);
    gt_check("lse", r.gl, r.lse, (size_t)N, FP32_TOL);
    check_ints("topk_idx", r.gi, r.idx, nk);
    gt_check("topk_w", r.gw, r.w, nk, FP32_TOL);
    // backward on the cpu's forward outputs (so both sides see the same selection)
    float *dtw = gt_random(nk, 72, 1.0), *dprob = with_dprob ? gt_random((size_t)E, 73, 0.3) : NULL;
    float *rdz = malloc(ne * sizeof(float));
    op_router_backward(rdz, dtw, r.p, r.lse, r.idx, r.w, dprob, 0.01f, N, E, k, normalize);
    gt_upload_into(be, buf_f32(r.dp), r.p, ne), gt_upload_into(be, buf_f32(r.dl), r.lse, (size_t)N);
    gt_upload_into(be, buf_f32(r.dw), r.w, nk);
    assert_int_equal(be->ops->upload(be, r.di, r.idx, nk * sizeof(int32_t)), SPES_OK);
    float *ddtw = gt_upload(be, dtw, nk, NUM_F32).p;
    float *ddz = gt_alloc(be, ne, NUM_F32).p, *ddz2 = gt_alloc(be, ne, NUM_F32).p;
    be->ops->router_backward(be, ddz, ddtw, r.dp, r.dl, r.di, r.dw, dprob, 0.01f, N, E, k, normalize);
    be->ops->router_backward(be, ddz2, ddtw, r.dp, r.dl, r.di, r.dw, dprob, 0.01f, N, E, k, normalize);
    float *gdz = gt_download(be, buf_f32(ddz), ne);
    gt_check("dlogits", gdz, rdz, ne, FP32_TOL);
    gt_check_same_bits(be, "dlogits, run twice", ddz, ddz2, ne * sizeof(float));
    free(z), free(dtw), free(dprob), free(rdz), free(gdz);
    router_run_free(be, &r);
    backend_free(be, ddtw), backend_free(be, ddz), backend_free(be, ddz2);
}

// Rows with a NaN logit (an fp16 overflow upstream): the whole row's probabilities are NaN, and
// both sides pick the experts the cpu's loop picks (the lowest not yet taken: 0, 1, ..., k-1),
// never an id outside 0..E-1; the other rows as usual.
static void check_router_nan_rows(int N, int E, int k) {
    printf("router N %d E %d k %d, NaN rows\n", N, E, k);
    Backend *be = backend_for(NUM_F32);
    size_t nk = (size_t)N * k;
    float *z = router_logits(N, E, false, 74);
    for (int n = 1; n < N; n += 2) z[(size_t)n * E + (size_t)(n % E)] = NAN;
    RouterRun r = router_run(be, z, N, E, k, true);
    for (int j = 0; j < k; j++) assert_int_equal(r.idx[(size_t)1 * k + j], j);   // the cpu's rule, row 1
    check_ints("topk_idx with NaN rows", r.gi, r.idx, nk);
    for (size_t i = 0; i < nk; i++)
        if (isnan(r.w[i]) != isnan(r.gw[i])) fail_msg("topk_w [%zu]: got %g ref %g", i, r.gw[i], r.w[i]);
    free(z);
    router_run_free(be, &r);
}

static void test_router(void **state) {
    (void)state;
    check_router_nan_rows(9, 64, 8);
    check_router_nan_rows(9, 7, 7);                  // k = E
    check_router(1000, 64, 8, false, false, true);
    check_router(1000, 64, 8, true, false, true);
    check_router(37, 60, 1, true, false, false);     // E not a power of two, k = 1
    check_router(37, 7, 7, true, false, true);       // k = E, E < 32
    check_router(300, 16, 4, true, true, true);      // exact ties
    check_router(50, 300, 8, true, false, true);     // E > 256: dprob through device scratch
    check_router(1, 64, 2, false, true, false);
}

// ---- MoE dispatch ---------------------------------------------------------------------------------
// topk_idx [N,k]: distinct experts per token; skewed: slot 0 is expert 0 for every token.
static int32_t *random_topk(int N, int E, int k, bool skewed, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    int32_t *idx = malloc((size_t)N * k * sizeof(int32_t));
    assert_non_null(idx);
    for (int n = 0; n < N; n++) {
        int32_t *t = idx + (size_t)n * k;
        random_distinct(&rng, t, k, E);
        if (!skewed) continue;
        bool has0 = false;
        for (int j = 0; j < k; j++)
            if (t[j] == 0) t[j] = t[0], t[0] = 0, has0 = true;
        if (!has0) t[0] = 0;   // 0 was not among them: still distinct
    }
    return idx;
}

static void check_moe_plan(int N, int E, int k, bool skewed) {
    printf("moe_plan N %d E %d k %d%s\n", N, E, k, skewed ? " skewed" : "");
    Backend *be = backend_for(NUM_F32);
    size_t nk = (size_t)N * k;
    int32_t *idx = random_topk(N, E, k, skewed, 81);
    int32_t *off = malloc((size_t)(E + 1) * sizeof(int32_t)), *rt = malloc(nk * sizeof(int32_t)),
            *rs = malloc(nk * sizeof(int32_t));
    op_moe_plan(off, rt, rs, idx, N, E, k);
    int32_t *di = upload_ints(be, idx, nk);
    int32_t *doff = gt_alloc_bytes(be, (size_t)(E + 1) * sizeof(int32_t)), *drt = gt_alloc_bytes(be, nk * sizeof(int32_t)),
            *drs = gt_alloc_bytes(be, nk * sizeof(int32_t));
    be->ops->moe_plan(be, doff, drt, drs, di, N, E, k);
    int32_t *g = download_ints(be, doff, (size_t)E + 1);
    check_ints("offsets", g, off, (size_t)E + 1);
    free(g);
    g = download_ints(be, drt, nk);
    check_ints("row_token", g, rt, nk);
    free(g);
    g = download_ints(be, drs, nk);
    check_ints("row_of_slot", g, rs, nk);
    free(g);
    free(idx), free(off), free(rt), free(rs);
    backend_free(be, di), backend_free(be, doff), backend_free(be, drt), backend_free(be, drs);
}

static void test_moe_plan(void **state) {
    (void)state;
    check_moe_plan(1000, 64, 8, false);
    check_moe_plan(3000, 60, 8, true);    // 24000 slots: two 16384-slot tiles; expert 0 holds 3000 rows
    check_moe_plan(37, 6, 6, false);      // k = E
    check_moe_plan(100, 64, 1, false);    // k = 1, most experts empty
    check_moe_plan(1, 1, 1, false);
    check_moe_plan(5, 200, 2, false);     // more experts than slots
}

// A consistent dispatch for the data-movement ops: the cpu's plan.
typedef struct {
    int N, E, k;
    int32_t *idx, *off, *row_token, *row_of_slot;   // host
} Plan;

static Plan make_plan(int N, int E, int k) {
    Plan p = {N, E, k, random_topk(N, E, k, false, 91), NULL, NULL, NULL};
    size_t nk = (size_t)N * k;
    p.off = malloc((size_t)(E + 1) * sizeof(int32_t));
    p.row_token = malloc(nk * sizeof(int32_t));
    p.row_of_slot = malloc(nk * sizeof(int32_t));
    assert_true(p.off && p.row_token && p.row_of_slot);
    op_moe_plan(p.off, p.row_token, p.row_of_slot, p.idx, N, E, k);
    return p;
}
static void free_plan(Plan *p) { free(p->idx), free(p->off), free(p->row_token), free(p->row_of_slot); }

static void check_gather(NumType td, NumType ts, int N, int E, int k, int H) {
    printf("gather_rows %s <- %s N %d k %d H %d\n", num_type_name(td), num_type_name(ts), N, k, H);
    Backend *be = backend_for(td);
    Plan p = make_plan(N, E, k);
    size_t nk = (size_t)N * k;
    float *src = gt_random((size_t)N * H, 92, 1.0);
    gt_round_host(src, (size_t)N * H, ts);
    Buf ds = gt_upload(be, src, (size_t)N * H, ts), dd = gt_alloc(be, nk * H, td);
    int32_t *drows = upload_ints(be, p.row_token, nk);
    be->ops->gather_rows(be, dd, ds, drows, (int)nk, H);
    float *got = gt_download(be, dd, nk * H), *ref = malloc(nk * H * sizeof(float));
    op_gather_rows(ref, src, p.row_token, (int)nk, H);
    gt_round_host(ref, nk * H, td);
    gt_check("gathered rows", got, ref, nk * H, 0.0);
    free(got), free(ref), free(src), free_plan(&p);
    gt_free(be, ds), gt_free(be, dd), backend_free(be, drows);
}

static void test_gather_rows(void **state) {
    (void)state;
    check_gather(NUM_BF16, NUM_F32, 200, 16, 4, 256);   // fp32 residual -> bf16 expert inputs
    check_gather(NUM_F32, NUM_F32, 50, 8, 2, 36);       // scalar path
    check_gather(NUM_BF16, NUM_BF16, 1, 4, 4, 64);
}

// out (to) = resid + sum_j w y (ty), resid in place (out's old value) or in another buffer
// (RESID_APART: out's old value must then not count, and resid must be left as it was;
// RESID_APART_OFF: that buffer one element off alignment, the scalar path); with w == NULL the
// uncombine (dx += sum_j dxe).
typedef enum { RESID_IN_PLACE, RESID_APART, RESID_APART_OFF } ResidMode;
static void check_combine(NumType to, NumType ty, int N, int E, int k, int H, bool weighted, ResidMode mode) {
    printf("%s out %s y %s N %d k %d H %d%s\n", weighted ? "moe_combine" : "moe_uncombine_add", num_type_name(to),
           num_type_name(ty), N, k, H,
           mode == RESID_APART ? ", residual apart" : mode == RESID_APART_OFF ? ", residual apart, misaligned" : "");
    Backend *be = backend_for(ty);
    Plan p = make_plan(N, E, k);
    size_t nk = (size_t)N * k, no = (size_t)N * H;
    float *out = gt_random(no, 101, 1.0), *y = gt_random(nk * H, 102, 1.0), *w = gt_random_uniform(nk, 103, 0.0, 1.0);
    gt_round_host(out, no, to), gt_round_host(y, nk * H, ty);
    Buf dout = gt_upload(be, out, no, to), dy = gt_upload(be, y, nk * H, ty), dresid = dout, resid_mem = dout;
    if (mode != RESID_IN_PLACE) {   // the residual stays in its own buffer; out gets other numbers
        float *other = gt_random(no, 104, 1.0);
        gt_upload_into(be, dout, other, no);
        free(other);
        resid_mem = gt_alloc(be, no + 1, to);
        dresid = shifted(resid_mem, mode == RESID_APART_OFF);
        gt_upload_into(be, dresid, out, no);
    }
    float *dw = gt_upload(be, w, nk, NUM_F32).p;
    int32_t *drs = upload_ints(be, p.row_of_slot, nk);
    float *resid = gt_copy_floats(out, no);
    if (weighted) {
        be->ops->moe_combine(be, dout, dresid, dy, dw, drs, N, k, H);
        op_moe_combine(out, out, y, w, p.row_of_slot, N, k, H);
    } else {
        be->ops->moe_uncombine_add(be, dout, dy, drs, N, k, H);
        op_moe_uncombine_add(out, y, p.row_of_slot, N, k, H);
    }
    gt_round_host(out, no, to);
    float *got = gt_download(be, dout, no);
    // weighted: FMA contraction on the GPU (1e-5); unweighted: the cpu's fp32 adds in the same order (exact)
    gt_check("out", got, out, no, weighted ? stored_tol(to) : 0.0);
    if (mode != RESID_IN_PLACE) {
        float *r = gt_download(be, dresid, no);
        gt_check("residual unchanged", r, resid, no, 0.0);
        free(r);
    }
    free(got), free(out), free(y), free(w), free(resid), free_plan(&p);
    gt_free(be, dout), gt_free(be, dy), backend_free(be, dw), backend_free(be, drs);
    if (mode != RESID_IN_PLACE) gt_free(be, resid_mem);
}

static void test_combine(void **state) {
    (void)state;
    check_combine(NUM_F32, NUM_BF16, 300, 64, 8, 256, true, RESID_IN_PLACE);
    check_combine(NUM_F32, NUM_BF16, 300, 64, 8, 256, true, RESID_APART);      // the MoE block's call: x_out = x_mid + ...
    check_combine(NUM_F32, NUM_F32, 77, 10, 3, 100, true, RESID_APART);        // H % 8 != 0
    check_combine(NUM_F32, NUM_BF16, 300, 64, 8, 256, true, RESID_APART_OFF);  // resid misaligned: the scalar path
    check_combine(NUM_BF16, NUM_BF16, 20, 4, 4, 64, true, RESID_IN_PLACE);
    check_combine(NUM_BF16, NUM_BF16, 20, 4, 4, 64, true, RESID_APART);        // a bf16 output, resid apart
    check_combine(NUM_F32, NUM_BF16, 300, 64, 8, 256, false, RESID_IN_PLACE);
    check_combine(NUM_F32, NUM_F32, 1, 5, 1, 33, false, RESID_IN_PLACE);
}

static void check_combine_backward(NumType tdy, NumType td, NumType ty, int N, int E, int k, int H) {
    printf("moe_combine_backward dy %s dout %s y %s N %d k %d H %d\n", num_type_name(tdy), num_type_name(td),
           num_type_name(ty), N, k, H);
    Backend *be = backend_for(ty);
    Plan p = make_plan(N, E, k);
    size_t nk = (size_t)N * k, no = (size_t)N * H;
    float *dout = gt_random(no, 111, 1.0), *y = gt_random(nk * H, 112, 1.0), *w = gt_random_uniform(nk, 113, 0.0, 1.0);
    gt_round_host(dout, no, td), gt_round_host(y, nk * H, ty);
    Buf ddout = gt_upload(be, dout, no, td), dy_in = gt_upload(be, y, nk * H, ty);
    Buf ddy = gt_alloc(be, nk * H, tdy), ddy2 = gt_alloc(be, nk * H, tdy);
    float *dw = gt_upload(be, w, nk, NUM_F32).p, *ddw = gt_alloc(be, nk, NUM_F32).p, *ddw2 = gt_alloc(be, nk, NUM_F32).p;
    int32_t *drs = upload_ints(be, p.row_of_slot, nk);
    be->ops->moe_combine_backward(be, ddy, ddw, ddout, dy_in, dw, drs, N, k, H);
    be->ops->moe_combine_backward(be, ddy2, ddw2, ddout, dy_in, dw, drs, N, k, H);
    float *rdy = malloc(nk * H * sizeof(float)), *rdw = malloc(nk * sizeof(float));
    op_moe_combine_backward(rdy, rdw, dout, y, w, p.row_of_slot, N, k, H);
    gt_round_host(rdy, nk * H, tdy);
    float *gdy = gt_download(be, ddy, nk * H), *gdw = gt_download(be, buf_f32(ddw), nk);
    gt_check("dy", gdy, rdy, nk * H, 0.0);   // one fp32 product, one rounding: exact
    gt_check("dw", gdw, rdw, nk, FP32_TOL);
    gt_check_same_bits(be, "dw, run twice", ddw, ddw2, nk * sizeof(float));
    free(dout), free(y), free(w), free(rdy), free(rdw), free(gdy), free(gdw), free_plan(&p);
    gt_free(be, ddout), gt_free(be, dy_in), gt_free(be, ddy), gt_free(be, ddy2);
    backend_free(be, dw), backend_free(be, ddw), backend_free(be, ddw2), backend_free(be, drs);
}

static void test_combine_backward(void **state) {
    (void)state;
    check_combine_backward(NUM_BF16, NUM_F32, NUM_BF16, 300, 64, 8, 256);
    check_combine_backward(NUM_F32, NUM_F32, NUM_F32, 77, 10, 3, 100);   // scalar path
    check_combine_backward(NUM_BF16, NUM_BF16, NUM_BF16, 64, 8, 8, 2048);
    check_combine_backward(NUM_F32, NUM_F32, NUM_F32, 1, 3, 1, 8);
}

// ---- cross-entropy ----------------------------------------------------------------------------------
// Rows ld >= V apart, as the LM head's padded logits block: the padding columns are poisoned
// and must come back untouched (never read into a row's sums, never written).
static void check_cross_entropy(NumType t, int R, int V, int ld, bool grad) {
    printf("cross_entropy %s R %d V %d ld %d%s\n", num_type_name(t), R, V, ld, grad ? " grad" : "");
    Backend *be = backend_for(t);
    size_t n = (size_t)R * ld;
    float *logits = gt_random(n, 121, 3.0);
    for (int r = 0; r < R; r++)
        for (int v = V; v < ld; v++) logits[(size_t)r * ld + v] = 1e4f;   // would dominate any lse it got into
    gt_round_host(logits, n, t);
    int32_t *tg = gt_random_ints((size_t)R, 122, V);
    tg[0] = 0;                       // the first column
    if (R >= 2) tg[R - 1] = V - 1;   // the last column (the scalar tail / the last vector)
    int valid = 0;
    for (int r = 0; r < R; r++) {
        if (r % 5 == 1 && r != R - 1) tg[r] = IGNORE_INDEX;
        valid += tg[r] != IGNORE_INDEX;
    }
    const float ce_scale = 1.0f / (float)(valid ? valid : 1), z_scale = 1e-4f / (float)(valid ? valid : 1);
    Buf dl = gt_upload(be, logits, n, t), dl2 = gt_upload(be, logits, n, t);
    int32_t *dtg = upload_ints(be, tg, (size_t)R);
    float *dce = gt_alloc(be, (size_t)R, NUM_F32).p, *dlse = gt_alloc(be, (size_t)R, NUM_F32).p;
    float *dce2 = gt_alloc(be, (size_t)R, NUM_F32).p, *dlse2 = gt_alloc(be, (size_t)R, NUM_F32).p;
    be->ops->cross_entropy_rows(be, dl, ld, dce, dlse, dtg, R, V, ce_scale, z_scale, grad);
    be->ops->cross_entropy_rows(be, dl2, ld, dce2, dlse2, dtg, R, V, ce_scale, z_scale, grad);
    float *rce = malloc((size_t)R * sizeof(float)), *rlse = malloc((size_t)R * sizeof(float));
    float *ref = gt_copy_floats(logits, n);
    op_cross_entropy_rows(ref, ld, rce, rlse, tg, R, V, ce_scale, z_scale, grad);
    float *gce = gt_download(be, buf_f32(dce), (size_t)R), *glse = gt_download(be, buf_f32(dlse), (size_t)R);
    gt_check("ce", gce, rce, (size_t)R, FP32_TOL);
    gt_check("lse", glse, rlse, (size_t)R, FP32_TOL);
    gt_check_same_bits(be, "lse, run twice", dlse, dlse2, (size_t)R * sizeof(float));
    float *g = gt_download(be, dl, n);
    for (int r = 0; r < R; r++)
        for (int v = V; v < ld; v++)
            if (g[(size_t)r * ld + v] != logits[(size_t)r * ld + v]) fail_msg("padding of row %d written at %d", r, v);
    if (grad) {
        gt_check("dlogits", g, ref, n, stored_tol(t));
        for (int r = 0; r < R; r++)
            if (tg[r] == IGNORE_INDEX)
                for (int v = 0; v < V; v++)
                    if (g[(size_t)r * ld + v] != 0.0f) fail_msg("ignored row %d not zeroed at %d", r, v);
        gt_check_same_bits(be, "dlogits, run twice", dl.p, dl2.p, n * num_type_size(t));
    } else {
        gt_check("logits untouched", g, logits, n, 0.0);
    }
    free(logits), free(tg), free(rce), free(rlse), free(ref), free(gce), free(glse), free(g);
    gt_free(be, dl), gt_free(be, dl2), backend_free(be, dtg);
    backend_free(be, dce), backend_free(be, dlse), backend_free(be, dce2), backend_free(be, dlse2);
}

static void test_cross_entropy(void **state) {
    (void)state;
    check_cross_entropy(NUM_F32, 33, 50304, 50304, true);
    check_cross_entropy(NUM_BF16, 33, 50304, 50304, true);
    check_cross_entropy(NUM_F32, 12, 1001, 1001, true);    // ld % 8 != 0: scalar path
    check_cross_entropy(NUM_BF16, 7, 333, 333, false);
    check_cross_entropy(NUM_F32, 1, 5, 5, true);           // one row, fewer columns than threads
    check_cross_entropy(NUM_F32, 3, 8, 8, true);           // row 1 ignored
    // padded rows (the LM head's block): vector body + scalar tail of V % 8 columns
    check_cross_entropy(NUM_BF16, 9, 151665, 151680, true);   // the reference 1B vocabulary
    check_cross_entropy(NUM_F32, 6, 1001, 1024, true);
    check_cross_entropy(NUM_F16, 11, 3, 128, true);          // a tail only
    check_cross_entropy(NUM_BF16, 5, 1001, 1024, false);
}

// ---- speed (not a check) ----------------------------------------------------------------------
// Prints the device time of the row-wise and dispatch ops at the 1B model's shape (8 x 2048
// tokens, H 768, 12 heads of 64, 16 experts top-2, bf16 activations, fp32 residual) and the
// bandwidth of the bytes each must move, for the GPU speed work (docs/gpu_perf_notes.md: the
// bench's norms, attention, router and dispatch phases against their floors). Each op runs back
// to back ITERS times between two syncs, as in a step.
enum { SP_N = 8 * 2048, SP_H = 768, SP_B = 8, SP_T = 2048, SP_NH = 12, SP_HD = 64, SP_QKV = 3 * SP_H };
enum { SP_E = 16, SP_K = 2, SP_NK = SP_N * SP_K };
typedef struct {
    Buf resid, resid2, dresid, act, act2, dact, qkv, xe, y, dxe;
    float *w, *dw, *rstd, *cos_t, *sin_t;
    float *logits, *dlogits, *probs, *lse, *topk_w, *dtopk_w;
    int32_t *idx, *idx_out, *row_token, *row_of_slot, *plan_off, *plan_token, *plan_slot;
    float dprob[SP_E];
} SpeedBufs;
typedef enum {
    SP_NORM_FWD, SP_QKNORM_FWD, SP_NORM_BWD, SP_QKNORM_BWD, SP_ROPE_FWD, SP_ROPE_BWD, SP_QKV_SPLIT, SP_RESID_COPY,
    SP_QKNORM_ROPE_FWD, SP_QKNORM_ROPE_BWD,
    SP_ROUTER_FWD, SP_ROUTER_BWD, SP_MOE_PLAN, SP_GATHER, SP_COMBINE, SP_COMBINE_BWD, SP_UNCOMBINE, SP_OPS
} SpeedOp;
#define SP_NH_BYTES(b) ((double)(b) * SP_N * SP_H)   // b bytes per element of an [N, H] tensor
static const struct {
    const char *name;
    double bytes;   // that must move
} speed_ops[SP_OPS] = {
    [SP_NORM_FWD] = {"rmsnorm fwd, fp32 residual -> bf16", SP_NH_BYTES(4 + 2)},
    [SP_QKNORM_FWD] = {"rmsnorm fwd, QK-norm bf16 -> bf16", SP_NH_BYTES(2 + 2)},
    [SP_NORM_BWD] = {"rmsnorm bwd + dw, into the fp32 dresid", SP_NH_BYTES(2 + 4 + 4 + 4)},
    [SP_QKNORM_BWD] = {"rmsnorm bwd + dw, QK-norm bf16 in place", SP_NH_BYTES(2 + 2 + 2)},
    [SP_ROPE_FWD] = {"rope fwd, q bf16 in place", SP_NH_BYTES(2 + 2)},
    [SP_ROPE_BWD] = {"rope bwd, dq bf16 in place", SP_NH_BYTES(2 + 2)},
    [SP_QKV_SPLIT] = {"copy_2d, q out of the joined qkv (bf16)", SP_NH_BYTES(2 + 2)},
    [SP_RESID_COPY] = {"copy, the fp32 residual", SP_NH_BYTES(4 + 4)},
    // read q out of the joined qkv, write its copy and the result; read dy and x, write dx into the joined
    [SP_QKNORM_ROPE_FWD] = {"qk_norm_rope fwd, q out of the joined qkv", SP_NH_BYTES(2 + 2 + 2)},
    [SP_QKNORM_ROPE_BWD] = {"qk_norm_rope bwd + dw, dq into the joined", SP_NH_BYTES(2 + 2 + 2)},
    // logits and probs [N, E] fp32, lse [N], top-k index and weight [N, k]
    [SP_ROUTER_FWD] = {"router fwd (softmax, top-2 of 16)", 4.0 * SP_N * (2 * SP_E + 1 + 2 * SP_K)},
    [SP_ROUTER_BWD] = {"router bwd", 4.0 * SP_N * (2 * SP_E + 1 + 3 * SP_K)},
    [SP_MOE_PLAN] = {"moe_plan (group the 2N slots by expert)", 4.0 * SP_NK * 3},
    [SP_GATHER] = {"gather_rows, bf16 [2N, H]", SP_NH_BYTES(2 * SP_K + 2 * SP_K)},
    [SP_COMBINE] = {"moe_combine into the fp32 residual", SP_NH_BYTES(2 * SP_K + 4 + 4)},
    [SP_COMBINE_BWD] = {"moe_combine_backward (dy bf16, dw)", SP_NH_BYTES(4 + 2 * SP_K + 2 * SP_K)},
    [SP_UNCOMBINE] = {"moe_uncombine_add into bf16 dh", SP_NH_BYTES(2 * SP_K + 2 + 2)},
};

static void speed_run(Backend *be, SpeedBufs *s, SpeedOp op) {
    const BackendOps *o = be->ops;
    switch (op) {
    case SP_NORM_FWD: o->rmsnorm_forward(be, s->act, s->rstd, s->resid, s->w, SP_N, SP_H, 1e-5f); break;
    case SP_QKNORM_FWD: o->rmsnorm_forward(be, s->act2, s->rstd, s->act, s->w, SP_N, SP_H, 1e-5f); break;
    case SP_NORM_BWD:
        o->rmsnorm_backward(be, s->dresid, s->dw, s->dact, s->resid, s->w, s->rstd, SP_N, SP_H, true);
        break;
    case SP_QKNORM_BWD:
        o->rmsnorm_backward(be, s->dact, s->dw, s->dact, s->act, s->w, s->rstd, SP_N, SP_H, false);
        break;
    case SP_ROPE_FWD: o->rope_forward(be, s->act, s->cos_t, s->sin_t, SP_B, SP_T, SP_NH, SP_HD); break;
    case SP_ROPE_BWD: o->rope_backward(be, s->dact, s->cos_t, s->sin_t, SP_B, SP_T, SP_NH, SP_HD); break;
    case SP_QKV_SPLIT: o->copy_2d(be, s->act2, SP_H, s->qkv, SP_QKV, SP_N, SP_H); break;
    case SP_RESID_COPY: o->copy(be, s->resid2.p, s->resid.p, (size_t)SP_N * SP_H * sizeof(float)); break;
    case SP_QKNORM_ROPE_FWD:
        o->qk_norm_rope_forward(be, s->act2, s->dact, s->rstd, s->qkv, SP_QKV, s->w, s->cos_t, s->sin_t, SP_B, SP_T,
                                SP_NH, SP_HD, false, 1e-5f);
        break;
    case SP_QKNORM_ROPE_BWD:
        o->qk_norm_rope_backward(be, s->qkv, SP_QKV, s->dw, s->dact, s->act, s->w, s->rstd, s->cos_t, s->sin_t, SP_B,
                                 SP_T, SP_NH, SP_HD, false);
        break;
    case SP_ROUTER_FWD:
        o->router_forward(be, s->probs, s->lse, s->idx_out, s->topk_w, s->logits, SP_N, SP_E, SP_K, false);
        break;
    case SP_ROUTER_BWD:
        o->router_backward(be, s->dlogits, s->dtopk_w, s->probs, s->lse, s->idx, s->topk_w, s->dprob, 1e-3f, SP_N,
                           SP_E, SP_K, false);
        break;
    case SP_MOE_PLAN: o->moe_plan(be, s->plan_off, s->plan_token, s->plan_slot, s->idx, SP_N, SP_E, SP_K); break;
    case SP_GATHER: o->gather_rows(be, s->xe, s->act, s->row_token, SP_NK, SP_H); break;
    case SP_COMBINE: o->moe_combine(be, s->resid2, s->resid, s->y, s->topk_w, s->row_of_slot, SP_N, SP_K, SP_H); break;
    case SP_COMBINE_BWD:
        o->moe_combine_backward(be, s->dxe, s->dtopk_w, s->dresid, s->y, s->topk_w, s->row_of_slot, SP_N, SP_K, SP_H);
        break;
    case SP_UNCOMBINE: o->moe_uncombine_add(be, s->dact, s->dxe, s->row_of_slot, SP_N, SP_K, SP_H); break;
    case SP_OPS: break;
    }
}

static void test_rowwise_speed(void **state) {
    (void)state;
    if (getenv("SPES_GPU_MEMCHECK_PASS")) skip();   // time means nothing under the sanitizer
    enum { ITERS = 20 };
    Backend *be = backend_for(NUM_BF16);
    const size_t n = (size_t)SP_N * SP_H, nk = (size_t)SP_NK * SP_H, ne = (size_t)SP_N * SP_E;
    float *x = gt_random((size_t)SP_NK * SP_H, 5, 1.0), *tab = gt_random_uniform((size_t)SP_T * SP_HD, 6, -1, 1);
    float *wk = gt_random_uniform((size_t)SP_NK, 7, 0.0, 1.0);
    for (size_t i = 0; i < (size_t)SP_H; i++) x[i] = 1.0f + 0.1f * x[i];   // the weight: near 1
    Plan plan = make_plan(SP_N, SP_E, SP_K);
    SpeedBufs s = {
        .resid = gt_upload(be, x, n, NUM_F32), .resid2 = gt_alloc(be, n, NUM_F32), .dresid = gt_upload(be, x, n, NUM_F32),
        .act = gt_upload(be, x, n, NUM_BF16), .act2 = gt_alloc(be, n, NUM_BF16), .dact = gt_upload(be, x, n, NUM_BF16),
        .qkv = gt_upload(be, x, (size_t)SP_N * SP_QKV, NUM_BF16),
        .xe = gt_alloc(be, nk, NUM_BF16), .y = gt_upload(be, x, nk, NUM_BF16), .dxe = gt_alloc(be, nk, NUM_BF16),
        .w = gt_upload(be, x, SP_H, NUM_F32).p, .dw = gt_upload(be, x, SP_H, NUM_F32).p,
        .rstd = gt_alloc(be, SP_N, NUM_F32).p,
        .cos_t = gt_upload(be, tab, (size_t)SP_T * SP_HD / 2, NUM_F32).p,
        .sin_t = gt_upload(be, tab + (size_t)SP_T * SP_HD / 2, (size_t)SP_T * SP_HD / 2, NUM_F32).p,
        .logits = gt_upload(be, x, ne, NUM_F32).p, .dlogits = gt_alloc(be, ne, NUM_F32).p,
        .probs = gt_alloc(be, ne, NUM_F32).p, .lse = gt_alloc(be, SP_N, NUM_F32).p,
        .topk_w = gt_upload(be, wk, SP_NK, NUM_F32).p, .dtopk_w = gt_upload(be, wk, SP_NK, NUM_F32).p,
        .idx = upload_ints(be, plan.idx, SP_NK), .idx_out = gt_alloc_bytes(be, SP_NK * sizeof(int32_t)),
        .row_token = upload_ints(be, plan.row_token, SP_NK), .row_of_slot = upload_ints(be, plan.row_of_slot, SP_NK),
        .plan_off = gt_alloc_bytes(be, (SP_E + 1) * sizeof(int32_t)),
        .plan_token = gt_alloc_bytes(be, SP_NK * sizeof(int32_t)), .plan_slot = gt_alloc_bytes(be, SP_NK * sizeof(int32_t)),
    };
    for (int e = 0; e < SP_E; e++) s.dprob[e] = 1e-3f * (float)e;
    speed_run(be, &s, SP_NORM_FWD);     // rstd for the backward
    speed_run(be, &s, SP_ROUTER_FWD);   // probs and lse for the router's backward
    for (int op = 0; op < SP_OPS; op++) {
        double t = 0;
        uint64_t fused0[2], fused1[2];
        qk_fused_calls(be, &fused0[0], &fused0[1]);
        for (int pass = 0; pass < 2; pass++) {   // pass 0 warms up
            gt_sync_ok(be);
            double t0 = now_seconds();
            for (int it = 0; it < ITERS; it++) speed_run(be, &s, (SpeedOp)op);
            gt_sync_ok(be);
            t = (now_seconds() - t0) / ITERS;
        }
        printf("  N=%d H=%d %-42s %.4f ms (%.0f GB/s of %.1f MB)\n", SP_N, SP_H, speed_ops[op].name, 1e3 * t,
               speed_ops[op].bytes / t * 1e-9, speed_ops[op].bytes * 1e-6);
        // the qk_norm_rope rows time the fused kernels, never the separate ops under their name
        qk_fused_calls(be, &fused1[0], &fused1[1]);
        const int fwd = op == SP_QKNORM_ROPE_FWD, bwd = op == SP_QKNORM_ROPE_BWD;
        if (fused1[0] - fused0[0] != (uint64_t)(2 * ITERS * fwd) || fused1[1] - fused0[1] != (uint64_t)(2 * ITERS * bwd))
            fail_msg("%s: %llu fused forward and %llu fused backward launches in %d calls", speed_ops[op].name,
                     (unsigned long long)(fused1[0] - fused0[0]), (unsigned long long)(fused1[1] - fused0[1]),
                     2 * ITERS);
    }
    free(x), free(tab), free(wk), free_plan(&plan);
    Buf bufs[] = {s.resid, s.resid2, s.dresid, s.act, s.act2, s.dact, s.qkv, s.xe, s.y, s.dxe};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(be, bufs[i]);
    void *ptrs[] = {s.w,       s.dw,      s.rstd,      s.cos_t,     s.sin_t,    s.logits,
                    s.dlogits, s.probs,   s.lse,       s.topk_w,    s.dtopk_w,  s.idx,
                    s.idx_out, s.row_token, s.row_of_slot, s.plan_off, s.plan_token, s.plan_slot};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) backend_free(be, ptrs[i]);
}

int main(void) {
    // Each test picks the QK-norm path itself (test_qk_norm_rope opens a backend with the switch):
    // the backends shared by the tests open without it, whatever the caller's environment.
    unsetenv("SPES_CUDA_QK_NORM_ROPE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_entries),  cmocka_unit_test(test_add_inplace),
        cmocka_unit_test(test_copy_2d),        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm_forward), cmocka_unit_test(test_rmsnorm_backward),
        cmocka_unit_test(test_rope_tables),    cmocka_unit_test(test_rope),
        cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_router),         cmocka_unit_test(test_moe_plan),
        cmocka_unit_test(test_gather_rows),    cmocka_unit_test(test_combine),
        cmocka_unit_test(test_combine_backward), cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_rowwise_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
