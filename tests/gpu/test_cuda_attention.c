// CUDA causal GQA attention (src/ops/cuda/attention.cu) against the cpu kernels
// op_attention_forward / op_attention_backward (Tq == Tk) and op_attention_forward_kv
// (Tq < Tk, a KV cache). Both CUDA paths are covered: the tensor-core kernels (bf16/f16,
// hd 64/128, Tq >= 16) and the SIMT kernels (fp32, other head dims, decode, and forced with
// cuda_attention_force_simt for bf16 too). Shapes: GQA ratios 1, 2, 4 and MQA, T not a
// multiple of the 64-row tiles, B > 1, hd 64 and 128 (and 40, 256 on the SIMT path).
// Outputs are poisoned before every run; every run is repeated and must give the same bits.
//
// cuDNN (src/ops/cuda/cudnn_attention.cu). The bf16/f16 shapes run twice: on our kernels
// (cuda_attention_use_cudnn(false)) and on cuDNN's fused attention, against the same cpu
// reference and bounds; on the cuDNN path the output is also compared with our kernel's on
// the same inputs (within the sum of both bounds) and must repeat bit for bit (the backward
// is cuDNN's deterministic one). A shape cuDNN declines for a documented limit (a version
// rule, T = 1) runs our kernel and says so; a cuDNN call that fails (graph, plan, execute)
// fails the test with cuDNN's message. Without cuDNN the cuDNN cases are skipped, saying why.
// test_cudnn_absent re-runs this program with SPES_CUDNN_LIB=/nonexistent: our kernels run,
// nothing fails. test_cudnn_graph_descriptors needs no GPU: it builds every tensor and
// operation descriptor of the graphs and finalizes them (cuDNN checks their attributes then).
// test_bf16_speed prints ms and TFLOP/s of ours and cuDNN's at the 1B model's shape.
//
// Tolerances.
//  fp32: max|got-ref| / max|ref| <= 1e-5 for out and lse, 1e-4 for dq/dk/dv (as the cpu tiled
//    vs textbook test), plus, for dq and dk, the cancellation below.
//  Cancellation (every precision): dS_ij = P_ij (dP_ij - D_i) with dP_ij = dO_i.v_j and
//    D_i = dO_i.O_i, two fp32 dot products of hd terms that nearly cancel. Each side (the GPU
//    and the fp32 cpu reference) errs in dS by up to hd u32 P_ij (sum|dO v_j| + sum|dO O_i|),
//    carried into dq by |k_j| and into dk by |q_i|, whatever dS's own size. With one key
//    (T = 1) P = 1 and O = v, so dS is exactly 0: the GPU gave dq = 0 and the reference
//    -6.6e-7 (seen on an H200), which a bound relative to max|dq| alone rejected.
//  bf16/f16: inputs are rounded to the type before the cpu reference sees them, so the only
//    error sources are the roundings inside the GPU computation, each of relative size
//    <= u = 2^-p (bf16 2^-8, f16 2^-11; plus 2^-25 absolute for f16 subnormals):
//      out = sum_j P_ij v_j with P rounded: |err| <= u * sum_j P_ij |v_j| + u |out|  (store)
//      dV_j = sum_i P_ij dO_i:               |err| <= u * sum_i P_ij |dO_i| + u |dV|
//      dK_j = sum_i dS_ij q_i, dS rounded:   |err| <= u * sum_i |dS_ij| |q_i| + u |dK|
//      dQ_i = sum_j dS_ij k_j:               |err| <= u * sum_j |dS_ij| |k_j| + u |dQ|
//    These bounds, with the cancellation term, are computed per element on the host (double,
//    from the reference P and dS); each element must satisfy |got-ref| <= 1.5 * bound + fp32
//    slack (1e-5 * max|ref| for out, 1e-4 for gradients). lse involves no rounding to bf16:
//    2e-5 relative.
//    A masking bug (one key too many or too few) changes a row by about P_ij|v| ~ 1/(i+1),
//    far above u * sum_j P_ij|v_j| ~ u|v| for the early rows, so it fails.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/timer.h"
#include "gpu/gpu_test.h"
#include "ops/cuda/cuda_attention.h"
#include "ops/cuda/cudnn_attention.h"

extern char **environ;

typedef enum { PATH_OURS, PATH_CUDNN, PATH_SIMT } Path;
static const char *path_name(Path p) { return p == PATH_OURS ? "" : p == PATH_CUDNN ? " (cudnn)" : " (simt)"; }

// After a call meant for cuDNN: cuDNN ran it, or declined for a documented limit (printed),
// or failed (the test fails with its message).
static void expect_cudnn(bool backward, bool *ran) {
    const char *impl = cuda_attention_last_impl(backward);
    if (impl && strcmp(impl, "cudnn") == 0) {
        *ran = true;
        return;
    }
    bool failed = false;
    const char *why = cuda_cudnn_attention_last_fallback(backward, &failed);
    if (failed) fail_msg("cuDNN %s failed: %s", backward ? "backward" : "forward", why ? why : "?");
    printf("  cuDNN %s not used (%s): %s ran\n", backward ? "backward" : "forward", why ? why : "?",
           impl ? impl : "?");
    *ran = false;
}

