// The cpu backend: the kernels of cpu_ops.h behind the table of ops/backend.h. Memory is
// plain (64-byte aligned) host memory, every Buf is fp32, and ops run synchronously, so
// upload/download are memcpy (nothing when source and destination are the same pointer).
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/threads.h"
#include "ops/cpu/cpu_ops.h"

// The first failure of an op since the last sync (a scratch allocation, a non-fp32 Buf).
static _Thread_local char failure[512];

static void fail_once(const char *what) {
    if (!failure[0]) snprintf(failure, sizeof failure, "%s (%s)", what, spes_last_error());
}

// Every Buf here is fp32: the cpu backend's compute type. Anything else is a caller's bug.
static float *f32(Buf b) {
    if (b.t != NUM_F32) fail_once("cpu backend: a non-fp32 buffer was passed to an op");
    return (float *)b.p;
}

// Backend memory is counted (in use, peak since the process started: the cpu backend is never
// closed), as the cuda backend counts its own, so a plan's peak (src/train/plan.h) can be checked
// against the allocations on any machine. Each block carries its size in a 64-byte header (the
// blocks stay 64-byte aligned). host_alloc is host staging, not counted, as on cuda.
#define TRACK_HEADER 64
static _Atomic size_t mem_in_use, mem_peak;

static int cpu_alloc(Backend *be, size_t bytes, void **out) {
    size_t counted = bytes ? bytes : 1;
    char *base = counted + TRACK_HEADER > counted ? spes_alloc_aligned(counted + TRACK_HEADER) : NULL;
    *out = NULL;
    if (!base) return spes_fail_context("%zu bytes of host memory", bytes);
    *(size_t *)base = counted;
    size_t now = (mem_in_use += counted), peak = mem_peak;
    while (now > peak && !atomic_compare_exchange_weak(&mem_peak, &peak, now)) {
    }
    *out = base + TRACK_HEADER;
    return SPES_OK;
}
static void cpu_free(Backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - TRACK_HEADER;
    mem_in_use -= *(size_t *)base;
    spes_free_aligned(base);
}
static int cpu_host_alloc(Backend *be, size_t bytes, void **out) {
    *out = spes_alloc_aligned(bytes ? bytes : 1);
    return *out ? SPES_OK : spes_fail_context("%zu bytes of host memory", bytes);
}
static void cpu_host_free(Backend *be, void *p) { spes_free_aligned(p); }
static int cpu_upload(Backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memcpy(dst, src, bytes);
    return SPES_OK;
}
static void cpu_copy(Backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}
static void cpu_zero(Backend *be, void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}
static void cpu_convert(Backend *be, Buf dst, Buf src, size_t n) {
    float *d = f32(dst);
    const float *s = f32(src);
    if (d != s && n) memcpy(d, s, n * sizeof(float));
}
static int cpu_sync(Backend *be) {
    if (!failure[0]) return SPES_OK;
    int rc = spes_fail("%s", failure);
    failure[0] = '\0';
    return rc;
}
static void cpu_memory(Backend *be, size_t *in_use, size_t *peak) {
    if (in_use) *in_use = mem_in_use;
    if (peak) *peak = mem_peak;
}
static void cpu_close(Backend *be) {}

