// Shared helpers of the GPU tests (tests/gpu/test_*.c, cmocka; `make test-gpu`).
//
// Every test compares a CUDA op against the cpu kernel of the same name (src/ops/cpu/cpu_ops.h)
// on random inputs with a fixed seed. Pattern:
//
//   Backend *be = cuda_test_backend(PRECISION_AMP_BF16);      // skip()s when no GPU is visible
//   float *x = gt_random(n, 1, 1.0);                          // host fp32 reference input
//   gt_round_host(x, n, NUM_BF16);                            // the reference sees what the GPU sees
//   Buf dx = gt_upload(be, x, n, NUM_BF16);                   // device copy, converted
//   Buf dy = gt_alloc(be, n, NUM_BF16);                       // poisoned (NaN) output
//   be->ops->op(be, dy, dx, ...);
//   gt_sync_ok(be);                                           // fails the test with the backend's message
//   float *y = gt_download(be, dy, n);                        // back to host fp32
//   op_...(ref, x, ...);                                      // cpu reference
//   gt_check("op y", y, ref, n, tol);                         // max|y-ref| / max|ref| <= tol, NaN fails
//   gt_free(be, dy); ...
//
// Outputs are poisoned with 0xFF bytes (NaN in f32, bf16 and f16) so an element the kernel
// did not write fails the comparison. gt_rel_err treats any NaN/Inf in `got` as an infinite
// error (fmax would silently drop it).
//
// Tolerances: gt_unit_roundoff(t) is u = 2^-p for a type with p significand bits
// (f32 2^-24, bf16 2^-8, f16 2^-11); derive bf16 tolerances from it next to each check.
//
// Header-only (static inline), so each test program is a single .c file.
#pragma once
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/rng.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_ops.h"
#ifdef SPES_WITH_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

// ---- the device --------------------------------------------------------------------------
// True when this binary has CUDA and at least one GPU is visible (no driver: false, silently).
static inline bool gpu_available(void) {
#ifdef SPES_WITH_CUDA
    static int cached = -1;
    if (cached < 0) cached = cuda_device_count() > 0;
    return cached == 1;
#else
    return false;
#endif
}

// One cuda:0 backend per precision, opened on first use and closed at exit. Calls cmocka's
// skip() (the test is reported SKIPPED, never passed) when no GPU is visible.
static Backend *gt_backends_[3];
static inline void gt_close_backends_(void) {
    for (int i = 0; i < 3; i++)
        if (gt_backends_[i]) backend_close(gt_backends_[i]), gt_backends_[i] = NULL;
}
static inline Backend *cuda_test_backend(Precision precision) {
    if (!gpu_available()) {
        printf("no GPU visible: skipped\n");
        skip();
    }
    if (!gt_backends_[precision]) {
        Backend *be = NULL;
        if (backend_open("cuda", precision, &be) != SPES_OK) fail_msg("backend_open(cuda): %s", spes_last_error());
        static bool registered = false;
        if (!registered) atexit(gt_close_backends_), registered = true;
        gt_backends_[precision] = be;
        printf("backend: %s (%s)\n", be->description, precision_name(precision));
    }
    return gt_backends_[precision];
}

// Waits for the backend and fails the test with its message if an op failed.
static inline void gt_sync_ok(Backend *be) {
    if (backend_sync(be) != SPES_OK) fail_msg("backend_sync: %s", spes_last_error());
}