typedef struct {
    int B, Tq, Tk, nh, nkv, hd;
} Shape;

// Per-element error bounds (see the header comment) for out, and for dq/dk/dv when Tq == Tk
// (u = 0 for fp32: then only the cancellation term). P and dS from the inputs in double, as
// the textbook reference.
static void attention_bounds(const Shape *s, const float *q, const float *k, const float *v, const float *dout,
                             const float *out, const float *lse, double u, double eta, double *b_out, double *b_dq,
                             double *b_dk, double *b_dv) {
    const int B = s->B, Tq = s->Tq, Tk = s->Tk, nh = s->nh, nkv = s->nkv, hd = s->hd, group = nh / nkv;
    const size_t nq = (size_t)B * Tq * nh * hd, nk = (size_t)B * Tk * nkv * hd;
    const double scale = 1.0 / sqrt((double)hd);
    for (size_t e = 0; e < nq; e++) b_out[e] = 0.0;
    if (b_dq)
        for (size_t e = 0; e < nq; e++) b_dq[e] = 0.0;
    if (b_dk)
        for (size_t e = 0; e < nk; e++) b_dk[e] = b_dv[e] = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < Tq; i++) {
                const size_t qi = (((size_t)b * Tq + i) * nh + h) * hd;
                const double li = lse[((size_t)b * nh + h) * Tq + i];
                double D = 0.0, D_abs = 0.0;
                if (b_dq)
                    for (int c = 0; c < hd; c++) {
                        D += (double)dout[qi + c] * out[qi + c];
                        D_abs += fabs((double)dout[qi + c] * out[qi + c]);
                    }
                for (int j = 0; j <= Tk - Tq + i; j++) {
                    const size_t kj = (((size_t)b * Tk + j) * nkv + h / group) * hd;
                    double sc = 0.0, dp = 0.0, dp_abs = 0.0;
                    for (int c = 0; c < hd; c++) {
                        sc += (double)q[qi + c] * k[kj + c];
                        dp += (double)dout[qi + c] * v[kj + c];
                        dp_abs += fabs((double)dout[qi + c] * v[kj + c]);
                    }
                    const double p = exp(sc * scale - li);
                    // rounding p costs u*p (+ eta absolute for f16 subnormals)
                    for (int c = 0; c < hd; c++) b_out[qi + c] += (u * p + eta) * fabs(v[kj + c]);
                    if (!b_dq) continue;
                    const double ds = fabs(p * (dp - D) * scale);
                    const double ds_cancel = 2.0 * hd * 0x1p-24 * p * (dp_abs + D_abs) * scale;   // both sides
                    for (int c = 0; c < hd; c++) {
                        b_dv[kj + c] += (u * p + eta) * fabs(dout[qi + c]);
                        b_dk[kj + c] += (u * ds + eta + ds_cancel) * fabs(q[qi + c]);
                        b_dq[qi + c] += (u * ds + eta + ds_cancel) * fabs(k[kj + c]);
                    }
                }
            }
}

// |got - ref| <= 1.5 * (bound + u|ref|) + slack * max|ref| for every element.
static void check_bounded(const char *what, const float *got, const float *ref, const double *bound, size_t n,
                          double u, double slack) {
    double mag = 1e-6;
    for (size_t e = 0; e < n; e++) mag = fmax(mag, fabs((double)ref[e]));
    double worst = 0.0;
    size_t we = 0;
    for (size_t e = 0; e < n; e++) {
        double d = fabs((double)got[e] - ref[e]);
        if (!isfinite(got[e])) d = INFINITY;
        const double allowed = 1.5 * (bound[e] + u * fabs((double)ref[e])) + slack * mag;
        const double ratio = d / allowed;
        if (!(ratio <= worst)) worst = ratio, we = e;
    }
    printf("  %-40s err/allowed %.3f (max|ref| %.3g)\n", what, worst, mag);
    if (!(worst <= 1.0))
        fail_msg("%s: element %zu got %.9g ref %.9g, allowed +-%.3g", what, we, got[we], ref[we],
                 1.5 * (bound[we] + u * fabs((double)ref[we])) + slack * mag);
}

static float *rounded_random(size_t n, uint64_t seed, NumType t) {
    float *x = gt_random(n, seed, 1.0);
    gt_round_host(x, n, t);
    return x;
}

