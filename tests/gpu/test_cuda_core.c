// The CUDA backend's core ops against the cpu kernels (src/ops/cpu/cpu_ops.h): GEMM (every
// transpose, fp32 / bf16 / f16 operands, fp32 and low-precision C, beta 0 and 1, odd sizes and
// strides, mixed operand types, K = 0), grouped expert MLPs forward and backward (empty,
// frozen and partly frozen experts; grouped and per-expert paths), AdamW, reductions, type
// conversion, memory and error reporting (a model created frozen holds no gradients). Outputs
// are poisoned (NaN) before every run, padding columns must come back untouched, and the ops
// that reduce are run twice for identical bits.
//
// Tolerances.
//  GEMM: per element, from the inputs as the GPU sees them (rounded to the operand type
//    first, so the reference multiplies the same numbers). op_gemm_ref accumulates in double.
//    With S = |alpha| sum_k |a_ik||b_kj| + |beta c_ij|, fp32 accumulation of K terms errs by
//    at most ~K u32 S (u32 = 2^-24; any summation order, split-K included); the output is
//    then rounded to C's type (u_c |ref|) and the reference to fp32 (u32 |ref|):
//      bound = 4 K u32 S + (1.01 u_c + u32) |ref| + 1.01 eta_c
//    (eta_c: half the spacing of C's subnormals, 2^-25 for f16, where rounding errs
//    absolutely: a 3.1e-5 f16 output of a K = 1 product, correctly rounded on an H200, was 0.4
//    of a subnormal step off; bf16 and f32 subnormals lie far below these tests' values.)
//    (factor 4: slack for tensor-core accumulation, which may truncate rather than round).
//    One rounding to C's type: with beta 1 and a bf16/f16 C, cuBLASLt's own kernel rounded
//    twice (0.73 ulp off at 64x64x64 on an H200); gemm.cu sends that case through fp32.
//    Any indexing or transpose mistake moves an element by about one term |a||b| ~ S/K or
//    more, above 4 K u32 S for every K tested (K <= 8192: 4 K u32 < 2e-3 while 1/K... is
//    checked by the small-K cases, where the bound is tiny).
//  Experts: fp32: max|err| / max|ref| <= 1e-5 forward, 1e-4 backward (dW sums over rows).
//    bf16/f16 (u = 2^-8 / 2^-11): inputs rounded to the type for the reference; the GPU also
//    rounds the intermediates gu, act, da, dgu (one rounding each, <= u relative), and silu
//    scales a relative error in g by |1 + g(1 - s)| <= 2 for |g| < 4. Each output is at most
//    ~4 roundings deep, each carried through a dot product whose sum of |terms| is <= ~3x the
//    largest |output| for these normal random inputs: gu 2u (one rounding), act 6u, y / da /
//    dxe / dW 24u (normwise, relative to the tensor's max-abs). An indexing mistake (wrong
//    expert, row, or half of gu) errs by O(1) relative and fails by far.
//  AdamW: bit-identical p, m, v to op_adamw (same float operations in the same order, no
//    contraction into FMA on either side), and the compute copy is exactly round(p).
//  Reductions: double; order differs from the cpu's loop: |err| <= n 2^-52 sum|x_i|; exactly
//    the cpu's bits where every partial sum is exact (x = k/1024); the same bits wherever the
//    buffer starts (aligned or not).
//  Conversion, scale, copies: exact.
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

#include "base/timer.h"
#include "gpu/gpu_test.h"
#include "model/model.h"
#include "unit/overlap_step_check.h"

static const double U32 = 0x1p-24;

// ---- GEMM -------------------------------------------------------------------------------------
typedef struct {
    bool ta, tb;
    int M, N, K;
    float alpha, beta;
    NumType at, bt, ct;
    int pad;   // extra elements per row of A, B and C, or PAD_ODD
} GemmCase;

// A pad that makes every row stride odd: rows 2-byte aligned only in 16-bit types (a fixed odd
// pad gives that only where a row's length is even).
#define PAD_ODD (-1)
static int row_stride(int cols, int pad) { return pad == PAD_ODD ? cols + (cols % 2 ? 2 : 3) : cols + pad; }

static float *abs_copy(const float *x, size_t n) {
    float *y = gt_copy_floats(x, n);
    for (size_t i = 0; i < n; i++) y[i] = fabsf(y[i]);
    return y;
}

// Runs one GEMM on the GPU, checks it against op_gemm_ref element by element (padding columns
// must be unchanged), and returns the result (malloc'd) for determinism checks.
// A case's row strides (each stored row's elements plus the pad) and element counts.
typedef struct {
    int lda, ldb, ldc;
    size_t na, nb, nc;
} GemmGeometry;

static GemmGeometry gemm_geometry(const GemmCase *c) {
    const int a_rows = c->ta ? c->K : c->M, a_cols = c->ta ? c->M : c->K;   // A stored [M,K], or [K,M]
    const int b_rows = c->tb ? c->N : c->K, b_cols = c->tb ? c->K : c->N;   // B stored [K,N], or [N,K]
    GemmGeometry g = {row_stride(a_cols, c->pad), row_stride(b_cols, c->pad), row_stride(c->N, c->pad), 0, 0, 0};
    g.na = (size_t)a_rows * g.lda, g.nb = (size_t)b_rows * g.ldb, g.nc = (size_t)c->M * g.ldc;
    return g;
}

static float *check_gemm(Backend *be, const GemmCase *c, uint64_t seed) {
    const int M = c->M, N = c->N, K = c->K;
    const GemmGeometry geo = gemm_geometry(c);
    const int lda = geo.lda, ldb = geo.ldb, ldc = geo.ldc;
    const size_t na = geo.na, nb = geo.nb, nc = geo.nc;
    // the type the multiply happens in: mixed operands convert the fp32 one (backend.h)
    const NumType op = c->at == c->bt ? c->at : c->at == NUM_F32 ? c->bt : c->at;

    float *A = gt_random(na, seed, 1.0), *B = gt_random(nb, seed + 1, 1.0), *C0 = gt_random(nc, seed + 2, 1.0);
    gt_round_host(A, na, c->at);   // what is uploaded
    gt_round_host(B, nb, c->bt);
    gt_round_host(C0, nc, c->ct);
    float *Aref = gt_copy_floats(A, na), *Bref = gt_copy_floats(B, nb);
    gt_round_host(Aref, na, op);   // what the GPU multiplies
    gt_round_host(Bref, nb, op);

    Buf dA = gt_upload(be, A, na, c->at), dB = gt_upload(be, B, nb, c->bt);
    Buf dC = c->beta == 0.0f ? gt_alloc(be, nc, c->ct) : gt_upload(be, C0, nc, c->ct);   // beta 0: NaN C
    be->ops->gemm(be, c->ta, c->tb, M, N, K, c->alpha, dA, lda, dB, ldb, c->beta, dC, ldc);
    float *got = gt_download(be, dC, nc);

    float *ref = gt_copy_floats(C0, nc);
    if (c->beta == 0.0f)
        for (size_t i = 0; i < nc; i++) ref[i] = NAN;   // the poison: padding must stay NaN
    op_gemm_ref(c->ta, c->tb, M, N, K, c->alpha, Aref, lda, Bref, ldb, c->beta, ref, ldc);

    float *Aa = abs_copy(Aref, na), *Ba = abs_copy(Bref, nb), *S = abs_copy(C0, nc);
    op_gemm_ref(c->ta, c->tb, M, N, K, fabsf(c->alpha), Aa, lda, Ba, ldb, fabsf(c->beta), S, ldc);
    double *bound = malloc(nc * sizeof(double));
    const double uc = gt_unit_roundoff(c->ct), eta_c = c->ct == NUM_F16 ? 0x1p-25 : 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            size_t at = (size_t)i * ldc + j;
            bound[at] = j < N ? 4.0 * K * U32 * S[at] + (1.01 * uc + U32) * fabs((double)ref[at]) + 1.01 * eta_c : 0.0;
        }
    char what[160];
    snprintf(what, sizeof what, "gemm %c%c %dx%dx%d %s,%s->%s a=%.2g b=%.2g pad %d", c->ta ? 'T' : 'N',
             c->tb ? 'T' : 'N', M, N, K, num_type_name(c->at), num_type_name(c->bt), num_type_name(c->ct),
             c->alpha, c->beta, c->pad);
    gt_check_bounds(what, got, ref, bound, nc);

    gt_free(be, dA), gt_free(be, dB), gt_free(be, dC);
    free(A), free(B), free(C0), free(Aref), free(Bref), free(ref), free(Aa), free(Ba), free(S), free(bound);
    return got;
}

