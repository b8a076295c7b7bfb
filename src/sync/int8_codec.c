// int8 delta codec (see int8_codec.h).
#include "sync/int8_codec.h"

#include <math.h>

void int8_encode(const float *d, size_t n, int8_t *q, float *scale) {
    for (size_t b = 0, at = 0; at < n; b++, at += INT8_BLOCK) {
        size_t len = n - at < INT8_BLOCK ? n - at : INT8_BLOCK;
        float maxabs = 0.0f;
        for (size_t i = 0; i < len; i++) maxabs = fmaxf(maxabs, fabsf(d[at + i]));
        float s = maxabs / 127.0f;
        scale[b] = s;
        for (size_t i = 0; i < len; i++) {
            float v = s > 0.0f ? rintf(d[at + i] / s) : 0.0f;
            q[at + i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

void int8_reconstruct(const float *base, const int8_t *q, const float *scale, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) {
        float step = (float)q[i] * scale[i / INT8_BLOCK];
        out[i] = base[i] + step;
    }
}

void int8_encode_feedback(const float *w, const float *base, float *residual, size_t n, int8_t *q, float *scale) {
    for (size_t i = 0; i < n; i++) residual[i] = (w[i] - base[i]) + residual[i];   // d, in place
    int8_encode(residual, n, q, scale);
    for (size_t i = 0; i < n; i++) residual[i] -= (float)q[i] * scale[i / INT8_BLOCK];
}

void int8_encode_change(const float *a, const float *base, size_t n, int8_t *q, float *scale, float *scratch) {
    for (size_t i = 0; i < n; i++) scratch[i] = a[i] - base[i];
    int8_encode(scratch, n, q, scale);
}

bool int8_check(const int8_t *q, const float *scale, size_t n, size_t *where, const char **why) {
    for (size_t b = 0; b < int8_blocks(n); b++)
        if (!(scale[b] >= 0.0f && scale[b] <= INT8_MAX_SCALE)) {   // also NaN
            *where = b;
            *why = isnan(scale[b]) ? "scale is NaN" : isinf(scale[b]) ? "scale is infinite"
                   : scale[b] < 0.0f                 ? "scale is negative"
                                                     : "scale is too large (over 1e30)";
            return false;
        }
    for (size_t i = 0; i < n; i++)
        if (q[i] == -128) {
            *where = i;
            *why = "value -128 (the code is symmetric, -127..127)";
            return false;
        }
    return true;
}