static void cpu_gemm(Backend *be, bool ta, bool tb, int M, int N, int K, float alpha, Buf A, int lda, Buf B, int ldb,
                     float beta, Buf C, int ldc) {
    op_gemm(ta, tb, M, N, K, alpha, f32(A), lda, f32(B), ldb, beta, f32(C), ldc);
}
static void cpu_gemm_residual(Backend *be, bool ta, bool tb, int M, int N, int K, float alpha, Buf A, int lda, Buf B,
                              int ldb, Buf R, Buf D, int ldd) {
    if (R.p != D.p) op_copy_2d(f32(D), ldd, f32(R), ldd, M, N);
    op_gemm(ta, tb, M, N, K, alpha, f32(A), lda, f32(B), ldb, 1.0f, f32(D), ldd);
}
static void cpu_experts_forward(Backend *be, const ExpertsArgs *a) { op_experts_forward(a); }
static void cpu_experts_backward(Backend *be, const ExpertsArgs *a) { op_experts_backward(a); }
static void cpu_add_inplace(Backend *be, Buf y, Buf x, size_t n) { op_add_inplace(f32(y), f32(x), n); }
static void cpu_copy_2d(Backend *be, Buf dst, int ds, Buf src, int ss, int rows, int cols) {
    op_copy_2d(f32(dst), ds, f32(src), ss, rows, cols);
}
static void cpu_embedding_forward(Backend *be, Buf out, const float *table, const int32_t *tokens, int N, int H) {
    op_embedding_forward(f32(out), table, tokens, N, H);
}
static void cpu_embedding_backward(Backend *be, float *dtable, Buf dout, const int32_t *tokens, int N, int H) {
    op_embedding_backward(dtable, f32(dout), tokens, N, H);
}
static void cpu_rmsnorm_forward(Backend *be, Buf y, float *rstd, Buf x, const float *w, int R, int C, float eps) {
    op_rmsnorm_forward(f32(y), rstd, f32(x), w, R, C, eps);
}
static void cpu_rmsnorm_backward(Backend *be, Buf dx, float *dw, Buf dy, Buf x, const float *w, const float *rstd,
                                 int R, int C, bool accumulate) {
    op_rmsnorm_backward(f32(dx), dw, f32(dy), f32(x), w, rstd, R, C, accumulate);
}
static void cpu_rope_tables(Backend *be, float *c, float *s, int T, int hd, float theta) {
    op_rope_tables(c, s, T, hd, theta);
}
static void cpu_rope_forward(Backend *be, Buf x, const float *c, const float *s, int B, int T, int nh, int hd) {
    op_rope_forward(f32(x), c, s, B, T, nh, hd);
}
static void cpu_rope_backward(Backend *be, Buf dx, const float *c, const float *s, int B, int T, int nh, int hd) {
    op_rope_backward(f32(dx), c, s, B, T, nh, hd);
}
// The cpu's QK-norm + RoPE is the three ops one after another (the reference of the fused kernels).
static void cpu_qk_norm_rope_forward(Backend *be, Buf y, Buf x_copy, float *rstd, Buf x, int ldx, const float *w,
                                     const float *c, const float *s, int B, int T, int nh, int hd, bool per_head,
                                     float eps) {
    const int N = B * T, width = nh * hd;
    const QkNormRows r = qk_norm_rows(B, T, nh, hd, per_head);
    op_copy_2d(f32(x_copy), width, f32(x), ldx, N, width);
    op_rmsnorm_forward(f32(y), rstd, f32(x_copy), w, r.rows, r.width, eps);
    op_rope_forward(f32(y), c, s, B, T, nh, hd);
}
static void cpu_qk_norm_rope_backward(Backend *be, Buf dx, int lddx, float *dw, Buf dy, Buf x, const float *w,
                                      const float *rstd, const float *c, const float *s, int B, int T, int nh, int hd,
                                      bool per_head) {
    const int N = B * T, width = nh * hd;
    const QkNormRows r = qk_norm_rows(B, T, nh, hd, per_head);
    op_rope_backward(f32(dy), c, s, B, T, nh, hd);
    op_rmsnorm_backward(f32(dy), dw, f32(dy), f32(x), w, rstd, r.rows, r.width, false);
    op_copy_2d(f32(dx), lddx, f32(dy), width, N, width);
}
static void cpu_attention_forward(Backend *be, Buf out, float *lse, Buf q, Buf k, Buf v, int B, int Tq, int Tk,
                                  int nh, int nkv, int hd) {
    int rc = Tq == Tk ? op_attention_forward(f32(out), lse, f32(q), f32(k), f32(v), B, Tq, nh, nkv, hd)
                      : op_attention_forward_kv(f32(out), lse, f32(q), f32(k), f32(v), B, Tq, Tk, nh, nkv, hd);
    if (rc != SPES_OK) fail_once("attention forward");
}
static void cpu_attention_backward(Backend *be, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, const float *lse, Buf q,
                                   Buf k, Buf v, int B, int T, int nh, int nkv, int hd) {
    if (op_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(out), lse, f32(q), f32(k), f32(v), B, T, nh,
                              nkv, hd) != SPES_OK)
        fail_once("attention backward");
}
static void cpu_router_forward(Backend *be, float *probs, float *lse, int32_t *idx, float *w, const float *logits,
                               int N, int E, int k, bool normalize) {
    op_router_forward(probs, lse, idx, w, logits, N, E, k, normalize);
}
static void cpu_router_backward(Backend *be, float *dlogits, const float *dtopk_w, const float *probs,
                                const float *lse, const int32_t *idx, const float *w, const float *dprob,
                                float z_coef, int N, int E, int k, bool normalize) {
    op_router_backward(dlogits, dtopk_w, probs, lse, idx, w, dprob, z_coef, N, E, k, normalize);
}
static void cpu_moe_plan(Backend *be, int32_t *off, int32_t *row_token, int32_t *row_of_slot, const int32_t *idx,
                         int N, int E, int k) {
    op_moe_plan(off, row_token, row_of_slot, idx, N, E, k);
}
static void cpu_gather_rows(Backend *be, Buf dst, Buf src, const int32_t *rows, int count, int H) {
    op_gather_rows(f32(dst), f32(src), rows, count, H);
}
static void cpu_moe_combine(Backend *be, Buf out, Buf resid, Buf y, const float *w, const int32_t *ros, int N, int k,
                            int H) {
    op_moe_combine(f32(out), f32(resid), f32(y), w, ros, N, k, H);
}
static void cpu_moe_combine_backward(Backend *be, Buf dy, float *dw, Buf dout, Buf y, const float *w,
                                     const int32_t *ros, int N, int k, int H) {
    op_moe_combine_backward(f32(dy), dw, f32(dout), f32(y), w, ros, N, k, H);
}
static void cpu_moe_uncombine_add(Backend *be, Buf dx, Buf dxe, const int32_t *ros, int N, int k, int H) {
    op_moe_uncombine_add(f32(dx), f32(dxe), ros, N, k, H);
}
static void cpu_cross_entropy_rows(Backend *be, Buf logits, int ld, float *ce, float *lse, const int32_t *targets,
                                   int R, int V, float ce_scale, float z_scale, bool grad) {
    op_cross_entropy_rows(f32(logits), ld, ce, lse, targets, R, V, ce_scale, z_scale, grad);
}
static void cpu_sum(Backend *be, double *out, const float *x, size_t n, bool squares) { op_sum(out, x, n, squares); }
static void cpu_column_means(Backend *be, double *out, const float *x, int N, int E) { op_column_means(out, x, N, E); }
static int cpu_grad_sum_squares(Backend *be, const float *x, size_t n, double *host_out) {
    (void)be;
    op_grad_sum_squares(host_out, x, n);
    return SPES_OK;
}
static void cpu_adamw(Backend *be, const AdamWTensor *t, int count, const AdamWScalars *s) { op_adamw(t, count, s); }
// One queue: everything runs in the order it was called, so there is nothing to begin or wait for.
static void cpu_aux_switch(Backend *be) { (void)be; }
static void cpu_aux_point(Backend *be, int point) { (void)be, (void)point; }

