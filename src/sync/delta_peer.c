// The peer's side of an int8 run (see delta_peer.h).
#include "sync/delta_peer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "sync/delta_codec.h"
#include "sync/delta_payload.h"
#include "sync/model_spec.h"

int delta_peer_init(DeltaPeer *p, const DeltaCodec *codec, const DeltaPeerTensor *tensors, int count, size_t total) {
    memset(p, 0, sizeof *p);
    p->codec = codec;
    p->base_step = -1;
    p->count = count;
    p->total = total;
    p->tensors = spes_calloc((size_t)count + 1, sizeof *p->tensors);
    p->sent_at = spes_calloc((size_t)count + 1, sizeof *p->sent_at);
    p->base = spes_calloc(total + 1, sizeof(float));
    if (!p->tensors || !p->sent_at || !p->base) {
        delta_peer_free(p);
        return SPES_ERR;
    }
    memcpy(p->tensors, tensors, (size_t)count * sizeof *tensors);
    for (int t = 0; t < count; t++) {
        if (tensors[t].offset + tensors[t].numel > total) {
            delta_peer_free(p);
            return spes_fail("%s peer: tensor '%s' lies outside the parameters", codec->name, tensors[t].name);
        }
        p->sent_at[t] = p->sent_total;
        if (tensors[t].sent) p->sent_total += tensors[t].numel;
    }
    p->residual = spes_calloc(p->sent_total + 1, sizeof(float));
    p->residual_next = spes_calloc(p->sent_total + 1, sizeof(float));
    p->sent = spes_calloc(p->sent_total + 1, sizeof(float));
    if (!p->residual || !p->residual_next || !p->sent) {
        delta_peer_free(p);
        return SPES_ERR;
    }
    return SPES_OK;
}

void delta_peer_free(DeltaPeer *p) {
    free(p->tensors);
    free(p->sent_at);
    free(p->base);
    free(p->residual);
    free(p->residual_next);
    free(p->sent);
    memset(p, 0, sizeof *p);
    p->base_step = -1;
}

int delta_peer_encode(DeltaPeer *p, const float *params, uint8_t **bytes, size_t *len) {
    if (p->base_step < 0) return spes_fail("%s peer: no base aggregate to encode a delta against", p->codec->name);
    size_t blocks = 0;
    int n = 0;
    for (int t = 0; t < p->count; t++)
        if (p->tensors[t].sent) blocks += delta_blocks(p->tensors[t].numel), n++;
    int8_t *q = spes_malloc(p->sent_total + 1);
    float *scales = spes_malloc((blocks + 1) * sizeof(float));
    DeltaTensor *w = spes_calloc((size_t)n + 1, sizeof *w);
    int rc = q && scales && w ? SPES_OK : SPES_ERR;
    size_t block_at = 0;
    n = 0;
    for (int t = 0; rc == SPES_OK && t < p->count; t++) {
        const DeltaPeerTensor *x = &p->tensors[t];
        if (!x->sent) continue;
        size_t at = p->sent_at[t];
        const float *b = p->base + x->offset;
        memcpy(p->residual_next + at, p->residual + at, x->numel * sizeof(float));
        delta_encode_feedback(p->codec, params + x->offset, b, p->residual_next + at, x->numel, q + at, scales + block_at);
        delta_reconstruct(b, q + at, scales + block_at, x->numel, p->sent + at);
        w[n] = (DeltaTensor){.name = x->name, .ndim = x->ndim, .numel = x->numel, .q = q + at, .scale = scales + block_at};
        memcpy(w[n++].shape, x->shape, sizeof x->shape);
        block_at += delta_blocks(x->numel);
    }
    if (rc == SPES_OK) rc = delta_payload_serialize(p->codec, w, n, p->base_step, bytes, len);
    free(q);
    free(scales);
    free(w);
    return rc;
}

void delta_peer_sent_full(DeltaPeer *p, const float *params) {
    for (int t = 0; t < p->count; t++) {
        const DeltaPeerTensor *x = &p->tensors[t];
        if (!x->sent) continue;
        memcpy(p->sent + p->sent_at[t], params + x->offset, x->numel * sizeof(float));
        memset(p->residual_next + p->sent_at[t], 0, x->numel * sizeof(float));   // nothing was lost
    }
}