// ---- host number types -------------------------------------------------------------------
static inline uint32_t gt_f32_bits_(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float gt_f32_of_bits_(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// fp32 -> bf16 bits, round to nearest even (as __float2bfloat16); NaN stays NaN.
static inline uint16_t gt_bf16_of_f32(float x) {
    uint32_t u = gt_f32_bits_(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float gt_f32_of_bf16(uint16_t h) { return gt_f32_of_bits_((uint32_t)h << 16); }

// fp32 -> IEEE half bits, round to nearest even (as __float2half), overflow to Inf,
// subnormals kept.
static inline uint16_t gt_f16_of_f32(float x) {
    uint32_t u = gt_f32_bits_(x);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          // NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         // >= 65520 rounds to Inf
    if (a < 0x38800000u) {                                           // below 2^-14: subnormal or 0
        // value = a_float; half subnormal unit is 2^-24: round(a_float * 2^24) to nearest even
        float af = gt_f32_of_bits_(a);
        float scaled = af * 16777216.0f;                             // exact (power of two)
        float r = nearbyintf(scaled);                                // current mode: nearest even
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t mant = a & 0x7fffffu, e = (a >> 23) - 127 + 15;
    uint32_t h = (e << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;        // carry into the exponent is right
    return (uint16_t)(sign | h);
}
static inline float gt_f32_of_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);                   // m * 2^-24
        return sign ? -v : v;
    }
    if (e == 31) return gt_f32_of_bits_(sign | 0x7f800000u | (m << 13));
    return gt_f32_of_bits_(sign | ((e - 15 + 127) << 23) | (m << 13));
}

// x rounded to type t and back (what a value looks like after a trip through t).
static inline float gt_round(float x, NumType t) {
    switch (t) {
    case NUM_BF16: return gt_f32_of_bf16(gt_bf16_of_f32(x));
    case NUM_F16: return gt_f32_of_f16(gt_f16_of_f32(x));
    default: return x;
    }
}
static inline void gt_round_host(float *x, size_t n, NumType t) {
    if (t == NUM_F32) return;
    for (size_t i = 0; i < n; i++) x[i] = gt_round(x[i], t);
}

// u = 2^-p, p = significand bits (with the implicit one): f32 2^-24, bf16 2^-8, f16 2^-11.
static inline double gt_unit_roundoff(NumType t) {
    return t == NUM_BF16 ? 0x1p-8 : t == NUM_F16 ? 0x1p-11 : 0x1p-24;
}

// The compute type of a precision (what cuda_backend_open sets as be->compute).
static inline NumType gt_compute_type(Precision p) {
    return p == PRECISION_AMP_BF16 ? NUM_BF16 : p == PRECISION_AMP_FP16 ? NUM_F16 : NUM_F32;
}

// ---- host data ---------------------------------------------------------------------------
// n normal(0, scale) floats from a fixed seed (malloc'd; free()).
static inline float *gt_random(size_t n, uint64_t seed, double scale) {
    Rng rng;
    rng_seed(&rng, seed);
    float *x = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&rng));
    return x;
}
// n uniform floats in [lo, hi)
static inline float *gt_random_uniform(size_t n, uint64_t seed, double lo, double hi) {
    Rng rng;
    rng_seed(&rng, seed);
    float *x = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_uniform(&rng));
    return x;
}
// n ints uniform in [0, below)
static inline int32_t *gt_random_ints(size_t n, uint64_t seed, int32_t below) {
    Rng rng;
    rng_seed(&rng, seed);
    int32_t *x = malloc((n ? n : 1) * sizeof(int32_t));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)rng_below(&rng, (uint64_t)below);
    return x;
}
static inline float *gt_copy_floats(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(y);
    if (n) memcpy(y, x, n * sizeof(float));
    return y;
}

// ---- device buffers ----------------------------------------------------------------------
// Re-poisons an existing buffer (before a second run of an op into the same output).
static inline void gt_poison(Backend *be, void *p, size_t bytes) {
    unsigned char *poison = malloc(bytes ? bytes : 1);
    assert_non_null(poison);
    memset(poison, 0xff, bytes);
    if (bytes && be->ops->upload(be, p, poison, bytes) != SPES_OK) fail_msg("upload: %s", spes_last_error());
    free(poison);
}
// Raw device bytes poisoned with 0xFF, e.g. int32 index arrays or double results.
static inline void *gt_alloc_bytes(Backend *be, size_t bytes) {
    void *p = NULL;
    if (backend_alloc(be, bytes ? bytes : 1, &p) != SPES_OK) fail_msg("alloc %zu bytes: %s", bytes, spes_last_error());
    gt_poison(be, p, bytes);
    return p;
}
// An n-element device buffer of type t, poisoned (NaN in every float type).
static inline Buf gt_alloc(Backend *be, size_t n, NumType t) {
    return buf_of(gt_alloc_bytes(be, n * num_type_size(t)), t);
}
static inline void gt_free(Backend *be, Buf b) { backend_free(be, b.p); }

// Host fp32 -> device buffer of type t (converted on the host, round to nearest even).
static inline void gt_upload_into(Backend *be, Buf dst, const float *host, size_t n) {
    size_t es = num_type_size(dst.t), bytes = n * es;
    if (n == 0) return;
    void *tmp = malloc(bytes);
    assert_non_null(tmp);
    if (dst.t == NUM_F32) memcpy(tmp, host, bytes);
    else
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)tmp)[i] = dst.t == NUM_BF16 ? gt_bf16_of_f32(host[i]) : gt_f16_of_f32(host[i]);
    if (be->ops->upload(be, dst.p, tmp, bytes) != SPES_OK) fail_msg("upload: %s", spes_last_error());
    free(tmp);
}
static inline Buf gt_upload(Backend *be, const float *host, size_t n, NumType t) {
    Buf b = gt_alloc(be, n, t);
    gt_upload_into(be, b, host, n);
    return b;
}
// Raw bytes (int32 indices, ...) to a new device buffer.
static inline void *gt_upload_bytes(Backend *be, const void *host, size_t bytes) {
    void *p = gt_alloc_bytes(be, bytes);
    if (bytes && be->ops->upload(be, p, host, bytes) != SPES_OK) fail_msg("upload: %s", spes_last_error());
    return p;
}

