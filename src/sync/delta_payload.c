// Delta payloads as safetensors, int8 or int4 codes (see delta_payload.h).
#include "sync/delta_payload.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sync/aggregate_step.h"
#include "sync/model_spec.h"

// zstd level of the int4 codes: level 1 shrinks them as much as 3 or 9 do (measured on the payloads
// of a 4-peer run: 0.758 / 0.756 / 0.756 of the packed bytes), at the least CPU.
#define INT4_ZSTD_LEVEL 1

// Bytes of one tensor's codes, packed (before zstd).
static size_t code_bytes(const DeltaCodec *c, size_t numel) { return c->bits == 4 ? (numel + 1) / 2 : numel; }

// int4: q[n] (each in -7..7) packed two per byte into out[(n + 1) / 2].
static void pack_int4(const int8_t *q, size_t n, uint8_t *out) {
    for (size_t k = 0; 2 * k < n; k++) {
        uint8_t lo = (uint8_t)q[2 * k] & 0x0f, hi = 2 * k + 1 < n ? (uint8_t)q[2 * k + 1] & 0x0f : 0;
        out[k] = (uint8_t)(lo | hi << 4);
    }
}

// The inverse, in place: buf holds the (n + 1) / 2 packed bytes and becomes the n codes
// (sign-extended nibbles), filled from the end so every byte is read before it is overwritten.
// false when an odd count's padding nibble is not 0.
static bool unpack_int4(uint8_t *buf, size_t n) {
    if (n % 2 && buf[n / 2] >> 4 != 0) return false;
    for (size_t i = n; i-- > 0;) {
        int v = i % 2 ? buf[i / 2] >> 4 : buf[i / 2] & 0x0f;
        buf[i] = (uint8_t)(int8_t)(v >= 8 ? v - 16 : v);
    }
    return true;
}

// int4: the packed codes of one tensor as one zstd frame into out (capacity cap); its size.
static int compress_codes(const uint8_t *packed, size_t len, uint8_t *out, size_t cap, size_t *out_len) {
    size_t n = ZSTD_compress(out, cap, packed, len, INT4_ZSTD_LEVEL);
    if (ZSTD_isError(n)) return spes_fail("int4 payload: zstd: %s", ZSTD_getErrorName(n));
    *out_len = n;
    return SPES_OK;
}

// int4: one tensor's zstd frame (frame_len bytes from outside) decompressed into exactly `len`
// packed bytes: the frame must declare that size, be one whole frame and nothing after it.
static int decompress_codes(const uint8_t *frame, size_t frame_len, uint8_t *out, size_t len, const char *what,
                            const char *name) {
    unsigned long long declared = ZSTD_getFrameContentSize(frame, frame_len);
    if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN)
        return spes_fail("%s: tensor '%s': the codes are not a zstd frame with its size", what, name);
    if (declared != len)
        return spes_fail("%s: tensor '%s': the codes' zstd frame holds %llu bytes, expected %zu (two int4 codes a byte)",
                         what, name, declared, len);
    size_t whole = ZSTD_findFrameCompressedSize(frame, frame_len);
    if (ZSTD_isError(whole) || whole != frame_len)
        return spes_fail("%s: tensor '%s': the codes must be exactly one zstd frame (%zu bytes given)", what, name,
                         frame_len);
    size_t got = ZSTD_decompress(out, len, frame, frame_len);
    if (ZSTD_isError(got) || got != len)
        return spes_fail("%s: tensor '%s': the codes' zstd frame does not decompress (%s)", what, name,
                         ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    return SPES_OK;
}