void delta_peer_commit(DeltaPeer *p) { memcpy(p->residual, p->residual_next, p->sent_total * sizeof(float)); }

float delta_peer_residual_bound(const DeltaCodec *c) {
    return 1.01f * 2.0f * SYNC_MAX_WEIGHT / (float)(2 * c->qmax - 1);
}

int delta_peer_check_residual(const DeltaPeer *p, const char *what) {
    float bound = delta_peer_residual_bound(p->codec);
    for (int t = 0; t < p->count; t++) {
        const DeltaPeerTensor *x = &p->tensors[t];
        if (!x->sent) continue;
        const float *e = p->residual + p->sent_at[t];
        for (size_t i = 0; i < x->numel; i++)
            if (!(fabsf(e[i]) <= bound))   // also NaN
                return spes_fail("%s: the %s error feedback of tensor '%s' is %g at flat index %zu, beyond %g (half a "
                                 "quantisation step of the largest change a healthy peer sends): the file is damaged; "
                                 "remove it to restart the error feedback from zero",
                                 what, p->codec->name, x->name, (double)e[i], i, (double)bound);
    }
    return SPES_OK;
}

int delta_peer_apply_delta(DeltaPeer *p, const SafeTensors *st, bool own_omitted, int step, float *params,
                          const char *what) {
    size_t largest = 1;
    int expected = 0;
    for (int t = 0; t < p->count; t++) {
        if (p->tensors[t].numel > largest) largest = p->tensors[t].numel;
        expected += own_omitted && p->tensors[t].own ? 0 : 2;
    }
    float *scratch = spes_malloc(largest * sizeof(float)), *scales = spes_malloc(delta_blocks(largest) * sizeof(float));
    int8_t *q = spes_malloc(largest);
    int rc = scratch && scales && q ? SPES_OK : SPES_ERR;
    // The delta must be of this run's codec and against the base this peer holds: decoded against
    // another aggregate it would load wrong weights without a sign.
    const DeltaCodec *codec = NULL;
    int base_step = -1;
    if (rc == SPES_OK) rc = delta_payload_kind(st, what, &codec, &base_step);
    if (rc == SPES_OK && codec != p->codec)
        rc = spes_fail("%s: came as a %s delta, but is %s (its spes_encoding '%s')", what, p->codec->name,
                       codec ? codec->name : "none", codec ? codec->encoding : "");
    if (rc == SPES_OK && base_step != p->base_step)
        rc = spes_fail("%s: the %s delta is against base step %d (its spes_base_step), but this peer holds the "
                       "aggregate of step %d as its base",
                       what, p->codec->name, base_step, p->base_step);
    if (rc == SPES_OK && st->count != expected)
        rc = spes_fail("%s: %d tensors in the %s delta, expected %d", what, st->count, p->codec->name, expected);
    // Decoded into the base in place: a failure part way drops the base (the next round sends a
    // full payload and downloads the whole aggregate); params are written only at the end.
    for (int t = 0; rc == SPES_OK && t < p->count; t++) {
        const DeltaPeerTensor *x = &p->tensors[t];
        float *b = p->base + x->offset;
        if (own_omitted && x->own) {
            // The server's aggregate of an own expert is our upload as it reconstructed it (sent);
            // its change against the base went down encoded like every other tensor.
            if (!x->sent) rc = spes_fail("%s: own expert '%s' left out, but this peer does not train it", what, x->name);
            else {
                delta_encode_change(p->codec, p->sent + p->sent_at[t], b, x->numel, q, scales, scratch);
                delta_reconstruct(b, q, scales, x->numel, b);
            }
        } else {
            rc = delta_payload_decode(p->codec, st, what, x->name, x->ndim, x->shape, x->numel, b, b, scales, q);
        }
    }
    if (rc == SPES_OK) {
        memcpy(params, p->base, p->total * sizeof(float));
        p->base_step = step;
    } else {
        p->base_step = -1;
    }
    free(scratch);
    free(scales);
    free(q);
    return rc;
}

int delta_peer_set_base(DeltaPeer *p, const float *params, int step) {
    memcpy(p->base, params, p->total * sizeof(float));
    p->base_step = step;
    return SPES_OK;
}