static const BackendOps cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_host_alloc,   // host memory either way; not counted as the backend's
    .host_free = cpu_host_free,
    .upload = cpu_upload,
    .download = cpu_upload,   // same memory: a copy either way
    .copy = cpu_copy,
    .zero = cpu_zero,
    .convert = cpu_convert,
    .sync = cpu_sync,
    .memory = cpu_memory,
    .close = cpu_close,
    .gemm = cpu_gemm,
    .gemm_residual = cpu_gemm_residual,
    .experts_forward = cpu_experts_forward,
    .experts_backward = cpu_experts_backward,
    .add_inplace = cpu_add_inplace,
    .copy_2d = cpu_copy_2d,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_tables = cpu_rope_tables,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .qk_norm_rope_forward = cpu_qk_norm_rope_forward,
    .qk_norm_rope_backward = cpu_qk_norm_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .router_forward = cpu_router_forward,
    .router_backward = cpu_router_backward,
    .moe_plan = cpu_moe_plan,
    .gather_rows = cpu_gather_rows,
    .moe_combine = cpu_moe_combine,
    .moe_combine_backward = cpu_moe_combine_backward,
    .moe_uncombine_add = cpu_moe_uncombine_add,
    .cross_entropy_rows = cpu_cross_entropy_rows,
    .sum = cpu_sum,
    .column_means = cpu_column_means,
    .grad_sum_squares = cpu_grad_sum_squares,
    .adamw = cpu_adamw,
    .aux_begin = cpu_aux_switch,
    .aux_end = cpu_aux_switch,
    .aux_mark = cpu_aux_point,
    .aux_wait = cpu_aux_point,
};

static Backend cpu_backend;

Backend *backend_cpu(void) {
    if (!cpu_backend.ops) {
        backend_plan_traits(false, PRECISION_FP32, &cpu_backend);
        cpu_backend.ops = &cpu_ops;
    }
    snprintf(cpu_backend.description, sizeof cpu_backend.description, "cpu (%d threads, fp32, OpenBLAS %s)",
             threads_get(), op_blas_core_name());
    return &cpu_backend;
}