// One shape in one precision: forward (and backward when Tq == Tk) against the cpu kernels,
// then a second run into freshly poisoned buffers must give the same bits.
static void check_attention(Precision prec, Shape s, Path path) {
    Backend *be = cuda_test_backend(prec);
    const NumType t = gt_compute_type(prec);
    const int B = s.B, Tq = s.Tq, Tk = s.Tk, nh = s.nh, nkv = s.nkv, hd = s.hd;
    const bool bwd = Tq == Tk;
    printf("attention %s%s B=%d Tq=%d Tk=%d nh=%d nkv=%d hd=%d\n", num_type_name(t), path_name(path), B, Tq, Tk, nh,
           nkv, hd);
    cuda_attention_force_simt(path == PATH_SIMT);
    cuda_attention_use_cudnn(path == PATH_CUDNN);
    bool cudnn_fwd = false, cudnn_bwd = false;
    const size_t nq = (size_t)B * Tq * nh * hd, nk = (size_t)B * Tk * nkv * hd, nl = (size_t)B * nh * Tq;
    float *q = rounded_random(nq, 101, t), *k = rounded_random(nk, 102, t), *v = rounded_random(nk, 103, t);
    float *dout = rounded_random(nq, 104, t);

    // cpu reference forward
    float *out_ref = malloc(nq * sizeof(float)), *lse_ref = malloc(nl * sizeof(float));
    assert_non_null(out_ref);
    assert_non_null(lse_ref);
    if (bwd) assert_int_equal(op_attention_forward(out_ref, lse_ref, q, k, v, B, Tq, nh, nkv, hd), SPES_OK);
    else assert_int_equal(op_attention_forward_kv(out_ref, lse_ref, q, k, v, B, Tq, Tk, nh, nkv, hd), SPES_OK);

    Buf d_q = gt_upload(be, q, nq, t), d_k = gt_upload(be, k, nk, t), d_v = gt_upload(be, v, nk, t);
    Buf d_out[2];
    float *d_lse[2];
    for (int run = 0; run < 2; run++) {
        d_out[run] = gt_alloc(be, nq, t);
        d_lse[run] = gt_alloc(be, nl, NUM_F32).p;
        be->ops->attention_forward(be, d_out[run], d_lse[run], d_q, d_k, d_v, B, Tq, Tk, nh, nkv, hd);
        if (path == PATH_CUDNN) expect_cudnn(false, &cudnn_fwd);
    }
    float *out = gt_download(be, d_out[0], nq), *lse = gt_download(be, buf_f32(d_lse[0]), nl);
    float *out_ours = NULL, *lse_ours = NULL;
    if (cudnn_fwd) {   // our kernel on the same inputs, for the comparison below
        cuda_attention_use_cudnn(false);
        Buf o2 = gt_alloc(be, nq, t);
        float *l2 = gt_alloc(be, nl, NUM_F32).p;
        be->ops->attention_forward(be, o2, l2, d_q, d_k, d_v, B, Tq, Tk, nh, nkv, hd);
        out_ours = gt_download(be, o2, nq), lse_ours = gt_download(be, buf_f32(l2), nl);
        gt_free(be, o2), backend_free(be, l2);
        cuda_attention_use_cudnn(true);
    }

    const double u = t == NUM_F32 ? 0.0 : gt_unit_roundoff(t), eta = t == NUM_F16 ? 0x1p-25 : 0.0;
    double *b_out = malloc(nq * sizeof(double)), *b_dq = NULL, *b_dk = NULL, *b_dv = NULL;
    assert_non_null(b_out);
    if (t == NUM_F32) {
        gt_check("out", out, out_ref, nq, 1e-5);
        gt_check("lse", lse, lse_ref, nl, 1e-5);
    }
    gt_check_same_bits(be, "out (two runs)", d_out[0].p, d_out[1].p, nq * num_type_size(t));
    gt_check_same_bits(be, "lse (two runs)", d_lse[0], d_lse[1], nl * sizeof(float));

    if (bwd) {
        // The backward sees the reference out (rounded to the type, as the model would store
        // it) and lse, so its error is its own.
        float *out_in = gt_copy_floats(out_ref, nq);
        gt_round_host(out_in, nq, t);
        float *dq_ref = malloc(nq * sizeof(float)), *dk_ref = malloc(nk * sizeof(float)),
              *dv_ref = malloc(nk * sizeof(float));
        assert_non_null(dq_ref);
        assert_non_null(dk_ref);
        assert_non_null(dv_ref);
        assert_int_equal(op_attention_backward(dq_ref, dk_ref, dv_ref, dout, out_in, lse_ref, q, k, v, B, Tq, nh, nkv,
                                               hd),
                         SPES_OK);
        Buf d_dout = gt_upload(be, dout, nq, t), d_outin = gt_upload(be, out_in, nq, t);
        float *d_lsein = gt_upload(be, lse_ref, nl, NUM_F32).p;
        Buf g_q[2], g_k[2], g_v[2];
        for (int run = 0; run < 2; run++) {
            g_q[run] = gt_alloc(be, nq, t), g_k[run] = gt_alloc(be, nk, t), g_v[run] = gt_alloc(be, nk, t);
            be->ops->attention_backward(be, g_q[run], g_k[run], g_v[run], d_dout, d_outin, d_lsein, d_q, d_k, d_v, B,
                                        Tq, nh, nkv, hd);
            if (path == PATH_CUDNN) expect_cudnn(true, &cudnn_bwd);
        }
        float *gq = gt_download(be, g_q[0], nq), *gk = gt_download(be, g_k[0], nk), *gv = gt_download(be, g_v[0], nk);
        b_dq = malloc(nq * sizeof(double)), b_dk = malloc(nk * sizeof(double)), b_dv = malloc(nk * sizeof(double));
        assert_non_null(b_dq);
        assert_non_null(b_dk);
        assert_non_null(b_dv);
        attention_bounds(&s, q, k, v, dout, out_in, lse_ref, u, eta, b_out, b_dq, b_dk, b_dv);
        check_bounded("dq", gq, dq_ref, b_dq, nq, u, 1e-4);
        check_bounded("dk", gk, dk_ref, b_dk, nk, u, 1e-4);
        check_bounded("dv", gv, dv_ref, b_dv, nk, u, 1e-4);
        if (cudnn_bwd) {   // cuDNN against our kernel on the same inputs: within both bounds
            cuda_attention_use_cudnn(false);
            Buf o_q = gt_alloc(be, nq, t), o_k = gt_alloc(be, nk, t), o_v = gt_alloc(be, nk, t);
            be->ops->attention_backward(be, o_q, o_k, o_v, d_dout, d_outin, d_lsein, d_q, d_k, d_v, B, Tq, nh, nkv, hd);
            float *oq = gt_download(be, o_q, nq), *ok = gt_download(be, o_k, nk), *ov = gt_download(be, o_v, nk);
            for (size_t e = 0; e < nq; e++) b_dq[e] *= 2.0;
            for (size_t e = 0; e < nk; e++) b_dk[e] *= 2.0, b_dv[e] *= 2.0;
            check_bounded("dq cudnn vs ours", gq, oq, b_dq, nq, 2.0 * u, 2e-4);
            check_bounded("dk cudnn vs ours", gk, ok, b_dk, nk, 2.0 * u, 2e-4);
            check_bounded("dv cudnn vs ours", gv, ov, b_dv, nk, 2.0 * u, 2e-4);
            gt_free(be, o_q), gt_free(be, o_k), gt_free(be, o_v);
            free(oq), free(ok), free(ov);
            cuda_attention_use_cudnn(true);
        }
        gt_check_same_bits(be, "dq (two runs)", g_q[0].p, g_q[1].p, nq * num_type_size(t));
        gt_check_same_bits(be, "dk (two runs)", g_k[0].p, g_k[1].p, nk * num_type_size(t));
        gt_check_same_bits(be, "dv (two runs)", g_v[0].p, g_v[1].p, nk * num_type_size(t));
        for (int run = 0; run < 2; run++) gt_free(be, g_q[run]), gt_free(be, g_k[run]), gt_free(be, g_v[run]);
        gt_free(be, d_dout), gt_free(be, d_outin), backend_free(be, d_lsein);
        free(out_in), free(dq_ref), free(dk_ref), free(dv_ref), free(gq), free(gk), free(gv);
    }
    if (t != NUM_F32) {
        if (!bwd) attention_bounds(&s, q, k, v, dout, out_ref, lse_ref, u, eta, b_out, NULL, NULL, NULL);
        check_bounded("out", out, out_ref, b_out, nq, u, 1e-5);
        gt_check("lse", lse, lse_ref, nl, 2e-5);
        if (out_ours) {
            for (size_t e = 0; e < nq; e++) b_out[e] *= 2.0;
            check_bounded("out cudnn vs ours", out, out_ours, b_out, nq, 2.0 * u, 2e-5);
            gt_check("lse cudnn vs ours", lse, lse_ours, nl, 4e-5);
        }
    }

    cuda_attention_force_simt(false);
    cuda_attention_use_cudnn(true);
    free(out_ours), free(lse_ours);
    for (int run = 0; run < 2; run++) gt_free(be, d_out[run]), backend_free(be, d_lse[run]);
    gt_free(be, d_q), gt_free(be, d_k), gt_free(be, d_v);
    free(q), free(k), free(v), free(dout), free(out_ref), free(lse_ref), free(out), free(lse);
    free(b_out), free(b_dq), free(b_dk), free(b_dv);
}