static const int gemm_dims[][3] = {{1, 1, 1}, {7, 5, 3}, {1, 65, 7}, {65, 33, 129}, {513, 7, 65}, {64, 64, 64}, {33, 513, 1}};
static const int n_gemm_dims = sizeof gemm_dims / sizeof gemm_dims[0];

static void gemm_sweep(Precision prec, NumType at, NumType bt, NumType ct, const int *pads, int n_pads) {
    Backend *be = cuda_test_backend(prec);
    uint64_t seed = 100;
    for (int d = 0; d < n_gemm_dims; d++)
        for (int t = 0; t < 4; t++)
            for (int b = 0; b < 2; b++)
                for (int p = 0; p < n_pads; p++) {
                    GemmCase c = {t & 1, (t >> 1) & 1, gemm_dims[d][0], gemm_dims[d][1], gemm_dims[d][2],
                                  b ? 1.0f : 0.7f, b ? 1.0f : 0.0f, at, bt, ct, pads[p]};
                    free(check_gemm(be, &c, seed));
                    seed += 3;
                }
}

static void test_gemm_fp32(void **state) {
    (void)state;
    const int pads[] = {0, 3};
    gemm_sweep(PRECISION_FP32, NUM_F32, NUM_F32, NUM_F32, pads, 2);
}

static void test_gemm_bf16(void **state) {
    (void)state;
    const int pads[] = {0, 8, PAD_ODD};   // PAD_ODD: rows 2-byte aligned only (alignment-aware plan or repack)
    gemm_sweep(PRECISION_AMP_BF16, NUM_BF16, NUM_BF16, NUM_F32, pads, 3);
    gemm_sweep(PRECISION_AMP_BF16, NUM_BF16, NUM_BF16, NUM_BF16, pads, 3);
}

static void test_gemm_f16(void **state) {
    (void)state;
    const int pads[] = {0, PAD_ODD};
    gemm_sweep(PRECISION_AMP_FP16, NUM_F16, NUM_F16, NUM_F32, pads, 2);
    gemm_sweep(PRECISION_AMP_FP16, NUM_F16, NUM_F16, NUM_F16, pads, 2);
}

// Operand types differ (the fp32 one is converted), and C types cuBLASLt cannot write from
// the operands (through an fp32 copy).
static void test_gemm_mixed_types(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    const GemmCase cases[] = {
        {false, true, 37, 29, 53, 1.0f, 0.0f, NUM_F32, NUM_BF16, NUM_F32, 0},   // fp32 grad x bf16 weight
        {false, false, 37, 29, 53, 1.0f, 1.0f, NUM_F32, NUM_BF16, NUM_BF16, 3},
        {true, false, 37, 29, 53, 1.0f, 1.0f, NUM_BF16, NUM_F32, NUM_F32, 1},
        {false, true, 37, 29, 53, 0.5f, 1.0f, NUM_F32, NUM_F32, NUM_BF16, 0},   // f32 operands, bf16 C
        {true, true, 37, 29, 53, 1.0f, 0.0f, NUM_BF16, NUM_BF16, NUM_F16, 2},   // bf16 operands, f16 C
        {false, false, 16, 16, 16, 1.0f, 1.0f, NUM_F16, NUM_BF16, NUM_F32, 0},  // bf16 follows f16 A
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) free(check_gemm(be, &cases[i], 500 + 7 * i));
}

// K == 0: C = beta * C; beta == 0 writes zeros over NaN.
static void test_gemm_k0(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    const NumType types[] = {NUM_F32, NUM_BF16};
    for (int t = 0; t < 2; t++)
        for (int b = 0; b < 2; b++) {
            GemmCase c = {false, true, 9, 11, 0, 1.0f, b ? 0.5f : 0.0f, types[t], types[t], types[t], 2};
            free(check_gemm(be, &c, 900 + t * 2 + b));
        }
}

