// int8 delta payloads as safetensors (see int8_payload.h).
#include "sync/int8_payload.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sync/int8_codec.h"

int int8_payload_serialize(const Int8Tensor *tensors, int n, int base_step, uint8_t **bytes, size_t *len) {
    StWriteTensor *w = spes_calloc(2 * (size_t)n + 1, sizeof *w);
    char **names = spes_calloc((size_t)n + 1, sizeof *names);
    int rc = w && names ? SPES_OK : SPES_ERR;
    for (int i = 0; rc == SPES_OK && i < n; i++) {
        const Int8Tensor *t = &tensors[i];
        w[2 * i] = (StWriteTensor){.name = t->name, .dtype = DTYPE_I8, .ndim = t->ndim, .data = t->q};
        memcpy(w[2 * i].shape, t->shape, sizeof t->shape);
        size_t name_len = strlen(t->name) + sizeof INT8_SCALE_SUFFIX;
        names[i] = spes_malloc(name_len);
        if (!names[i]) {
            rc = SPES_ERR;
            break;
        }
        snprintf(names[i], name_len, "%s%s", t->name, INT8_SCALE_SUFFIX);
        w[2 * i + 1] = (StWriteTensor){.name = names[i], .dtype = DTYPE_F32, .ndim = 1, .data = t->scale};
        w[2 * i + 1].shape[0] = (int64_t)int8_blocks(t->numel);
    }
    char base[24], block[24];
    snprintf(base, sizeof base, "%d", base_step);
    snprintf(block, sizeof block, "%d", INT8_BLOCK);
    const char *keys[] = {"spes_encoding", "spes_base_step", "spes_block"};
    const char *values[] = {INT8_ENCODING, base, block};
    if (rc == SPES_OK) rc = safetensors_serialize(w, 2 * n, keys, values, 3, bytes, len);
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(w);
    return rc;
}

int int8_payload_kind(const SafeTensors *st, const char *what, bool *is_int8, int *base_step) {
    const char *enc = safetensors_meta(st, "spes_encoding");
    *is_int8 = enc != NULL;
    *base_step = -1;
    if (!enc) return SPES_OK;
    if (strcmp(enc, INT8_ENCODING) != 0)
        return spes_fail("%s: unknown spes_encoding '%.64s' (this side speaks '%s')", what, enc, INT8_ENCODING);
    const char *base = safetensors_meta(st, "spes_base_step"), *block = safetensors_meta(st, "spes_block");
    char *end = NULL;
    long b = base ? strtol(base, &end, 10) : -1;
    if (!base || !*base || *end || b < 0 || b > INT32_MAX)
        return spes_fail("%s: int8 delta without a valid spes_base_step (got '%.32s')", what, base ? base : "(none)");
    if (!block || strtol(block, &end, 10) != INT8_BLOCK || *end)
        return spes_fail("%s: int8 delta with block size '%.32s'; this side uses %d", what, block ? block : "(none)",
                         INT8_BLOCK);
    *base_step = (int)b;
    return SPES_OK;
}

int int8_payload_decode(const SafeTensors *st, const char *what, const char *name, int ndim, const int64_t *shape,
                        size_t numel, const float *base, float *out, float *scratch) {
    char scale_name[1100];
    snprintf(scale_name, sizeof scale_name, "%s%s", name, INT8_SCALE_SUFFIX);
    const StTensor *q = safetensors_find(st, name), *s = safetensors_find(st, scale_name);
    size_t blocks = int8_blocks(numel);
    if (!q || !s) return spes_fail("%s: int8 delta lacks '%s'", what, q ? scale_name : name);
    if (q->dtype != DTYPE_I8 || q->ndim != ndim || q->numel != numel || memcmp(q->shape, shape, (size_t)ndim * sizeof *shape))
        return spes_fail("%s: tensor '%s' must be I8 with the model's shape (%zu values), got %s with %zu values", what,
                         name, numel, dtype_name(q->dtype), q->numel);
    if (s->dtype != DTYPE_F32 || s->ndim != 1 || s->numel != blocks)
        return spes_fail("%s: '%s' must be F32 [%zu] (one scale per %d values), got %s with %zu values", what, scale_name,
                         blocks, INT8_BLOCK, dtype_name(s->dtype), s->numel);
    memcpy(scratch, s->data, blocks * sizeof(float));   // safetensors data may be unaligned
    size_t where;
    const char *why;
    if (!int8_check((const int8_t *)q->data, scratch, numel, &where, &why))
        return spes_fail("%s: tensor '%s': %s at %s %zu", what, name, why,
                         strncmp(why, "scale", 5) == 0 ? "block" : "flat index", where);
    int8_reconstruct(base, (const int8_t *)q->data, scratch, numel, out);
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(out[i]))
            return spes_fail("%s: tensor '%s': the reconstruction (base + change) is not finite at flat index %zu", what,
                             name, i);
    return SPES_OK;
}