#define S(B, Tq, Tk, nh, nkv, hd) ((Shape){B, Tq, Tk, nh, nkv, hd})

// fp32: the SIMT kernels (tensor cores are not used for fp32 buffers).
static void test_fp32(void **state) {
    (void)state;
    check_attention(PRECISION_FP32, S(2, 17, 17, 4, 2, 64), PATH_OURS);     // GQA 2, B > 1
    check_attention(PRECISION_FP32, S(1, 100, 100, 4, 1, 128), PATH_OURS);  // MQA
    check_attention(PRECISION_FP32, S(2, 257, 257, 4, 4, 64), PATH_OURS);   // MHA, 5 tiles of 64, ragged
    check_attention(PRECISION_FP32, S(1, 1, 1, 2, 1, 64), PATH_OURS);       // a single token
    check_attention(PRECISION_FP32, S(1, 33, 33, 8, 2, 40), PATH_OURS);     // hd 40: generic, GQA 4
    check_attention(PRECISION_FP32, S(1, 40, 40, 2, 1, 256), PATH_OURS);    // hd 256: the largest
}

static void test_fp32_kv_cache(void **state) {
    (void)state;
    check_attention(PRECISION_FP32, S(2, 1, 300, 4, 2, 64), PATH_OURS);     // decode one token
    check_attention(PRECISION_FP32, S(1, 5, 300, 4, 1, 128), PATH_OURS);    // five tokens, MQA
}