// delta_payload_bytes of a payload stating `step` (spes_step) when it is >= 0.
static int payload_bytes(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, int step,
                         const bool *keep, const char *view, size_t *len) {
    // The tensor list delta_payload_serialize writes (codes, then `name.scale`), headers only:
    // int4's frames at ZSTD_compressBound of their packed codes, the most a frame can take.
    *len = 0;
    StWriteTensor *w = spes_calloc(2 * (size_t)n + 1, sizeof *w);
    char **names = spes_calloc((size_t)n + 1, sizeof *names);
    int rc = w && names ? SPES_OK : SPES_ERR, kept = 0;
    for (int i = 0; rc == SPES_OK && i < n; i++) {
        const DeltaTensor *t = &tensors[i];
        if (keep && !keep[i]) continue;
        StWriteTensor *codes = &w[kept++];
        *codes = (StWriteTensor){.name = t->name, .dtype = DTYPE_I8, .ndim = t->ndim};
        memcpy(codes->shape, t->shape, sizeof t->shape);
        if (c->bits == 4) {
            size_t packed = code_bytes(c, t->numel);
            *codes = (StWriteTensor){.name = t->name, .dtype = DTYPE_U8, .ndim = 1};
            codes->shape[0] = (int64_t)(c->zstd ? ZSTD_compressBound(packed) : packed);
        }
        size_t name_len = strlen(t->name) + sizeof DELTA_SCALE_SUFFIX;
        if (!(names[i] = spes_malloc(name_len))) {
            rc = SPES_ERR;
            break;
        }
        snprintf(names[i], name_len, "%s%s", t->name, DELTA_SCALE_SUFFIX);
        w[kept++] = (StWriteTensor){.name = names[i], .dtype = c->scale_dtype, .ndim = 1,
                                    .shape = {(int64_t)delta_blocks(t->numel)}};
    }
    char base[24], block[24], step_text[24];
    snprintf(base, sizeof base, "%d", base_step);
    snprintf(block, sizeof block, "%d", DELTA_BLOCK);
    snprintf(step_text, sizeof step_text, "%d", step);
    // A view's metadata: the payload's, then "spes_view" (aggregate_view_build).
    const char *keys[5] = {"spes_encoding", "spes_base_step", "spes_block"};
    const char *values[5] = {c->encoding, base, block};
    int n_meta = 3;
    if (step >= 0) keys[n_meta] = SYNC_META_STEP, values[n_meta++] = step_text;
    if (view) keys[n_meta] = "spes_view", values[n_meta++] = view;
    if (rc == SPES_OK) rc = safetensors_serialized_size(w, kept, keys, values, n_meta, len);
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(w);
    return rc;
}

int delta_payload_bytes(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, const bool *keep,
                        const char *view, size_t *len) {
    return payload_bytes(c, tensors, n, base_step, -1, keep, view, len);
}

int delta_payload_aggregate_bytes(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, int step,
                                  const bool *keep, const char *view, size_t *len) {
    return payload_bytes(c, tensors, n, base_step, step, keep, view, len);
}