// Same inputs twice -> same bits (shapes large enough for split-K and tensor-core tiles).
static void test_gemm_deterministic(void **state) {
    (void)state;
    const GemmCase cases[] = {
        {false, true, 512, 512, 512, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 0},
        {true, false, 64, 96, 8192, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 0},   // dW shape: long K
        {false, false, 8, 64, 8192, 1.0f, 0.0f, NUM_F32, NUM_F32, NUM_F32, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Backend *be = cuda_test_backend(cases[i].at == NUM_F32 ? PRECISION_FP32 : PRECISION_AMP_BF16);
        float *r1 = check_gemm(be, &cases[i], 1000 + i), *r2 = check_gemm(be, &cases[i], 1000 + i);
        gt_check_same_host_bits("gemm run twice", r1, r2, (size_t)cases[i].M * cases[i].N * sizeof(float));
        free(r1), free(r2);
    }
}

// gemm_residual (D = alpha AB + R) against its contract, to the bit: R copied into D and the
// in-place gemm (beta 1) run there, at D's own address (a GEMM's plan, so its bits, may depend
// on where its operands start). R apart (cuBLASLt's own C and D where C goes direct; a copy into
// D first on the other paths), R and D at different alignments (one starting an element past
// alignment), and R == D. R must come back unchanged and D's padding columns untouched.
typedef struct {
    size_t r_shift, d_shift;   // elements past the allocation's start (256-byte aligned)
    const char *name;
} ResidualPlacement;

// D = alpha AB + R with R and D placed as `pl` says; checks the result against the in-place gemm
// at D's address and R unchanged; returns D (malloc'd, nd floats, padding columns NaN).
static float *check_gemm_residual(Backend *be, const GemmCase *c, const GemmGeometry *geo, Buf dA, Buf dB,
                                  const float *R, const ResidualPlacement *pl) {
    const int M = c->M, N = c->N, K = c->K, ldd = geo->ldc;
    const size_t nd = geo->nc;
    Buf r_base = gt_alloc(be, nd + pl->r_shift, c->ct), d_base = gt_alloc(be, nd + pl->d_shift, c->ct);
    Buf dR = buf_at(r_base, pl->r_shift), dD = buf_at(d_base, pl->d_shift);
    gt_upload_into(be, dR, R, nd);
    float *r_before = gt_download(be, dR, nd);
    be->ops->gemm_residual(be, c->ta, c->tb, M, N, K, c->alpha, dA, geo->lda, dB, geo->ldb, dR, dD, ldd);
    float *got = gt_download(be, dD, nd), *r_after = gt_download(be, dR, nd);
    gt_upload_into(be, dD, R, nd);   // the contract: R copied into D, then the in-place gemm there
    be->ops->gemm(be, c->ta, c->tb, M, N, K, c->alpha, dA, geo->lda, dB, geo->ldb, 1.0f, dD, ldd);
    float *want = gt_download(be, dD, nd);
    for (int r = 0; r < M; r++)
        for (int j = N; j < ldd; j++) {   // D's padding untouched (the poison), the sums compared
            assert_true(isnan(got[(size_t)r * ldd + j]));
            want[(size_t)r * ldd + j] = got[(size_t)r * ldd + j];
        }
    char what[160];
    snprintf(what, sizeof what, "gemm_residual %c%c %dx%dx%d %s,%s->%s pad %d, %s", c->ta ? 'T' : 'N',
             c->tb ? 'T' : 'N', M, N, K, num_type_name(c->at), num_type_name(c->bt), num_type_name(c->ct), c->pad,
             pl->name);
    gt_check_same_host_bits(what, got, want, nd * sizeof(float));
    gt_check_same_host_bits("  the addend unchanged", r_after, r_before, nd * sizeof(float));
    gt_free(be, r_base), gt_free(be, d_base);
    free(r_before), free(r_after), free(want);
    return got;
}

static void test_gemm_residual(void **state) {
    (void)state;
    const GemmCase cases[] = {
        {false, true, 256, 96, 128, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 0},   // o_proj's shape, direct
        {false, true, 65, 33, 129, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 2},   // ld 131: 2-byte rows: plan or repack
        {true, false, 37, 29, 53, 0.5f, 1.0f, NUM_F32, NUM_F32, NUM_F32, 1},
        {false, true, 37, 29, 53, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_BF16, 0},    // bf16 D: through fp32
        {false, true, 37, 29, 53, 1.0f, 1.0f, NUM_F32, NUM_BF16, NUM_F32, 0},      // mixed operands
        {false, true, 9, 11, 0, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 2},       // K = 0: D = R
        // few rows, long K: split-K's shapes, where a reduction out of place could differ
        {false, true, 1, 64, 8192, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 0},
        {false, true, 8, 96, 8192, 1.0f, 1.0f, NUM_BF16, NUM_BF16, NUM_F32, 0},
        {false, true, 1, 64, 8192, 1.0f, 1.0f, NUM_F32, NUM_F32, NUM_F32, 0},
        {false, true, 8, 96, 8192, 1.0f, 1.0f, NUM_F32, NUM_F32, NUM_F32, 0},
    };
    const ResidualPlacement placements[] = {
        {0, 0, "apart"},
        {1, 0, "apart, R one element past alignment"},
        {0, 1, "apart, D one element past alignment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const GemmCase *c = &cases[i];
        Backend *be = cuda_test_backend(c->at == NUM_F32 && c->bt == NUM_F32 ? PRECISION_FP32 : PRECISION_AMP_BF16);
        const GemmGeometry geo = gemm_geometry(c);
        const size_t nd = geo.nc;
        float *A = gt_random(geo.na, 1300 + i, 1.0), *B = gt_random(geo.nb, 1400 + i, 1.0);
        float *R = gt_random(nd, 1500 + i, 1.0);
        gt_round_host(R, nd, c->ct);   // what D's type holds
        Buf dA = gt_upload(be, A, geo.na, c->at), dB = gt_upload(be, B, geo.nb, c->bt);
        float *apart = NULL;
        for (size_t p = 0; p < sizeof placements / sizeof placements[0]; p++) {
            float *got = check_gemm_residual(be, c, &geo, dA, dB, R, &placements[p]);
            if (p == 0) apart = got;
            else free(got);
        }
        // in place (R == D, both aligned): the in-place gemm itself, so the bits of "apart" too
        Buf dR = gt_upload(be, R, nd, c->ct);
        be->ops->gemm_residual(be, c->ta, c->tb, c->M, c->N, c->K, c->alpha, dA, geo.lda, dB, geo.ldb, dR, dR,
                               geo.ldc);
        float *in_place = gt_download(be, dR, nd);
        for (int r = 0; r < c->M; r++)
            for (int j = c->N; j < geo.ldc; j++) in_place[(size_t)r * geo.ldc + j] = apart[(size_t)r * geo.ldc + j];
        gt_check_same_host_bits("  in place", in_place, apart, nd * sizeof(float));
        gt_free(be, dA), gt_free(be, dB), gt_free(be, dR);
        free(A), free(B), free(R), free(apart), free(in_place);
    }
}

// ---- experts ----------------------------------------------------------------------------------
typedef struct {
    int H, I, E;
    const int *counts;
} ExpertsShape;

// Gradient pattern of expert e: 0 all trainable (dgate_up), 1 frozen, 2 gate only (+ down),
// 3 gate and up separately, down frozen.
static int grad_kind(int e) { return e % 4; }

typedef struct {
    float *xe, *gu, *act, *y, *dy, *da;
    float **gate_up, **down;
    float **dgate_up, **dgate, **dup, **ddown;   // per expert, NULL where frozen
} HostExperts;

static void experts_case(Precision prec, const ExpertsShape *s, bool grouped, float **det_out, size_t *det_n) {
    Backend *be = cuda_test_backend(prec);
    const NumType ct = gt_compute_type(prec);
    const int E = s->E, H = s->H, I = s->I;
    int32_t *off = malloc((E + 1) * sizeof(int32_t));
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + s->counts[e];
    const int NK = off[E];
    if (grouped) setenv("SPES_CUDA_GROUPED", "1", 1);   // cuBLAS's grouped GEMM instead of the per-expert loop
    else unsetenv("SPES_CUDA_GROUPED");

    // host reference buffers (inputs rounded to the compute type)
    HostExperts h;
    uint64_t seed = 2000 + H * 7 + I;
    h.xe = gt_random((size_t)NK * H, seed++, 1.0);
    h.dy = gt_random((size_t)NK * H, seed++, 1.0);
    gt_round_host(h.xe, (size_t)NK * H, ct);
    gt_round_host(h.dy, (size_t)NK * H, ct);
    h.gu = calloc((size_t)NK * 2 * I + 1, sizeof(float));
    h.act = calloc((size_t)NK * I + 1, sizeof(float));
    h.y = calloc((size_t)NK * H + 1, sizeof(float));
    h.da = calloc((size_t)NK * I + 1, sizeof(float));
    h.gate_up = calloc(E, sizeof(float *)), h.down = calloc(E, sizeof(float *));
    h.dgate_up = calloc(E, sizeof(float *)), h.dgate = calloc(E, sizeof(float *));
    h.dup = calloc(E, sizeof(float *)), h.ddown = calloc(E, sizeof(float *));
    Buf *hgu_b = calloc(E, sizeof(Buf)), *hdown_b = calloc(E, sizeof(Buf));
    for (int e = 0; e < E; e++) {
        h.gate_up[e] = gt_random((size_t)2 * I * H, seed++, 1.0 / sqrt(H));
        h.down[e] = gt_random((size_t)H * I, seed++, 1.0 / sqrt(I));
        gt_round_host(h.gate_up[e], (size_t)2 * I * H, ct);
        gt_round_host(h.down[e], (size_t)H * I, ct);
        hgu_b[e] = buf_f32(h.gate_up[e]);
        hdown_b[e] = buf_f32(h.down[e]);
        int k = grad_kind(e);
        if (k == 0) h.dgate_up[e] = gt_random((size_t)2 * I * H, seed++, 0.1);
        if (k == 2 || k == 3) h.dgate[e] = gt_random((size_t)I * H, seed++, 0.1);
        if (k == 3) h.dup[e] = gt_random((size_t)I * H, seed++, 0.1);
        if (k == 0 || k == 2) h.ddown[e] = gt_random((size_t)H * I, seed++, 0.1);
    }

    // device copies
    Buf d_xe = gt_upload(be, h.xe, (size_t)NK * H, ct), d_dy = gt_upload(be, h.dy, (size_t)NK * H, ct);
    Buf d_gu = gt_alloc(be, (size_t)NK * 2 * I, ct), d_act = gt_alloc(be, (size_t)NK * I, ct);
    Buf d_y = gt_alloc(be, (size_t)NK * H, ct), d_da = gt_alloc(be, (size_t)NK * I, ct);
    Buf *d_gate_up = calloc(E, sizeof(Buf)), *d_down = calloc(E, sizeof(Buf));
    float **d_dgate_up = calloc(E, sizeof(float *)), **d_dgate = calloc(E, sizeof(float *));
    float **d_dup = calloc(E, sizeof(float *)), **d_ddown = calloc(E, sizeof(float *));
    for (int e = 0; e < E; e++) {
        d_gate_up[e] = gt_upload(be, h.gate_up[e], (size_t)2 * I * H, ct);
        d_down[e] = gt_upload(be, h.down[e], (size_t)H * I, ct);
        if (h.dgate_up[e]) d_dgate_up[e] = gt_upload(be, h.dgate_up[e], (size_t)2 * I * H, NUM_F32).p;
        if (h.dgate[e]) d_dgate[e] = gt_upload(be, h.dgate[e], (size_t)I * H, NUM_F32).p;
        if (h.dup[e]) d_dup[e] = gt_upload(be, h.dup[e], (size_t)I * H, NUM_F32).p;
        if (h.ddown[e]) d_ddown[e] = gt_upload(be, h.ddown[e], (size_t)H * I, NUM_F32).p;
    }

    ExpertsArgs ha = {E, H, I, off, hgu_b, hdown_b, buf_f32(h.xe), buf_f32(h.gu), buf_f32(h.act), buf_f32(h.y),
                      buf_f32(h.dy), buf_f32(h.da), h.dgate_up, h.dgate, h.dup, h.ddown};
    ExpertsArgs da = {E, H, I, off, d_gate_up, d_down, d_xe, d_gu, d_act, d_y, d_dy, d_da, d_dgate_up, d_dgate,
                      d_dup, d_ddown};

    const double u = gt_unit_roundoff(ct);
    const bool f32 = ct == NUM_F32;
    const double tol_gu = f32 ? 1e-5 : 2 * u, tol_act = f32 ? 1e-5 : 6 * u, tol_fwd = f32 ? 1e-5 : 24 * u;
    const double tol_bwd = f32 ? 1e-4 : 24 * u;
    printf("experts %s H=%d I=%d E=%d NK=%d%s\n", precision_name(prec), H, I, E, NK,
           grouped ? " (cuBLAS grouped GEMM)" : "");

    // forward
    op_experts_forward(&ha);
    be->ops->experts_forward(be, &da);
    float *g_gu = gt_download(be, d_gu, (size_t)NK * 2 * I), *g_act = gt_download(be, d_act, (size_t)NK * I);
    float *g_y = gt_download(be, d_y, (size_t)NK * H);
    gt_check("experts gu", g_gu, h.gu, (size_t)NK * 2 * I, tol_gu);
    gt_check("experts act", g_act, h.act, (size_t)NK * I, tol_act);
    gt_check("experts y", g_y, h.y, (size_t)NK * H, tol_fwd);

    // backward (the GPU's own forward state: gu, act as it computed them)
    op_experts_backward(&ha);
    be->ops->experts_backward(be, &da);
    float *g_dxe = gt_download(be, d_dy, (size_t)NK * H), *g_dgu = gt_download(be, d_gu, (size_t)NK * 2 * I);
    float *g_da = gt_download(be, d_da, (size_t)NK * I);
    gt_check("experts da", g_da, h.da, (size_t)NK * I, tol_bwd);
    gt_check("experts dgu (in gu)", g_dgu, h.gu, (size_t)NK * 2 * I, tol_bwd);
    gt_check("experts dxe (in dy)", g_dxe, h.dy, (size_t)NK * H, tol_bwd);
    size_t det_total = (size_t)NK * H, det_at = 0;
    for (int e = 0; e < E; e++) det_total += (size_t)4 * I * H + (size_t)H * I;
    float *det = det_out ? calloc(det_total, sizeof(float)) : NULL;
    if (det) memcpy(det, g_dxe, (size_t)NK * H * sizeof(float)), det_at = (size_t)NK * H;
    for (int e = 0; e < E; e++) {
        struct {
            const char *name;
            float *host, *dev;
            size_t n;
        } grads[] = {{"dgate_up", h.dgate_up[e], d_dgate_up[e], (size_t)2 * I * H},
                     {"dgate", h.dgate[e], d_dgate[e], (size_t)I * H},
                     {"dup", h.dup[e], d_dup[e], (size_t)I * H},
                     {"ddown", h.ddown[e], d_ddown[e], (size_t)H * I}};
        for (int g = 0; g < 4; g++) {
            if (!grads[g].host) continue;
            float *got = gt_download(be, buf_f32(grads[g].dev), grads[g].n);
            char what[64];
            snprintf(what, sizeof what, "experts %s[%d] (%d rows)", grads[g].name, e, s->counts[e]);
            gt_check(what, got, grads[g].host, grads[g].n, tol_bwd);
            if (det) memcpy(det + det_at, got, grads[g].n * sizeof(float)), det_at += grads[g].n;
            free(got);
        }
    }
    if (det_out) *det_out = det, *det_n = det_at;

    unsetenv("SPES_CUDA_GROUPED");
    gt_free(be, d_xe), gt_free(be, d_dy), gt_free(be, d_gu), gt_free(be, d_act), gt_free(be, d_y), gt_free(be, d_da);
    for (int e = 0; e < E; e++) {
        gt_free(be, d_gate_up[e]), gt_free(be, d_down[e]);
        backend_free(be, d_dgate_up[e]), backend_free(be, d_dgate[e]), backend_free(be, d_dup[e]);
        backend_free(be, d_ddown[e]);
        free(h.gate_up[e]), free(h.down[e]), free(h.dgate_up[e]), free(h.dgate[e]), free(h.dup[e]), free(h.ddown[e]);
    }
    free(d_gate_up), free(d_down), free(d_dgate_up), free(d_dgate), free(d_dup), free(d_ddown);
    free(h.gate_up), free(h.down), free(h.dgate_up), free(h.dgate), free(h.dup), free(h.ddown), free(hgu_b), free(hdown_b);
    free(h.xe), free(h.dy), free(h.gu), free(h.act), free(h.y), free(h.da);
    free(g_gu), free(g_act), free(g_y), free(g_dxe), free(g_dgu), free(g_da), free(off);
}

// Empty experts first, in the middle and last; a single-row expert.
static const int counts8[] = {0, 7, 13, 1, 0, 19, 3, 0};
// Row counts below their plan buckets (gemm.cu: 7 runs the 8-row bucket's plan, resized).
static const ExpertsShape aligned_shape = {32, 24, 8, counts8};   // either path (grouped when asked for)
static const ExpertsShape odd_shape = {20, 12, 8, counts8};       // bf16 rows not 16-byte multiples: the loop even when grouped is asked for

static void test_experts_fp32(void **state) {
    (void)state;
    experts_case(PRECISION_FP32, &aligned_shape, false, NULL, NULL);
    experts_case(PRECISION_FP32, &odd_shape, false, NULL, NULL);
    experts_case(PRECISION_FP32, &aligned_shape, true, NULL, NULL);
}

static void test_experts_bf16(void **state) {
    (void)state;
    // the per-expert GEMMs on side streams (the default; the odd shape's operands need
    // repacking: one stream), then all on the main stream
    experts_case(PRECISION_AMP_BF16, &aligned_shape, false, NULL, NULL);
    experts_case(PRECISION_AMP_BF16, &odd_shape, false, NULL, NULL);
    experts_case(PRECISION_AMP_BF16, &aligned_shape, true, NULL, NULL);
    setenv("SPES_CUDA_EXPERT_STREAMS", "1", 1);
    experts_case(PRECISION_AMP_BF16, &aligned_shape, false, NULL, NULL);
    experts_case(PRECISION_AMP_BF16, &odd_shape, false, NULL, NULL);
    unsetenv("SPES_CUDA_EXPERT_STREAMS");
}

static void test_experts_f16(void **state) {
    (void)state;
    experts_case(PRECISION_AMP_FP16, &aligned_shape, false, NULL, NULL);
    experts_case(PRECISION_AMP_FP16, &aligned_shape, true, NULL, NULL);
}

// Run twice: the same bits, once with the per-expert GEMMs all on the main stream
// (SPES_CUDA_EXPERT_STREAMS=1) and once round-robin on 4 side streams (the default).
static void test_experts_deterministic(void **state) {
    (void)state;
    const int counts[] = {300, 0, 517, 64, 1, 129};
    const ExpertsShape big = {128, 96, 6, counts};
    float *r1, *r2;
    size_t n1, n2;
    setenv("SPES_CUDA_EXPERT_STREAMS", "1", 1);
    experts_case(PRECISION_AMP_BF16, &big, false, &r1, &n1);
    setenv("SPES_CUDA_EXPERT_STREAMS", "4", 1);
    experts_case(PRECISION_AMP_BF16, &big, false, &r2, &n2);
    unsetenv("SPES_CUDA_EXPERT_STREAMS");
    assert_int_equal(n1, n2);
    gt_check_same_host_bits("experts backward (dxe, dW): side streams vs one stream", r1, r2, n1 * sizeof(float));
    free(r1), free(r2);
}

// Not a check: prints the speed of the experts op at the 1B model's shape (H 768, I 2048, 16
// experts, 8 x 2048 tokens top-2: 2048 rows each), for the GPU speed work (docs/gpu_perf_notes.md):
// the forward (GEMMs + SwiGLU), the backward with every expert trainable and with all
// frozen (dX only: the difference is the dW GEMMs), each through cuBLAS's grouped GEMM and the
// per-expert cuBLASLt loop, and one dense GEMM of the forward's first projection's size as the
// ceiling. FLOPs: forward 2*NK*3*H*I; backward dX the same, dW the same again.
static void test_experts_speed(void **state) {
    (void)state;
    if (getenv("SPES_GPU_MEMCHECK_PASS")) skip();   // minutes under the sanitizer, and time means nothing there
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    enum { E = 16, H = 768, I = 2048, ROWS = 2048, NK = E * ROWS, ITERS = 5 };
    const NumType ct = NUM_BF16;
    int32_t off[E + 1];
    for (int e = 0; e <= E; e++) off[e] = e * ROWS;
    float *x = gt_random((size_t)NK * 2 * I, 77, 1.0);
    Buf xe = gt_upload(be, x, (size_t)NK * H, ct), dy = gt_upload(be, x, (size_t)NK * H, ct);
    Buf gu = gt_alloc(be, (size_t)NK * 2 * I, ct), act = gt_alloc(be, (size_t)NK * I, ct);
    Buf y = gt_alloc(be, (size_t)NK * H, ct), da = gt_alloc(be, (size_t)NK * I, ct);
    Buf gate_up[E], down[E];
    float *dgate_up[E], *ddown[E], *none[E];
    for (int e = 0; e < E; e++) {
        gate_up[e] = gt_upload(be, x + e, (size_t)2 * I * H, ct);
        down[e] = gt_upload(be, x + 2 * e, (size_t)H * I, ct);
        dgate_up[e] = gt_alloc(be, (size_t)2 * I * H, NUM_F32).p;
        ddown[e] = gt_alloc(be, (size_t)H * I, NUM_F32).p;
        none[e] = NULL;
    }
    const double flops = 2.0 * NK * 3.0 * H * I;
    static const char *const variants[] = {"per-expert cuBLASLt loop, one stream",
                                           "per-expert cuBLASLt loop, 4 side streams", "cuBLAS grouped GEMM"};
    for (int variant = 0; variant < 3; variant++) {
        setenv("SPES_CUDA_EXPERT_STREAMS", variant == 1 ? "4" : "1", 1);
        if (variant == 2) setenv("SPES_CUDA_GROUPED", "1", 1);
        double t_fwd = 0, t_bwd = 0, t_bwd_frozen = 0;
        for (int pass = 0; pass < 2; pass++) {   // pass 0 warms up (plans, heuristics)
            ExpertsArgs a = {E, H, I, off, gate_up, down, xe, gu, act, y, dy, da, dgate_up, none, none, ddown};
            ExpertsArgs frozen = a;
            frozen.dgate_up = frozen.dgate = frozen.dup = frozen.ddown = none;
            gt_sync_ok(be);
            double t0 = now_seconds();
            for (int it = 0; it < ITERS; it++) be->ops->experts_forward(be, &a);
            gt_sync_ok(be);
            double t1 = now_seconds();
            for (int it = 0; it < ITERS; it++) {   // the backward overwrites gu and dy: refresh them
                be->ops->experts_forward(be, &a);
                be->ops->copy(be, dy.p, xe.p, (size_t)NK * H * num_type_size(ct));
                be->ops->experts_backward(be, &a);
            }
            gt_sync_ok(be);
            double t2 = now_seconds();
            for (int it = 0; it < ITERS; it++) {
                be->ops->experts_forward(be, &frozen);
                be->ops->copy(be, dy.p, xe.p, (size_t)NK * H * num_type_size(ct));
                be->ops->experts_backward(be, &frozen);
            }
            gt_sync_ok(be);
            double t3 = now_seconds();
            t_fwd = (t1 - t0) / ITERS;
            t_bwd = (t2 - t1) / ITERS - t_fwd;   // less the forward that refreshed its inputs
            t_bwd_frozen = (t3 - t2) / ITERS - t_fwd;
        }
        printf("  experts H=%d I=%d E=%d NK=%d, %s: forward %.3f ms (%.0f TFLOP/s); backward all trainable %.3f ms "
               "(%.0f TFLOP/s), all frozen %.3f ms (%.0f TFLOP/s): dW GEMMs %.3f ms (%.0f TFLOP/s)\n",
               H, I, E, NK, variants[variant], 1e3 * t_fwd,
               flops / t_fwd * 1e-12, 1e3 * t_bwd, 2 * flops / t_bwd * 1e-12, 1e3 * t_bwd_frozen,
               flops / t_bwd_frozen * 1e-12, 1e3 * (t_bwd - t_bwd_frozen), flops / (t_bwd - t_bwd_frozen) * 1e-12);
    }
    unsetenv("SPES_CUDA_GROUPED");
    unsetenv("SPES_CUDA_EXPERT_STREAMS");
    // the ceiling: one GEMM of all NK rows against one expert's [2I, H] (gu = xe @ gate_up^T)
    double t_dense = 0;
    for (int pass = 0; pass < 2; pass++) {
        gt_sync_ok(be);
        double t0 = now_seconds();
        for (int it = 0; it < ITERS; it++) linear_forward(be, gu, xe, gate_up[0], NK, H, 2 * I, false);
        gt_sync_ok(be);
        t_dense = (now_seconds() - t0) / ITERS;
    }
    printf("  dense GEMM [%d x %d] @ [%d x %d]^T: %.3f ms (%.0f TFLOP/s)\n", NK, H, 2 * I, H, 1e3 * t_dense,
           2.0 * NK * H * 2 * I / t_dense * 1e-12);
    free(x);
    gt_free(be, xe), gt_free(be, dy), gt_free(be, gu), gt_free(be, act), gt_free(be, y), gt_free(be, da);
    for (int e = 0; e < E; e++) {
        gt_free(be, gate_up[e]), gt_free(be, down[e]);
        backend_free(be, dgate_up[e]), backend_free(be, ddown[e]);
    }
}

// Not a check: prints the speed of the LM head's pieces at the 1B model's shape (one logits
// block of 3520 rows, H 768, vocabulary 151665 in rows of 151680), for the GPU speed work: its
// three GEMMs with the vocabulary as a GEMM dimension (odd: what the first H200 run measured at
// ~118 TFLOP/s for the whole head) and with the padded width (model_step.c's lm_head_and_loss
// now), and the fused cross-entropy with its gradient.
static void time_gemm(Backend *be, const char *what, bool ta, bool tb, int M, int N, int K, Buf A, int lda, Buf Bm,
                      int ldb, float beta, Buf C, int ldc) {
    enum { ITERS = 5 };
    double t = 0;
    for (int pass = 0; pass < 2; pass++) {   // pass 0 warms up
        gt_sync_ok(be);
        double t0 = now_seconds();
        for (int it = 0; it < ITERS; it++) be->ops->gemm(be, ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, beta, C, ldc);
        gt_sync_ok(be);
        t = (now_seconds() - t0) / ITERS;
    }
    printf("  %-44s M=%d N=%d K=%d: %.3f ms (%.0f TFLOP/s)\n", what, M, N, K, 1e3 * t, 2.0 * M * N * K / t * 1e-12);
}

static void test_lm_head_speed(void **state) {
    (void)state;
    if (getenv("SPES_GPU_MEMCHECK_PASS")) skip();   // minutes under the sanitizer, and time means nothing there
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    enum { R = 3520, H = 768, V = 151665, LD = 151680 };
    const NumType ct = NUM_BF16;
    float *x = gt_random((size_t)LD * H, 91, 1.0);
    Buf h = gt_upload(be, x, (size_t)R * H, ct), W = gt_upload(be, x, (size_t)LD * H, ct);
    Buf dh = gt_alloc(be, (size_t)R * H, ct), logits = gt_alloc(be, (size_t)R * LD, ct);
    Buf dW = gt_alloc(be, (size_t)LD * H, NUM_F32);
    time_gemm(be, "logits = h W^T, N = V (odd)", false, true, R, V, H, h, H, W, H, 0.0f, logits, LD);
    time_gemm(be, "logits = h W^T, N = ld", false, true, R, LD, H, h, H, W, H, 0.0f, logits, LD);
    time_gemm(be, "dh = dlogits W, K = V (odd)", false, false, R, H, V, logits, LD, W, H, 0.0f, dh, H);
    time_gemm(be, "dh = dlogits W, K = ld", false, false, R, H, LD, logits, LD, W, H, 0.0f, dh, H);
    time_gemm(be, "dW += dlogits^T h, M = V (odd), fp32", true, false, V, H, R, logits, LD, h, H, 1.0f, dW, H);
    time_gemm(be, "dW += dlogits^T h, M = ld, fp32", true, false, LD, H, R, logits, LD, h, H, 1.0f, dW, H);
    int32_t *tg_host = gt_random_ints(R, 92, V);
    int32_t *tg = gt_upload_bytes(be, tg_host, R * sizeof(int32_t));
    float *ce = gt_alloc(be, R, NUM_F32).p, *lse = gt_alloc(be, R, NUM_F32).p;
    double t = 0;
    for (int pass = 0; pass < 2; pass++) {
        be->ops->gemm(be, false, true, R, LD, H, 1.0f, h, H, W, H, 0.0f, logits, LD);   // fresh logits
        gt_sync_ok(be);
        double t0 = now_seconds();
        be->ops->cross_entropy_rows(be, logits, LD, ce, lse, tg, R, V, 1e-4f, 1e-9f, true);
        gt_sync_ok(be);
        t = now_seconds() - t0;
    }
    printf("  cross-entropy + gradient, R=%d V=%d ld=%d: %.3f ms (%.0f GB/s of logits read twice, written once)\n", R,
           V, LD, 1e3 * t, 3.0 * R * V * 2 / t * 1e-9);
    free(x), free(tg_host);
    gt_free(be, h), gt_free(be, W), gt_free(be, dh), gt_free(be, logits), gt_free(be, dW);
    backend_free(be, tg), backend_free(be, ce), backend_free(be, lse);
}

// ---- AdamW ------------------------------------------------------------------------------------
static void test_adamw(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    // Tensors with their own (aligned) buffers run the 16-byte path and its scalar tail; the
    // others have one buffer placed past alignment, which takes the tensor down the scalar path
    // throughout: master weights one float past, m two floats past (8 bytes), or only the bf16
    // compute copy four elements past (8 bytes) with p, g, m, v aligned.
    // After the 10 listed, 100 tensors of 0-3 elements: one call spans three launches of
    // ADAMW_BATCH (48) descriptors, and the batch boundaries fall among them.
    enum { T_LISTED = 10, T = T_LISTED + 100 };
    size_t n[T] = {1, 2048, 2049, 5000, 0, 300, 70001, 4100, 4099, 3000};
    NumType ctype[T] = {NUM_BF16, NUM_BF16, NUM_F16, NUM_BF16, NUM_BF16, NUM_F32, NUM_BF16, NUM_BF16, NUM_BF16, NUM_BF16};
    bool has_copy[T] = {true, false, true, true, true, true, true, true, true, true};
    float decay[T] = {1.0f - 1e-4f, 1.0f, 1.0f - 1e-4f, 1.0f, 1.0f, 1.0f - 3e-5f, 1.0f - 1e-4f, 1.0f - 1e-4f,
                      1.0f, 1.0f - 1e-4f};
    // elements from the start of the allocation (256-byte aligned) to the buffer
    size_t p_shift[T] = {0, 0, 0, 0, 0, 0, 0, 1, 0, 0}, m_shift[T] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
    size_t c_shift[T] = {0, 0, 0, 0, 0, 0, 0, 0, 4, 0};
    for (int i = T_LISTED; i < T; i++)
        n[i] = (size_t)(i % 4), ctype[i] = NUM_BF16, has_copy[i] = true, decay[i] = 1.0f - 1e-4f;
    float *hp[T], *hg[T], *hm[T], *hv[T];
    AdamWTensor ht[T], dt[T];
    void *p_base[T], *m_base[T], *c_base[T];   // what is freed
    for (int i = 0; i < T; i++) {
        size_t k = n[i];
        hp[i] = gt_random(k, 3000 + i, 0.5);
        hg[i] = gt_random(k, 3100 + i, 1e-2);
        hm[i] = gt_random(k, 3200 + i, 1e-3);
        hv[i] = gt_random(k, 3300 + i, 1e-3);
        for (size_t j = 0; j < k; j++) hv[i][j] = hv[i][j] * hv[i][j];   // v >= 0
        if (k > 0) hg[i][0] = 0.0f;                                      // a zero gradient
        ht[i] = (AdamWTensor){hp[i], hg[i], hm[i], hv[i], {NULL, NUM_F32}, k, decay[i]};
        Buf p = gt_alloc(be, k + p_shift[i], NUM_F32), m = gt_alloc(be, k + m_shift[i], NUM_F32);
        Buf c = has_copy[i] ? gt_alloc(be, k + c_shift[i], ctype[i]) : (Buf){NULL, NUM_F32};
        p_base[i] = p.p, m_base[i] = m.p, c_base[i] = c.p;
        p = buf_at(p, p_shift[i]), m = buf_at(m, m_shift[i]), c = buf_at(c, c_shift[i]);
        gt_upload_into(be, p, hp[i], k);
        gt_upload_into(be, m, hm[i], k);
        dt[i] = (AdamWTensor){p.p, gt_upload(be, hg[i], k, NUM_F32).p, m.p, gt_upload(be, hv[i], k, NUM_F32).p, c,
                              k, decay[i]};
    }
    for (int step = 1; step <= 3; step++) {
        const float beta1 = 0.9f, beta2 = 0.95f, lr = 4e-4f;
        float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
        // step 2 clips (the factor applied as g is read), steps 1 and 3 do not
        const float grad_scale = step == 2 ? 0.37f : 1.0f;
        AdamWScalars sc = {1.0f - beta1, beta2, 1.0f - beta2, sqrtf(bc2), 1e-8f, -lr / bc1, grad_scale};
        op_adamw(ht, T, &sc);
        be->ops->adamw(be, dt, T, &sc);
        for (int i = 0; i < T; i++) {
            size_t k = n[i];
            float *p = gt_download(be, buf_f32(dt[i].p), k), *m = gt_download(be, buf_f32(dt[i].m), k);
            float *v = gt_download(be, buf_f32(dt[i].v), k);
            char what[80];
            snprintf(what, sizeof what, "adamw step %d tensor %d (n=%zu) p", step, i, k);
            gt_check_same_host_bits(what, p, hp[i], k * sizeof(float));
            snprintf(what, sizeof what, "adamw step %d tensor %d m", step, i);
            gt_check_same_host_bits(what, m, hm[i], k * sizeof(float));
            snprintf(what, sizeof what, "adamw step %d tensor %d v", step, i);
            gt_check_same_host_bits(what, v, hv[i], k * sizeof(float));
            if (has_copy[i] && k > 0) {
                float *c = gt_download(be, dt[i].compute, k);
                float *want = gt_copy_floats(hp[i], k);
                gt_round_host(want, k, ctype[i]);
                snprintf(what, sizeof what, "adamw step %d tensor %d compute copy (%s)", step, i,
                         num_type_name(ctype[i]));
                gt_check_same_host_bits(what, c, want, k * sizeof(float));
                free(c), free(want);
            }
            free(p), free(m), free(v);
        }
    }
    for (int i = 0; i < T; i++) {
        backend_free(be, p_base[i]), backend_free(be, (void *)dt[i].g), backend_free(be, m_base[i]);
        backend_free(be, dt[i].v), backend_free(be, c_base[i]);
        free(hp[i]), free(hg[i]), free(hm[i]), free(hv[i]);
    }
}

// ---- reductions -------------------------------------------------------------------------------
static void check_sum_double(const char *what, double got, double ref, double sum_abs, size_t n) {
    double bound = (double)(n ? n : 1) * 0x1p-52 * sum_abs;
    printf("  %-40s got %.17g ref %.17g (|err| %.2e, bound %.2e)\n", what, got, ref, fabs(got - ref), bound);
    if (!(fabs(got - ref) <= bound)) fail_msg("%s: got %.17g ref %.17g", what, got, ref);
}

// The three sums of x[0..n) (sum, sum of squares, the gradient norm's sum of squares).
typedef struct {
    double sum, squares, grad_squares;
} Sums;

static Sums cpu_sums(const float *x, size_t n) {
    Sums s;
    op_sum(&s.sum, x, n, false);
    op_sum(&s.squares, x, n, true);
    op_grad_sum_squares(&s.grad_squares, x, n);
    return s;
}

// The device's sums of dx[0..n), each run twice for the same bits.
static Sums device_sums(Backend *be, double *d_out, const float *dx, size_t n) {
    Sums s;
    for (int sq = 0; sq < 2; sq++) {
        double got[2];
        be->ops->sum(be, d_out, dx, n, sq);
        be->ops->sum(be, d_out + 1, dx, n, sq);
        double *h = gt_download_bytes(be, d_out, 2 * sizeof(double));
        memcpy(got, h, sizeof got), free(h);
        gt_check_same_host_bits(sq ? "sum of squares run twice" : "sum run twice", &got[0], &got[1], sizeof(double));
        *(sq ? &s.squares : &s.sum) = got[0];
    }
    double got[2];
    // read back by the op itself, from its own slot (no allocation per call)
    assert_int_equal(be->ops->grad_sum_squares(be, dx, n, &got[0]), SPES_OK);
    assert_int_equal(be->ops->grad_sum_squares(be, dx, n, &got[1]), SPES_OK);
    gt_check_same_host_bits("grad_sum_squares run twice", &got[0], &got[1], sizeof(double));
    s.grad_squares = got[0];
    return s;
}

static void check_same_sums(const char *what, const Sums *got, const Sums *want) {
    const double g[3] = {got->sum, got->squares, got->grad_squares};
    const double w[3] = {want->sum, want->squares, want->grad_squares};
    const char *names[3] = {"sum", "sum of squares", "grad_sum_squares"};
    for (int i = 0; i < 3; i++)
        if (memcmp(&g[i], &w[i], sizeof(double)) != 0)
            fail_msg("%s: %s got %.17g, want the same bits as %.17g", what, names[i], g[i], w[i]);
    printf("  %-40s the same bits (sum %.17g, of squares %.17g)\n", what, g[0], g[1]);
}

static void test_reductions(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    double *d_out = gt_alloc_bytes(be, 2 * sizeof(double));
    // Random data: the cpu's order differs, so within the bound; the sums of a buffer starting 1,
    // 2 or 3 floats past 16-byte alignment (4-byte loads) have the bits of the aligned one's
    // (16-byte loads): the same groups of 4 in the same order, whatever the loads.
    const size_t sizes[] = {0, 1, 7, 1000, (1u << 20) + 3, 5000011};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        float *x = gt_random(n, 4000 + si, 1.0);
        double sum_abs = 0.0, sum_sq = 0.0;
        for (size_t i = 0; i < n; i++) sum_abs += fabs((double)x[i]), sum_sq += (double)x[i] * x[i];
        const Sums ref = cpu_sums(x, n);
        Buf base = gt_alloc(be, n + 3, NUM_F32);
        Sums aligned = {0, 0, 0};
        for (size_t shift = 0; shift < 4; shift++) {
            Buf dx = buf_at(base, shift);
            gt_upload_into(be, dx, x, n);
            const Sums got = device_sums(be, d_out, dx.p, n);
            char what[64];
            snprintf(what, sizeof what, "n=%zu, %zu floats past alignment:", n, shift);
            printf("  %s\n", what);
            check_sum_double("    sum", got.sum, ref.sum, sum_abs, n);
            check_sum_double("    sum of squares", got.squares, ref.squares, sum_sq, n);
            check_sum_double("    grad_sum_squares", got.grad_squares, ref.grad_squares, sum_sq, n);
            if (shift == 0) aligned = got;
            else check_same_sums("    as aligned:", &got, &aligned);
        }
        gt_free(be, base), free(x);
    }
    // Data whose sums are exact in double (x = k / 1024, |k| <= 16: every partial sum, of
    // values or of squares, is a multiple of 2^-20 far below 2^33), so any order gives the
    // same bits: the device's equal the cpu's, aligned and one float past.
    const size_t exact_sizes[] = {1, 3, 4, 5, 7, 1000, 5000011};
    for (size_t si = 0; si < sizeof exact_sizes / sizeof exact_sizes[0]; si++) {
        const size_t n = exact_sizes[si];
        int32_t *k = gt_random_ints(n, 4200 + si, 33);
        float *x = malloc(n * sizeof(float));
        assert_non_null(x);
        for (size_t i = 0; i < n; i++) x[i] = (float)(k[i] - 16) / 1024.0f;
        const Sums ref = cpu_sums(x, n);
        Buf base = gt_alloc(be, n + 1, NUM_F32);
        for (size_t shift = 0; shift < 2; shift++) {
            Buf dx = buf_at(base, shift);
            gt_upload_into(be, dx, x, n);
            const Sums got = device_sums(be, d_out, dx.p, n);
            char what[64];
            snprintf(what, sizeof what, "exact n=%zu%s, as the cpu:", n, shift ? " unaligned" : "");
            check_same_sums(what, &got, &ref);
        }
        gt_free(be, base), free(x), free(k);
    }
    backend_free(be, d_out);

    const int shapes[][2] = {{1000, 7}, {3, 64}, {4097, 64}, {1, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int N = shapes[si][0], E = shapes[si][1];
        float *x = gt_random_uniform((size_t)N * E, 4100 + si, 0.0, 1.0);
        Buf dx = gt_upload(be, x, (size_t)N * E, NUM_F32);
        double *ref = malloc(E * sizeof(double)), *d = gt_alloc_bytes(be, 2 * E * sizeof(double));
        op_column_means(ref, x, N, E);
        be->ops->column_means(be, d, dx.p, N, E);
        be->ops->column_means(be, d + E, dx.p, N, E);
        double *got = gt_download_bytes(be, d, 2 * E * sizeof(double));
        char what[64];
        snprintf(what, sizeof what, "column_means N=%d E=%d", N, E);
        for (int e = 0; e < E; e++) check_sum_double(e == 0 ? what : "  column", got[e], ref[e], ref[e], N);
        gt_check_same_host_bits("column_means run twice", got, got + E, E * sizeof(double));
        free(got), free(ref), free(x), gt_free(be, dx), backend_free(be, d);
    }
}

// ---- conversion -------------------------------------------------------------------------------
static void test_convert(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    const size_t n = 100000;
    float *x = gt_random(n, 5000, 100.0);
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 1e30f,
                             -1e30f, 1e-30f, 5.96e-8f, 3e-8f, 6.1e-5f, 1.0f + 0x1p-8f, 1.0f + 0x1p-9f,
                             1.0f + 3 * 0x1p-9f, 0x1p-126f, 0x1p-149f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[i] = special[i];
    const NumType types[] = {NUM_F32, NUM_BF16, NUM_F16};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) {
            float *src = gt_copy_floats(x, n);
            gt_round_host(src, n, types[s]);   // what the source buffer holds
            Buf bs = gt_upload(be, src, n, types[s]), bd = gt_alloc(be, n, types[d]);
            be->ops->convert(be, bd, bs, n);
            float *got = gt_download(be, bd, n), *want = gt_copy_floats(src, n);
            gt_round_host(want, n, types[d]);
            for (size_t i = 0; i < n; i++) {
                bool same = isnan(want[i]) ? isnan(got[i]) : memcmp(&got[i], &want[i], sizeof(float)) == 0;
                if (!same)
                    fail_msg("convert %s -> %s: element %zu (%.9g): got %.9g want %.9g", num_type_name(types[s]),
                             num_type_name(types[d]), i, src[i], got[i], want[i]);
            }
            printf("  convert %s -> %s: exact\n", num_type_name(types[s]), num_type_name(types[d]));
            free(src), free(got), free(want), gt_free(be, bs), gt_free(be, bd);
        }
    free(x);
}

// ---- memory, copies, errors -------------------------------------------------------------------
static void test_memory_and_errors(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    printf("  description: %s\n", be->description);
    assert_true(strncmp(be->description, "cuda:0 ", 7) == 0);
    assert_non_null(strstr(be->description, "(sm_"));
    assert_non_null(strstr(be->description, "bf16)"));
    assert_int_equal(be->compute, NUM_BF16);
    assert_false(be->host_memory);

    size_t used0, peak0, used1, peak1, used2;
    be->ops->memory(be, &used0, &peak0);
    const size_t bytes = 3 * 1000 * 1000 + 5;
    void *p = NULL;
    assert_int_equal(backend_alloc(be, bytes, &p), SPES_OK);
    be->ops->memory(be, &used1, &peak1);
    assert_true(used1 >= used0 + bytes && peak1 >= used1);
    unsigned char *h = gt_download_bytes(be, p, bytes);   // zeroed
    for (size_t i = 0; i < bytes; i++)
        if (h[i]) fail_msg("alloc: byte %zu is %u, not 0", i, h[i]);
    free(h);

    // upload, copy, zero, download
    float *x = gt_random(1000, 6000, 1.0);
    void *q = gt_alloc_bytes(be, 4000);
    assert_int_equal(be->ops->upload(be, p, x, 4000), SPES_OK);
    be->ops->copy(be, q, p, 4000);
    be->ops->zero(be, p, 2000);
    float *back = gt_download_bytes(be, q, 4000), *half = gt_download_bytes(be, p, 4000);
    gt_check_same_host_bits("upload + copy + download", back, x, 4000);
    for (int i = 0; i < 500; i++) assert_true(half[i] == 0.0f);
    gt_check_same_host_bits("zero leaves the rest", half + 500, x + 500, 2000);
    free(back), free(half), free(x);
    backend_free(be, q);
    backend_free(be, p);
    be->ops->memory(be, &used2, NULL);
    assert_true(used2 == used0);

    // a failed op is reported by the next sync, with where it happened, then cleared
    float *dummy = gt_alloc_bytes(be, 64);
    be->ops->gemm(be, false, false, 4, 4, 4, 1.0f, buf_f32(dummy), 2 /* lda < K */, buf_f32(dummy), 4, 0.0f,
                  buf_f32(dummy), 4);
    assert_int_equal(backend_sync(be), SPES_ERR);
    printf("  reported: %s\n", spes_last_error());
    assert_non_null(strstr(spes_last_error(), "cuda_gemm"));
    assert_non_null(strstr(spes_last_error(), "gemm.cu"));
    assert_int_equal(backend_sync(be), SPES_OK);
    backend_free(be, dummy);

    // an impossible allocation fails with a message, the backend stays usable
    void *huge = NULL;
    assert_int_equal(backend_alloc(be, (size_t)1 << 50, &huge), SPES_ERR);
    printf("  reported: %s\n", spes_last_error());
    assert_null(huge);
    assert_int_equal(backend_sync(be), SPES_OK);
}

// A model created frozen holds its parameters (fp32 master + bf16 compute copy) and no
// gradient buffer; setting what trains adds exactly those gradients; freeing returns it all.
// (Created trainable, it would hold gradients for every tensor first: 4 bytes per parameter
// more at the peak of a SPES peer or an evaluation.)
static void test_model_created_frozen(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    ModelConfig cfg;
    assert_int_equal(model_config_preset("tiny", &cfg), SPES_OK);
    size_t used0, used1, used2, used3;
    be->ops->memory(be, &used0, NULL);
    Model m;
    assert_int_equal(model_create_frozen_on(&m, &cfg, be), SPES_OK);
    be->ops->memory(be, &used1, NULL);
    const size_t P = m.table.total_numel;
    assert_null(m.grads);
    assert_int_equal(used1 - used0, P * (sizeof(float) + sizeof(uint16_t)));
    assert_int_equal(model_set_trainable_experts(&m, 1, 2), SPES_OK);
    be->ops->memory(be, &used2, NULL);
    assert_true(m.table.trainable_numel > 0 && m.table.trainable_numel < P);
    assert_int_equal(used2 - used1, m.table.trainable_numel * sizeof(float));
    model_free(&m);
    be->ops->memory(be, &used3, NULL);
    assert_int_equal(used3, used0);
}

// ---- AdamW on the aux queue under the next forward (src/train/overlap_step.h) -------------------
// Two queues really overlap here: bit-identical to the plain step, or an update raced the
// forward that reads its part (a missing wait). The aux queue is held 20 ms at its start and
// after each part (SPES_CUDA_AUX_DELAY_US), far longer than a layer's forward of bench-small,
// so a missing wait reads the old weights for certain: the control skips layer 1's wait and
// must see other bits.
static int unset_aux_delay(void **state) {
    (void)state;
    unsetenv("SPES_CUDA_AUX_DELAY_US");
    return 0;
}
static void test_overlap_step(void **state) {
    (void)state;
    Backend *be = cuda_test_backend(PRECISION_AMP_BF16);
    overlap_step_vs_plain(be, "bench-small", 4, 256, -1);
    setenv("SPES_CUDA_AUX_DELAY_US", "20000", 1);   // also cleared by the teardown if a check fails
    overlap_step_vs_plain(be, "bench-small", 4, 256, -1);
    overlap_step_vs_plain(be, "bench-small", 4, 256, 2);   // part 2: layer 1
    unsetenv("SPES_CUDA_AUX_DELAY_US");
}

// ---- device selection (runs with or without a GPU) ---------------------------------------------
static void test_device_selection(void **state) {
    (void)state;
#ifdef SPES_WITH_CUDA
    int count = cuda_device_count();   // must neither print nor crash without a driver
    printf("  cuda_device_count() = %d, compiled: %s\n", count, backend_compiled());
    assert_true(count >= 0);
    Backend *be = NULL;
    assert_int_equal(backend_open("auto", PRECISION_FP32, &be), SPES_OK);
    assert_string_equal(be->name, count > 0 ? "cuda" : "cpu");
    backend_close(be);
    if (count == 0) {
        assert_int_equal(backend_open("cuda", PRECISION_AMP_BF16, &be), SPES_ERR);
        printf("  cuda without a GPU: %s\n", spes_last_error());
        assert_non_null(strstr(spes_last_error(), "no NVIDIA GPU"));
    } else {
        assert_int_equal(backend_open("cuda:1023", PRECISION_AMP_BF16, &be), SPES_ERR);
        printf("  cuda:1023: %s\n", spes_last_error());
    }
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_selection),
        cmocka_unit_test(test_memory_and_errors),
        cmocka_unit_test(test_model_created_frozen),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_gemm_fp32),
        cmocka_unit_test(test_gemm_bf16),
        cmocka_unit_test(test_gemm_f16),
        cmocka_unit_test(test_gemm_mixed_types),
        cmocka_unit_test(test_gemm_k0),
        cmocka_unit_test(test_gemm_deterministic),
        cmocka_unit_test(test_gemm_residual),
        cmocka_unit_test(test_experts_fp32),
        cmocka_unit_test(test_experts_bf16),
        cmocka_unit_test(test_experts_f16),
        cmocka_unit_test(test_experts_deterministic),
        cmocka_unit_test(test_experts_speed),
        cmocka_unit_test(test_lm_head_speed),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test_teardown(test_overlap_step, unset_aux_delay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