// bf16: the tensor-core kernels wherever they apply.
static void test_bf16(void **state) {
    (void)state;
    check_attention(PRECISION_AMP_BF16, S(2, 100, 100, 4, 2, 64), PATH_OURS);   // GQA 2, B > 1, ragged
    check_attention(PRECISION_AMP_BF16, S(1, 257, 257, 4, 1, 128), PATH_OURS);  // MQA, 5 tiles
    check_attention(PRECISION_AMP_BF16, S(2, 17, 17, 2, 2, 128), PATH_OURS);    // MHA, one partial tile
    check_attention(PRECISION_AMP_BF16, S(3, 64, 64, 8, 2, 64), PATH_OURS);     // GQA 4, exactly one tile
    check_attention(PRECISION_AMP_BF16, S(1, 130, 130, 12, 12, 64), PATH_OURS); // 1B model's heads
    check_attention(PRECISION_AMP_BF16, S(1, 1, 1, 4, 2, 64), PATH_OURS);       // T = 1 (SIMT: Tq < 16)
    check_attention(PRECISION_AMP_BF16, S(1, 33, 33, 4, 2, 40), PATH_OURS);     // hd 40: SIMT
    check_attention(PRECISION_AMP_BF16, S(1, 2048, 2048, 2, 1, 64), PATH_OURS); // training length, 32 tiles
}

static void test_bf16_kv_cache(void **state) {
    (void)state;
    check_attention(PRECISION_AMP_BF16, S(2, 1, 300, 4, 2, 64), PATH_OURS);     // decode (SIMT)
    check_attention(PRECISION_AMP_BF16, S(1, 5, 300, 4, 1, 128), PATH_OURS);    // (SIMT)
    check_attention(PRECISION_AMP_BF16, S(1, 40, 300, 4, 2, 64), PATH_OURS);    // tensor cores, 260 past keys
    check_attention(PRECISION_AMP_BF16, S(2, 100, 300, 4, 1, 128), PATH_OURS);  // tensor cores, MQA
}

// bf16 through the SIMT kernels (the simple reference path) on the same shapes.
static void test_bf16_simt(void **state) {
    (void)state;
    check_attention(PRECISION_AMP_BF16, S(2, 100, 100, 4, 2, 64), PATH_SIMT);
    check_attention(PRECISION_AMP_BF16, S(1, 257, 257, 4, 1, 128), PATH_SIMT);
    check_attention(PRECISION_AMP_BF16, S(1, 40, 300, 4, 2, 64), PATH_SIMT);
}

static void test_f16(void **state) {
    (void)state;
    check_attention(PRECISION_AMP_FP16, S(2, 100, 100, 4, 2, 64), PATH_OURS);
    check_attention(PRECISION_AMP_FP16, S(1, 130, 130, 4, 4, 128), PATH_OURS);
}

// ---- cuDNN -------------------------------------------------------------------------------
static void require_cudnn(void) {
    const char *why = cuda_cudnn_load();
    if (why) {
        printf("cuDNN not available (%s): skipped\n", why);
        skip();
    }
    char d[800];
    cuda_cudnn_describe(d, sizeof d);
    printf("%s\n", d);
}

// bf16 through cuDNN's fused attention: GQA 1/2/4 and MQA, hd 64/128, B > 1, T a multiple of
// 128 (what cuDNN <= 9.15's backward needs) and not, shapes cuDNN declines (say so, run ours).
// Few shapes: each builds two cuDNN plans (runtime-compiled kernels, ~0.1-1 s each).
static void test_bf16_cudnn(void **state) {
    (void)state;
    cuda_test_backend(PRECISION_AMP_BF16);
    require_cudnn();
    check_attention(PRECISION_AMP_BF16, S(2, 256, 256, 4, 2, 64), PATH_CUDNN);    // GQA 2, B > 1
    check_attention(PRECISION_AMP_BF16, S(1, 384, 384, 4, 1, 128), PATH_CUDNN);   // MQA, hd 128
    check_attention(PRECISION_AMP_BF16, S(3, 128, 128, 8, 2, 64), PATH_CUDNN);    // GQA 4
    check_attention(PRECISION_AMP_BF16, S(1, 256, 256, 12, 12, 64), PATH_CUDNN);  // MHA, the 1B model's heads
    check_attention(PRECISION_AMP_BF16, S(2, 100, 100, 4, 2, 128), PATH_CUDNN);   // ragged T (backward: 9.16+)
    check_attention(PRECISION_AMP_BF16, S(1, 1, 1, 4, 2, 64), PATH_CUDNN);        // T = 1: declined
    check_attention(PRECISION_AMP_BF16, S(1, 33, 33, 4, 2, 40), PATH_CUDNN);      // hd 40: declined
    check_attention(PRECISION_AMP_BF16, S(1, 40, 300, 4, 2, 64), PATH_CUDNN);     // KV cache: ours
    check_attention(PRECISION_AMP_BF16, S(1, 2048, 2048, 2, 1, 64), PATH_CUDNN);  // training length
}