// delta_payload_serialize, stating `step` (spes_step) when it is >= 0.
static int serialize_payload(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, int step,
                             uint8_t **bytes, size_t *len) {
    StWriteTensor *w = spes_calloc(2 * (size_t)n + 1, sizeof *w);
    char **names = spes_calloc((size_t)n + 1, sizeof *names);
    // The wire forms of int4 codes (packed, then a zstd frame each) and bf16 scales (int8 writes
    // the caller's arrays as they are).
    size_t frames_cap = 0, largest = 1, blocks_total = 0;
    for (int i = 0; i < n; i++) {
        size_t packed = code_bytes(c, tensors[i].numel);
        frames_cap += c->zstd ? ZSTD_compressBound(packed) : packed;
        largest = packed > largest ? packed : largest;
        blocks_total += delta_blocks(tensors[i].numel);
    }
    bool convert = c->bits == 4 || c->scale_dtype == DTYPE_BF16;
    uint8_t *frames = convert ? spes_malloc(frames_cap + 1) : NULL, *packed = convert ? spes_malloc(largest) : NULL;
    uint16_t *bf16 = convert ? spes_malloc(2 * blocks_total + 2) : NULL;
    int rc = w && names && (!convert || (frames && packed && bf16)) ? SPES_OK : SPES_ERR;
    size_t frames_at = 0, block_at = 0;
    for (int i = 0; rc == SPES_OK && i < n; i++) {
        const DeltaTensor *t = &tensors[i];
        size_t blocks = delta_blocks(t->numel);
        w[2 * i] = (StWriteTensor){.name = t->name, .dtype = DTYPE_I8, .ndim = t->ndim, .data = t->q};
        memcpy(w[2 * i].shape, t->shape, sizeof t->shape);
        if (c->bits == 4) {
            size_t len = code_bytes(c, t->numel), frame_len = len;
            pack_int4(t->q, t->numel, c->zstd ? packed : frames + frames_at);
            if (c->zstd) rc = compress_codes(packed, len, frames + frames_at, frames_cap - frames_at, &frame_len);
            if (rc != SPES_OK) break;
            w[2 * i] = (StWriteTensor){.name = t->name, .dtype = DTYPE_U8, .ndim = 1, .data = frames + frames_at};
            w[2 * i].shape[0] = (int64_t)frame_len;
            frames_at += frame_len;
        }
        size_t name_len = strlen(t->name) + sizeof DELTA_SCALE_SUFFIX;
        names[i] = spes_malloc(name_len);
        if (!names[i]) {
            rc = SPES_ERR;
            break;
        }
        snprintf(names[i], name_len, "%s%s", t->name, DELTA_SCALE_SUFFIX);
        w[2 * i + 1] = (StWriteTensor){.name = names[i], .dtype = c->scale_dtype, .ndim = 1, .data = t->scale};
        w[2 * i + 1].shape[0] = (int64_t)blocks;
        if (c->scale_dtype == DTYPE_BF16) {
            for (size_t b = 0; b < blocks; b++) bf16[block_at + b] = f32_to_bf16(t->scale[b]);   // exact: see delta_encode
            w[2 * i + 1].data = bf16 + block_at;
            block_at += blocks;
        }
    }
    char base[24], block[24], step_text[24];
    snprintf(base, sizeof base, "%d", base_step);
    snprintf(block, sizeof block, "%d", DELTA_BLOCK);
    snprintf(step_text, sizeof step_text, "%d", step);
    const char *keys[] = {"spes_encoding", "spes_base_step", "spes_block", SYNC_META_STEP};
    const char *values[] = {c->encoding, base, block, step_text};
    if (rc == SPES_OK) rc = safetensors_serialize(w, 2 * n, keys, values, step >= 0 ? 4 : 3, bytes, len);
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(w);
    free(frames);
    free(packed);
    free(bf16);
    return rc;
}

int delta_payload_serialize(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, uint8_t **bytes,
                           size_t *len) {
    return serialize_payload(c, tensors, n, base_step, -1, bytes, len);
}

int delta_payload_serialize_aggregate(const DeltaCodec *c, const DeltaTensor *tensors, int n, int base_step, int step,
                                      uint8_t **bytes, size_t *len) {
    return serialize_payload(c, tensors, n, base_step, step, bytes, len);
}

int delta_payload_kind(const SafeTensors *st, const char *what, const DeltaCodec **codec, int *base_step) {
    const char *enc = safetensors_meta(st, "spes_encoding");
    *codec = NULL;
    *base_step = -1;
    if (!enc) return SPES_OK;
    const DeltaCodec *c = delta_codec_by_encoding(enc);
    if (!c)
        return spes_fail("%s: unknown spes_encoding '%.64s' (this side speaks '%s' and '%s')", what, enc,
                         DELTA_INT8.encoding, DELTA_INT4.encoding);
    const char *base = safetensors_meta(st, "spes_base_step"), *block = safetensors_meta(st, "spes_block");
    char *end = NULL;
    long b = base ? strtol(base, &end, 10) : -1;
    if (!base || !*base || *end || b < 0 || b > INT32_MAX)
        return spes_fail("%s: %s delta without a valid spes_base_step (got '%.32s')", what, c->name,
                         base ? base : "(none)");
    if (!block || strtol(block, &end, 10) != DELTA_BLOCK || *end)
        return spes_fail("%s: %s delta with block size '%.32s'; this side uses %d", what, c->name,
                         block ? block : "(none)", DELTA_BLOCK);
    *codec = c;
    *base_step = (int)b;
    return SPES_OK;
}

