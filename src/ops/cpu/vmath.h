// Vectorisable math for the CPU kernels (private to src/ops/cpu).
//
// Without -ffast-math, GCC neither vectorises calls to expf nor reductions over floats
// (they would reorder additions). These helpers are plain inline code the compiler turns
// into AVX2/AVX-512 loops, with a fixed summation order (16 partial sums, then in order),
// so results stay deterministic.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

// exp(x) for float, max relative error ~2 ulp (Cephes-style: x = n*ln2 + r, |r| <= ln2/2,
// degree-6 polynomial for exp(r), 2^(n-1) by exponent bits, times 2). Flushes results
// below e^-86.5 (~3e-38, where floats lose precision anyway) to 0, including exp(-inf);
// +inf above 88.72; NaN in, NaN out.
static inline float vexpf(float x) {
    const float hi = 88.7228393f, lo = -86.5f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    xc = xc != xc ? 0.0f : xc;   // NaN: any finite stand-in (NaN to int below is undefined); NaN is returned
    // n = round(x / ln2) by the 1.5*2^23 trick: floorf is a libm call GCC will not inline
    // (so it would block vectorisation) without -ffast-math.
    float n = (xc * 1.44269504088896341f + 0x1.8p23f) - 0x1.8p23f;
    float r = xc - n * 0.693359375f;       // ln2 split in two for an exact product
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 126) << 23;   // n in [-125, 128]: 2^(n-1) is a normal float
    float scale;
    memcpy(&scale, &e, sizeof scale);
    float y = p * scale * 2.0f;
    y = x > hi ? INFINITY : y;
    y = x < lo ? 0.0f : y;
    return x != x ? x : y;
}

#define VLANES 16

// max over x[0..n)
static inline float vmaxf(const float *x, int n) {
    float acc[VLANES];
    for (int j = 0; j < VLANES; j++) acc[j] = -INFINITY;
    int i = 0;
    for (; i + VLANES <= n; i += VLANES)
        for (int j = 0; j < VLANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    float m = -INFINITY;
    for (int j = 0; j < VLANES; j++) m = acc[j] > m ? acc[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// sum over x[0..n) of exp(x - shift)
static inline float vsum_exp(const float *x, int n, float shift) {
    float acc[VLANES] = {0};
    int i = 0;
    for (; i + VLANES <= n; i += VLANES)
        for (int j = 0; j < VLANES; j++) acc[j] += vexpf(x[i + j] - shift);
    float s = 0.0f;
    for (int j = 0; j < VLANES; j++) s += acc[j];
    for (; i < n; i++) s += vexpf(x[i] - shift);
    return s;
}

// sum over x[0..n) of a[i] * b[i]
static inline float vdot(const float *a, const float *b, int n) {
    float acc[VLANES] = {0};
    int i = 0;
    for (; i + VLANES <= n; i += VLANES)
        for (int j = 0; j < VLANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (int j = 0; j < VLANES; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// sum over x[0..n)
static inline float vsum(const float *x, int n) {
    float acc[VLANES] = {0};
    int i = 0;
    for (; i + VLANES <= n; i += VLANES)
        for (int j = 0; j < VLANES; j++) acc[j] += x[i + j];
    float s = 0.0f;
    for (int j = 0; j < VLANES; j++) s += acc[j];
    for (; i < n; i++) s += x[i];
    return s;
}

// sum over i of a[i] * b[i] * c[i]
static inline float vdot3(const float *a, const float *b, const float *c, int n) {
    float acc[VLANES] = {0};
    int i = 0;
    for (; i + VLANES <= n; i += VLANES)
        for (int j = 0; j < VLANES; j++) acc[j] += a[i + j] * b[i + j] * c[i + j];
    float s = 0.0f;
    for (int j = 0; j < VLANES; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i] * c[i];
    return s;
}