static void test_f16_cudnn(void **state) {
    (void)state;
    cuda_test_backend(PRECISION_AMP_FP16);
    require_cudnn();
    check_attention(PRECISION_AMP_FP16, S(2, 256, 256, 4, 2, 64), PATH_CUDNN);
    check_attention(PRECISION_AMP_FP16, S(1, 128, 128, 4, 4, 128), PATH_CUDNN);
    check_attention(PRECISION_AMP_FP16, S(2, 100, 100, 4, 2, 64), PATH_CUDNN);
}

// cuDNN's opt-in non-deterministic backward (SPES_CUDNN_NONDETERMINISTIC=1): same bounds; its
// two runs may differ in the last bits, so only the first is compared (check_attention's
// same-bits check would fail it): here one shape, checked against the cpu by hand.
static void test_bf16_cudnn_nondeterministic(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    require_cudnn();
    cuda_cudnn_attention_set_deterministic(false);
    const Shape s = S(2, 256, 256, 4, 2, 64);
    const int B = s.B, T = s.Tq, nh = s.nh, nkv = s.nkv, hd = s.hd;
    const NumType t = NUM_BF16;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    float *q = rounded_random(nq, 201, t), *k = rounded_random(nk, 202, t), *v = rounded_random(nk, 203, t);
    float *dout = rounded_random(nq, 204, t);
    float *out_ref = malloc(nq * sizeof(float)), *lse_ref = malloc(nl * sizeof(float));
    float *dq_ref = malloc(nq * sizeof(float)), *dk_ref = malloc(nk * sizeof(float)), *dv_ref = malloc(nk * sizeof(float));
    assert_true(out_ref && lse_ref && dq_ref && dk_ref && dv_ref);
    assert_int_equal(op_attention_forward(out_ref, lse_ref, q, k, v, B, T, nh, nkv, hd), SPES_OK);
    gt_round_host(out_ref, nq, t);
    assert_int_equal(op_attention_backward(dq_ref, dk_ref, dv_ref, dout, out_ref, lse_ref, q, k, v, B, T, nh, nkv, hd),
                     SPES_OK);
    Buf d_q = gt_upload(be, q, nq, t), d_k = gt_upload(be, k, nk, t), d_v = gt_upload(be, v, nk, t);
    Buf d_dout = gt_upload(be, dout, nq, t), d_out = gt_upload(be, out_ref, nq, t);
    float *d_lse = gt_upload(be, lse_ref, nl, NUM_F32).p;
    Buf g_q = gt_alloc(be, nq, t), g_k = gt_alloc(be, nk, t), g_v = gt_alloc(be, nk, t);
    cuda_attention_use_cudnn(true);
    be->ops->attention_backward(be, g_q, g_k, g_v, d_dout, d_out, d_lse, d_q, d_k, d_v, B, T, nh, nkv, hd);
    bool ran = false;
    expect_cudnn(true, &ran);
    gt_sync_ok(be);
    float *gq = gt_download(be, g_q, nq), *gk = gt_download(be, g_k, nk), *gv = gt_download(be, g_v, nk);
    double *b_out = malloc(nq * sizeof(double)), *b_dq = malloc(nq * sizeof(double)),
           *b_dk = malloc(nk * sizeof(double)), *b_dv = malloc(nk * sizeof(double));
    assert_true(b_out && b_dq && b_dk && b_dv);
    const double u = gt_unit_roundoff(t);
    attention_bounds(&s, q, k, v, dout, out_ref, lse_ref, u, 0.0, b_out, b_dq, b_dk, b_dv);
    // fp32 atomics change the summation order of dq: a few fp32 roundings more, in the slack
    check_bounded("dq (non-deterministic)", gq, dq_ref, b_dq, nq, u, 2e-4);
    check_bounded("dk (non-deterministic)", gk, dk_ref, b_dk, nk, u, 1e-4);
    check_bounded("dv (non-deterministic)", gv, dv_ref, b_dv, nk, u, 1e-4);
    cuda_cudnn_attention_set_deterministic(true);
    gt_free(be, d_q), gt_free(be, d_k), gt_free(be, d_v), gt_free(be, d_dout), gt_free(be, d_out);
    gt_free(be, g_q), gt_free(be, g_k), gt_free(be, g_v), backend_free(be, d_lse);
    free(q), free(k), free(v), free(dout), free(out_ref), free(lse_ref), free(dq_ref), free(dk_ref), free(dv_ref);
    free(gq), free(gk), free(gv), free(b_out), free(b_dq), free(b_dk), free(b_dv);
}

// No GPU needed: every tensor and operation descriptor of the forward and backward graphs is
// built and finalized by the cuDNN library (which checks each attribute's type, count and
// value then). The operation graph itself needs a handle, hence a GPU: the GPU tests do that.
static void test_cudnn_graph_descriptors(void **state) {
    (void)state;
    require_cudnn();
    const Shape shapes[] = {S(2, 256, 256, 4, 2, 64), S(1, 384, 384, 4, 4, 128), S(8, 2048, 2048, 12, 12, 64)};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int dir = 0; dir < 2; dir++)
            for (int f16 = 0; f16 < 2; f16++)
                for (int det = 1; det >= (dir ? 0 : 1); det--)
                    for (int style = 0; style < 2; style++) {
                        const Shape s = shapes[i];
                        char msg[1200];
                        const bool ok = cuda_cudnn_check_graph(dir == 1, s.B, s.Tq, s.nh, s.nkv, s.hd, f16, det,
                                                               style, msg, sizeof msg);
                        printf("  %s %s B=%d T=%d nh=%d nkv=%d hd=%d%s, graph form %d: %s\n",
                               dir ? "backward" : "forward", f16 ? "f16" : "bf16", s.B, s.Tq, s.nh, s.nkv, s.hd,
                               dir ? (det ? " deterministic" : " non-deterministic") : "", style, msg);
                        if (!ok) fail_msg("cuDNN refused a descriptor: %s", msg);
                    }
}