int delta_payload_decode(const DeltaCodec *c, const SafeTensors *st, const char *what, const char *name, int ndim,
                        const int64_t *shape, size_t numel, const float *base, float *out, float *scales,
                        int8_t *codes) {
    char scale_name[1100];
    snprintf(scale_name, sizeof scale_name, "%s%s", name, DELTA_SCALE_SUFFIX);
    const StTensor *q = safetensors_find(st, name), *s = safetensors_find(st, scale_name);
    size_t blocks = delta_blocks(numel);
    if (!q || !s) return spes_fail("%s: %s delta lacks '%s'", what, c->name, q ? scale_name : name);
    if (c->bits == 8 &&
        (q->dtype != DTYPE_I8 || q->ndim != ndim || q->numel != numel || memcmp(q->shape, shape, (size_t)ndim * sizeof *shape)))
        return spes_fail("%s: tensor '%s' must be I8 with the model's shape (%zu values), got %s with %zu values", what,
                         name, numel, dtype_name(q->dtype), q->numel);
    if (c->bits == 4 && (q->dtype != DTYPE_U8 || q->ndim != 1 || (!c->zstd && q->numel != code_bytes(c, numel))))
        return spes_fail("%s: tensor '%s' must be U8 [%s%zu] (%zu int4 codes, two per byte%s), got %s with %zu values",
                         what, name, c->zstd ? "zstd frame of " : "", code_bytes(c, numel), numel,
                         c->zstd ? ", compressed" : "", dtype_name(q->dtype), q->numel);
    if (s->dtype != c->scale_dtype || s->ndim != 1 || s->numel != blocks)
        return spes_fail("%s: '%s' must be %s [%zu] (one scale per %d values), got %s with %zu values", what,
                         scale_name, dtype_name(c->scale_dtype), blocks, DELTA_BLOCK, dtype_name(s->dtype), s->numel);
    if (safetensors_to_f32(s, scales) != SPES_OK) return spes_fail_context("%s: '%s'", what, scale_name);   // unaligned-safe
    const int8_t *q_codes = (const int8_t *)q->data;
    if (c->bits == 4) {
        size_t len = code_bytes(c, numel);
        if (c->zstd) SPES_TRY(decompress_codes(q->data, q->numel, (uint8_t *)codes, len, what, name));
        else memcpy(codes, q->data, len);
        if (!unpack_int4((uint8_t *)codes, numel))
            return spes_fail("%s: tensor '%s': the padding nibble after its last (odd) code is not 0", what, name);
        q_codes = codes;
    }
    size_t where;
    const char *why;
    if (!delta_check(c, q_codes, scales, numel, &where, &why))
        return spes_fail("%s: tensor '%s': %s at %s %zu", what, name, why,
                         strncmp(why, "scale", 5) == 0 ? "block" : "flat index", where);
    delta_reconstruct(base, q_codes, scales, numel, out);
    for (size_t i = 0; i < numel; i++)
        if (!(fabsf(out[i]) <= SYNC_MAX_WEIGHT))   // also NaN
            return spes_fail("%s: tensor '%s': the reconstruction (base + change) is %g at flat index %zu, not within "
                             "+-%g (the largest weight a sync payload may carry; no healthy peer sends it)",
                             what, name, (double)out[i], i, (double)SYNC_MAX_WEIGHT);
    return SPES_OK;
}
