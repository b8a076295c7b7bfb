// int8 delta codec of the sync payloads (spes_config.payload_dtype: int8), pure: no I/O.
//
// A tensor's change d (float32, n values) is cut into blocks of INT8_BLOCK consecutive values
// (the last block may be shorter). Each block b gets one float32 scale
//     s_b = max_i |d_i| / 127        (0 for an all-zero block)
// and each value the int8
//     q_i = clamp(rint(d_i / s_b), -127, 127)   (rint: round to nearest, ties to even; 0 when s_b = 0)
// It decodes to q_i * s_b. -128 never appears (the range is symmetric); a decoder refuses it.
// A reconstruction is always base + q * s, computed by int8_reconstruct, so that the server and
// every peer that holds the same base get the same float32 bits.
//
// Error feedback (the peer): the change sent is d = (w - base) + e, and what rounding lost,
// e' = d - q * s, is carried to the next round's change. |e'_i| <= s_b / 2 for every value.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INT8_BLOCK 256
// Largest scale a decoder accepts: q * s stays far from float overflow for any q.
#define INT8_MAX_SCALE 1e30f

static inline size_t int8_blocks(size_t n) { return (n + INT8_BLOCK - 1) / INT8_BLOCK; }

// Quantises d[n] into q[n] and scale[int8_blocks(n)]. d must be finite.
void int8_encode(const float *d, size_t n, int8_t *q, float *scale);

// out[i] = base[i] + q[i] * scale[i / INT8_BLOCK] (out may be base).
void int8_reconstruct(const float *base, const int8_t *q, const float *scale, size_t n, float *out);

// The peer's side of one tensor with error feedback: d = (w - base) + residual, encoded into
// q/scale; residual becomes d - q * s. w, base, residual: n floats.
void int8_encode_feedback(const float *w, const float *base, float *residual, size_t n, int8_t *q, float *scale);

// What the server sends down for one tensor whose aggregate is a and whose previous aggregate
// (the base every peer holds) is base: q/scale of a - base. Both sides then reconstruct with
// int8_reconstruct(base, q, scale).
void int8_encode_change(const float *a, const float *base, size_t n, int8_t *q, float *scale, float *scratch);

// Checks an encoded tensor from outside: every scale finite, >= 0 and <= INT8_MAX_SCALE, no -128.
// Returns true when valid; else *where is the bad block (scale) or value index and *why says
// what is wrong.
bool int8_check(const int8_t *q, const float *scale, size_t n, size_t *where, const char **why);