// Without cuDNN (SPES_CUDNN_LIB=/nonexistent) our kernels run and nothing fails. The loader
// decides once per process, so this runs the program again (argument --cudnn-absent) with
// that variable; its output is shown indented, with cmocka's brackets changed so the test
// runner does not count the child's summary as this program's.
static void test_cudnn_absent(void **state) {
    (void)state;
    cuda_test_backend(PRECISION_AMP_BF16);   // skips without a GPU
    // Under compute-sanitizer the child would inherit its injection variables: not there.
    if (getenv("SPES_GPU_MEMCHECK_PASS")) skip();
    char out_path[64];
    snprintf(out_path, sizeof out_path, "/tmp/spes_cudnn_absent.%d.log", (int)getpid());
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **env = calloc(n_env + 2, sizeof *env);
    assert_non_null(env);
    size_t m = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "SPES_CUDNN_LIB=", 15) != 0) env[m++] = environ[i];
    env[m++] = (char *)"SPES_CUDNN_LIB=/nonexistent";
    env[m] = NULL;
    char *argv[] = {(char *)"/proc/self/exe", (char *)"--cudnn-absent", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    assert_int_equal(rc, 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    FILE *f = fopen(out_path, "r");
    if (f) {
        char line[2000];
        while (fgets(line, sizeof line, f)) {
            for (char *c = line; *c; c++)
                if (*c == '[') *c = '(';
                else if (*c == ']') *c = ')';
            printf("  | %s", line);
        }
        fclose(f);
    }
    unlink(out_path);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the run with SPES_CUDNN_LIB=/nonexistent failed (status %d): see its output above", status);
}

// The child of test_cudnn_absent.
static void test_cudnn_absent_child(void **state) {
    (void)state;
    const char *why = cuda_cudnn_load();
    assert_non_null(why);
    printf("cuDNN: %s\n", why);
    assert_non_null(strstr(why, "not found"));
    check_attention(PRECISION_AMP_BF16, S(2, 256, 256, 4, 2, 64), PATH_CUDNN);   // falls back, passes
    assert_string_equal(cuda_attention_last_impl(false), "tensor-core");
    assert_string_equal(cuda_attention_last_impl(true), "tensor-core");
    bool failed = true;
    assert_non_null(cuda_cudnn_attention_last_fallback(false, &failed));
    assert_false(failed);
}

// A head dim the kernels do not support is a recorded failure that names it, not a crash.
static void test_unsupported_head_dim(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    const int hd = 12, n = 4 * 2 * hd;
    Buf q = gt_alloc(be, n, NUM_BF16), k = gt_alloc(be, n, NUM_BF16), v = gt_alloc(be, n, NUM_BF16);
    Buf out = gt_alloc(be, n, NUM_BF16);
    float *lse = gt_alloc(be, 8, NUM_F32).p;
    be->ops->attention_forward(be, out, lse, q, k, v, 1, 4, 4, 2, 2, hd);
    assert_int_not_equal(backend_sync(be), SPES_OK);
    printf("  expected failure: %s\n", spes_last_error());
    assert_non_null(strstr(spes_last_error(), "head dim 12"));
    gt_sync_ok(be);   // reported once; the backend goes on
    gt_free(be, q), gt_free(be, k), gt_free(be, v), gt_free(be, out), backend_free(be, lse);
}

// Not a check: prints the speed of the tensor-core kernels at the 1B model's shape (hd 64,
// 12 heads, T 2048) and at hd 128, for the first runs on a GPU. Causal FLOPs: forward
// 2 matmuls of B*nh*T*T/2*hd multiply-adds each = 2*B*nh*T*T*hd; backward 5 matmuls (2.5x).
static void test_bf16_speed(void **state) {
    (void)state;
    // Under compute-sanitizer (tests/run_gpu.sh's memcheck pass) these sizes take minutes and
    // time means nothing.
    if (getenv("SPES_GPU_MEMCHECK_PASS")) skip();
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    const Shape shapes[] = {S(8, 2048, 2048, 12, 12, 64), S(4, 2048, 2048, 16, 4, 128)};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const Shape s = shapes[si];
        const size_t nq = (size_t)s.B * s.Tq * s.nh * s.hd, nk = (size_t)s.B * s.Tk * s.nkv * s.hd;
        const size_t nl = (size_t)s.B * s.nh * s.Tq;
        float *x = gt_random(nq + 1, 7, 1.0);   // v reads x + 1
        Buf q = gt_upload(be, x, nq, NUM_BF16), k = gt_upload(be, x, nk, NUM_BF16), v = gt_upload(be, x + 1, nk, NUM_BF16);
        Buf dout = gt_upload(be, x, nq, NUM_BF16), out = gt_alloc(be, nq, NUM_BF16);
        Buf dq = gt_alloc(be, nq, NUM_BF16), dk = gt_alloc(be, nk, NUM_BF16), dv = gt_alloc(be, nk, NUM_BF16);
        float *lse = gt_alloc(be, nl, NUM_F32).p;
        const double flops_fwd = 2.0 * s.B * s.nh * (double)s.Tq * s.Tq * s.hd;
        const int iters = 10;
        // ours; cuDNN deterministic (the default); cuDNN non-deterministic (opt-in)
        const char *names[3] = {"ours", "cudnn", "cudnn non-deterministic"};
        for (int impl = 0; impl < 3; impl++) {
            if (impl > 0 && cuda_cudnn_load() != NULL) {
                printf("  %s: skipped (%s)\n", names[impl], cuda_cudnn_load());
                continue;
            }
            cuda_attention_use_cudnn(impl > 0);
            cuda_cudnn_attention_set_deterministic(impl != 2);
            double t_fwd = 0, t_bwd = 0;
            for (int pass = 0; pass < 2; pass++) {   // pass 0 warms up (and builds cuDNN's plans)
                gt_sync_ok(be);
                double t0 = now_seconds();
                for (int it = 0; it < iters; it++)
                    be->ops->attention_forward(be, out, lse, q, k, v, s.B, s.Tq, s.Tk, s.nh, s.nkv, s.hd);
                gt_sync_ok(be);
                double t1 = now_seconds();
                for (int it = 0; it < iters; it++)
                    be->ops->attention_backward(be, dq, dk, dv, dout, out, lse, q, k, v, s.B, s.Tq, s.nh, s.nkv,
                                                s.hd);
                gt_sync_ok(be);
                t_fwd = (t1 - t0) / iters, t_bwd = (now_seconds() - t1) / iters;
            }
            const char *fi = cuda_attention_last_impl(false), *bi = cuda_attention_last_impl(true);
            // Repeatability at this size (where atomics would show): one more backward into
            // fresh buffers must give the same bits as the last timed one.
            Buf dq2 = gt_alloc(be, nq, NUM_BF16), dk2 = gt_alloc(be, nk, NUM_BF16), dv2 = gt_alloc(be, nk, NUM_BF16);
            be->ops->attention_backward(be, dq2, dk2, dv2, dout, out, lse, q, k, v, s.B, s.Tq, s.nh, s.nkv, s.hd);
            gt_sync_ok(be);
            bool same = true;
            const Buf pairs[3][2] = {{dq, dq2}, {dk, dk2}, {dv, dv2}};
            const size_t sizes[3] = {nq, nk, nk};
            for (int i = 0; i < 3; i++) {
                void *a = gt_download_bytes(be, pairs[i][0].p, sizes[i] * 2);
                void *b2 = gt_download_bytes(be, pairs[i][1].p, sizes[i] * 2);
                same = same && memcmp(a, b2, sizes[i] * 2) == 0;
                free(a), free(b2);
            }
            gt_free(be, dq2), gt_free(be, dk2), gt_free(be, dv2);
            printf("  %-24s B=%d T=%d nh=%d nkv=%d hd=%d: forward %.3f ms (%.0f TFLOP/s, %s), backward %.3f ms "
                   "(%.0f TFLOP/s, %s)\n",
                   names[impl], s.B, s.Tq, s.nh, s.nkv, s.hd, 1e3 * t_fwd, flops_fwd / t_fwd * 1e-12, fi ? fi : "?",
                   1e3 * t_bwd, 2.5 * flops_fwd / t_bwd * 1e-12, bi ? bi : "?");
            printf("  %-24s backward repeated: %s\n", "", same ? "same bits" : "DIFFERENT bits");
            if (impl != 2 && !same) fail_msg("%s: the backward is not reproducible at this shape", names[impl]);
        }
        cuda_attention_use_cudnn(true);
        cuda_cudnn_attention_set_deterministic(true);
        free(x);
        gt_free(be, q), gt_free(be, k), gt_free(be, v), gt_free(be, dout), gt_free(be, out);
        gt_free(be, dq), gt_free(be, dk), gt_free(be, dv), backend_free(be, lse);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--cudnn-absent") == 0) {
        const struct CMUnitTest child[] = {cmocka_unit_test(test_cudnn_absent_child)};
        return cmocka_run_group_tests(child, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32),
        cmocka_unit_test(test_fp32_kv_cache),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_bf16_kv_cache),
        cmocka_unit_test(test_bf16_simt),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_cudnn_graph_descriptors),
        cmocka_unit_test(test_bf16_cudnn),
        cmocka_unit_test(test_f16_cudnn),
        cmocka_unit_test(test_bf16_cudnn_nondeterministic),
        cmocka_unit_test(test_cudnn_absent),
        cmocka_unit_test(test_unsupported_head_dim),
        cmocka_unit_test(test_bf16_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
