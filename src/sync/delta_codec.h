// The block codec of delta sync payloads (spes_config.payload_dtype: int8 or int4), pure: no I/O.
// One set of functions serves both code widths; a DeltaCodec says which (docs/communication.md).
//
// A tensor's change d (float32, n values) is cut into blocks of DELTA_BLOCK (256) consecutive
// values (the last block may be shorter). Each block b gets one scale, with qmax = 2^(bits-1) - 1
// (127 for int8, 7 for int4):
//     s_b = max_i |d_i| / qmax        (0 for an all-zero block)
// rounded to the codec's scale dtype (int8: float32, exact; int4: bfloat16, round to nearest
// even, so the float in memory is exactly the 2 bytes sent), and each value the signed code
//     q_i = clamp(rint(d_i / s_b), -qmax, qmax)   (rint: ties to even; 0 when s_b = 0)
// computed with the rounded scale. It decodes to q_i * s_b. The range is symmetric: -qmax-1
// (-128, -8) never appears and a decoder refuses it. A reconstruction is always base + q * s,
// computed by delta_reconstruct, so the server and every peer holding the same base get the same
// float32 bits. Codes are int8_t in memory for both widths; int4 codes are packed two per byte
// and zstd-compressed only on the wire (delta_payload.h).
//
// Error feedback (the peer): the change sent is d = (w - base) + e, and what rounding lost,
// e' = d - q * s, is carried to the next round's change. |e'_i| <= s_b / 2 for every value (a
// bf16 scale is at most 2^-9 relative below max|d| / 7, so the largest value is at most 7.014
// steps: the clamp to 7 loses less than half a step).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

#define DELTA_BLOCK 256
// Largest scale a decoder accepts: q * s stays far from float overflow for any q.
#define DELTA_MAX_SCALE 1e30f

typedef struct {
    const char *name;       // "int8" | "int4" (messages)
    const char *encoding;   // "int8-delta" | "int4-delta": payload metadata, Hello encodings, view names
    const char *view_omit_own;   // the view name of such a delta without the peer's own experts
    const char *wire;       // HelloRequest.payload_dtype: "I8" | "I4"
    int bits;               // code width: 8 | 4
    int qmax;               // largest code magnitude: 127 | 7
    DType scale_dtype;      // the scales on the wire: F32 | BF16
    bool zstd;              // the packed codes of each tensor go as one zstd frame (int4; int8: raw)
} DeltaCodec;

extern const DeltaCodec DELTA_INT8, DELTA_INT4;

// The codec of a payload's spes_encoding, or of a Hello payload dtype; NULL when none is.
const DeltaCodec *delta_codec_by_encoding(const char *encoding);
const DeltaCodec *delta_codec_by_wire(const char *wire);

static inline size_t delta_blocks(size_t n) { return (n + DELTA_BLOCK - 1) / DELTA_BLOCK; }

// Quantises d[n] into q[n] and scale[delta_blocks(n)]. d must be finite.
void delta_encode(const DeltaCodec *c, const float *d, size_t n, int8_t *q, float *scale);

// out[i] = base[i] + q[i] * scale[i / DELTA_BLOCK] (out may be base).
void delta_reconstruct(const float *base, const int8_t *q, const float *scale, size_t n, float *out);

// The peer's side of one tensor with error feedback: d = (w - base) + residual, encoded into
// q/scale; residual becomes d - q * s. w, base, residual: n floats.
void delta_encode_feedback(const DeltaCodec *c, const float *w, const float *base, float *residual, size_t n, int8_t *q,
                          float *scale);

// What the server sends down for one tensor whose aggregate is a and whose previous aggregate
// (the base every peer holds) is base: q/scale of a - base. Both sides then reconstruct with
// delta_reconstruct(base, q, scale).
void delta_encode_change(const DeltaCodec *c, const float *a, const float *base, size_t n, int8_t *q, float *scale,
                        float *scratch);

// Checks an encoded tensor from outside: every scale finite, >= 0 and <= DELTA_MAX_SCALE, every
// code in [-qmax, qmax]. Returns true when valid; else *where is the bad block (scale) or value
// index and *why says what is wrong.
bool delta_check(const DeltaCodec *c, const int8_t *q, const float *scale, size_t n, size_t *where, const char **why);