// Device buffer of n elements -> new host fp32 array (malloc'd; free()). Syncs first (and
// fails the test if an op failed).
static inline float *gt_download(Backend *be, Buf src, size_t n) {
    gt_sync_ok(be);
    size_t es = num_type_size(src.t), bytes = n * es;
    float *out = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(out);
    if (n == 0) return out;
    void *tmp = malloc(bytes);
    assert_non_null(tmp);
    if (be->ops->download(be, tmp, src.p, bytes) != SPES_OK) fail_msg("download: %s", spes_last_error());
    if (src.t == NUM_F32) memcpy(out, tmp, bytes);
    else
        for (size_t i = 0; i < n; i++)
            out[i] = src.t == NUM_BF16 ? gt_f32_of_bf16(((uint16_t *)tmp)[i]) : gt_f32_of_f16(((uint16_t *)tmp)[i]);
    free(tmp);
    return out;
}
// Raw bytes back (malloc'd), e.g. for determinism memcmp or double/int32 results.
static inline void *gt_download_bytes(Backend *be, const void *src, size_t bytes) {
    gt_sync_ok(be);
    void *out = malloc(bytes ? bytes : 1);
    assert_non_null(out);
    if (bytes && be->ops->download(be, out, src, bytes) != SPES_OK) fail_msg("download: %s", spes_last_error());
    return out;
}

// ---- comparisons -------------------------------------------------------------------------
// max_i |got[i] - ref[i]| / max(max_i |ref[i]|, floor); +Inf when got has a NaN/Inf where
// ref is finite (an unwritten, poisoned element) or ref is NaN where got is not.
static inline double gt_rel_err_floor(const float *got, const float *ref, size_t n, double floor) {
    double diff = 0.0, mag = floor;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (isnan(r) && isnan(g)) continue;
        if (!isfinite(g) || !isfinite(r)) {
            if (g == r) continue;                      // same infinity
            return INFINITY;
        }
        diff = fmax(diff, fabs(g - r));
        mag = fmax(mag, fabs(r));
    }
    return diff / mag;
}
// With a 1e-6 floor: an all-zero reference compares absolutely.
static inline double gt_rel_err(const float *got, const float *ref, size_t n) {
    return gt_rel_err_floor(got, ref, n, 1e-6);
}
// Index of the worst element (for messages).
static inline size_t gt_worst_index(const float *got, const float *ref, size_t n) {
    size_t w = 0;
    double worst = -1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(d)) d = INFINITY;
        if (d > worst) worst = d, w = i;
    }
    return w;
}

// Prints "what: rel err E (tol T)" and fails the test when E > tol, naming the worst element.
static inline void gt_check(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = gt_rel_err(got, ref, n);
    printf("  %-40s rel err %.3e (tol %.1e)\n", what, e, tol);
    if (!(e <= tol)) {
        size_t w = gt_worst_index(got, ref, n);
        fail_msg("%s: rel err %.3e > %.1e; worst [%zu] got %.9g ref %.9g", what, e, tol, w, n ? got[w] : 0.0f,
                 n ? ref[w] : 0.0f);
    }
}
// Per-element bounds: |got[i] - ref[i]| <= bound[i] for every i (NaN in both passes, NaN or
// Inf in one fails). Prints the worst ratio err/bound; fails naming the first violation.
static inline void gt_check_bounds(const char *what, const float *got, const float *ref, const double *bound,
                                   size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (isnan(g) && isnan(r)) continue;
        double err = (isfinite(g) && isfinite(r)) ? fabs(g - r) : (g == r ? 0.0 : INFINITY);
        double ratio = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0.0);
        if (ratio > worst) worst = ratio;
        if (!(err <= bound[i]))
            fail_msg("%s: element %zu: got %.9g ref %.9g, |err| %.3e > bound %.3e", what, i, g, r, err, bound[i]);
    }
    printf("  %-40s worst err/bound %.3f\n", what, worst);
}

// Same for doubles (reduction results).
static inline void gt_check_double(const char *what, const double *got, const double *ref, size_t n, double tol) {
    double diff = 0.0, mag = 1e-300;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) diff = INFINITY;
        else diff = fmax(diff, fabs(got[i] - ref[i]));
        mag = fmax(mag, fabs(ref[i]));
    }
    double e = diff / mag;
    printf("  %-40s rel err %.3e (tol %.1e)\n", what, e, tol);
    if (!(e <= tol)) fail_msg("%s: rel err %.3e > %.1e (got[0] %.17g ref[0] %.17g)", what, e, tol, got[0], ref[0]);
}
// Exact equality of two device buffers' bytes (determinism: same inputs, same bits).
static inline void gt_check_same_bits(Backend *be, const char *what, const void *a, const void *b, size_t bytes) {
    unsigned char *ha = gt_download_bytes(be, a, bytes), *hb = gt_download_bytes(be, b, bytes);
    int same = memcmp(ha, hb, bytes) == 0;
    printf("  %-40s %s\n", what, same ? "bit-identical" : "DIFFERENT");
    free(ha), free(hb);
    if (!same) fail_msg("%s: two runs on the same inputs gave different bits", what);
}
// Same for two host arrays.
static inline void gt_check_same_host_bits(const char *what, const void *a, const void *b, size_t bytes) {
    int same = memcmp(a, b, bytes) == 0;
    printf("  %-40s %s\n", what, same ? "bit-identical" : "DIFFERENT");
    if (!same) fail_msg("%s: two runs on the same inputs gave different bits", what);
}
