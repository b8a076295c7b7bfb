// The block codec of delta payloads, int8 or int4 codes (see delta_codec.h).
#include "sync/delta_codec.h"

#include <math.h>
#include <string.h>

const DeltaCodec DELTA_INT8 = {.name = "int8", .encoding = "int8-delta",
                               .view_omit_own = "int8-delta+omit-own-experts", .wire = "I8", .bits = 8, .qmax = 127,
                               .scale_dtype = DTYPE_F32};
const DeltaCodec DELTA_INT4 = {.name = "int4", .encoding = "int4-delta",
                               .view_omit_own = "int4-delta+omit-own-experts", .wire = "I4", .bits = 4, .qmax = 7,
                               .scale_dtype = DTYPE_BF16, .zstd = true};

static const DeltaCodec *const CODECS[] = {&DELTA_INT8, &DELTA_INT4};

const DeltaCodec *delta_codec_by_encoding(const char *encoding) {
    for (size_t i = 0; encoding && i < sizeof CODECS / sizeof *CODECS; i++)
        if (strcmp(encoding, CODECS[i]->encoding) == 0) return CODECS[i];
    return NULL;
}

const DeltaCodec *delta_codec_by_wire(const char *wire) {
    for (size_t i = 0; wire && i < sizeof CODECS / sizeof *CODECS; i++)
        if (strcmp(wire, CODECS[i]->wire) == 0) return CODECS[i];
    return NULL;
}

// The scale as the codec sends it (a bf16 scale is the nearest bfloat16, widened back).
static float wire_scale(const DeltaCodec *c, float s) {
    return c->scale_dtype == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

void delta_encode(const DeltaCodec *c, const float *d, size_t n, int8_t *q, float *scale) {
    const float qmax = (float)c->qmax;
    for (size_t b = 0, at = 0; at < n; b++, at += DELTA_BLOCK) {
        size_t len = n - at < DELTA_BLOCK ? n - at : DELTA_BLOCK;
        float maxabs = 0.0f;
        for (size_t i = 0; i < len; i++) maxabs = fmaxf(maxabs, fabsf(d[at + i]));
        float s = wire_scale(c, maxabs / qmax);
        scale[b] = s;
        for (size_t i = 0; i < len; i++) {
            float v = s > 0.0f ? rintf(d[at + i] / s) : 0.0f;
            q[at + i] = (int8_t)(v > qmax ? qmax : v < -qmax ? -qmax : v);
        }
    }
}

void delta_reconstruct(const float *base, const int8_t *q, const float *scale, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) {
        float step = (float)q[i] * scale[i / DELTA_BLOCK];
        out[i] = base[i] + step;
    }
}

void delta_encode_feedback(const DeltaCodec *c, const float *w, const float *base, float *residual, size_t n, int8_t *q,
                          float *scale) {
    for (size_t i = 0; i < n; i++) residual[i] = (w[i] - base[i]) + residual[i];   // d, in place
    delta_encode(c, residual, n, q, scale);
    for (size_t i = 0; i < n; i++) residual[i] -= (float)q[i] * scale[i / DELTA_BLOCK];
}

void delta_encode_change(const DeltaCodec *c, const float *a, const float *base, size_t n, int8_t *q, float *scale,
                        float *scratch) {
    for (size_t i = 0; i < n; i++) scratch[i] = a[i] - base[i];
    delta_encode(c, scratch, n, q, scale);
}

bool delta_check(const DeltaCodec *c, const int8_t *q, const float *scale, size_t n, size_t *where, const char **why) {
    for (size_t b = 0; b < delta_blocks(n); b++)
        if (!(scale[b] >= 0.0f && scale[b] <= DELTA_MAX_SCALE)) {   // also NaN
            *where = b;
            *why = isnan(scale[b]) ? "scale is NaN" : isinf(scale[b]) ? "scale is infinite"
                   : scale[b] < 0.0f                 ? "scale is negative"
                                                     : "scale is too large (over 1e30)";
            return false;
        }
    for (size_t i = 0; i < n; i++)
        if (q[i] < -c->qmax || q[i] > c->qmax) {
            *where = i;
            *why = c->bits == 8 ? "value -128 (the code is symmetric, -127..127)"
                                : "value -8 (the code is symmetric, -7..7)";
            return false;
        }
    return true;
}
