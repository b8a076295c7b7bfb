// The body of the libFuzzer harnesses of hostile delta payloads (docs/communication.md) on both
// sides, for the codec FUZZ_CODEC the including file defines (fuzz_sync_int8.c: DELTA_INT8,
// fuzz_sync_int4.c: DELTA_INT4; each is one translation unit):
//  - server: a delta run whose first round (step 2, full F32 uploads) is the base; the bytes
//    are peer 0's upload for step 4 (bad scales, NaN/Inf, -128 / -8, wrong block counts, int4's
//    truncated packing and padding nibble, missing or extra tensors, bad metadata, truncation must
//    be refused; an accepted one must aggregate);
//  - peer: the bytes as a delta download applied to a peer's base (refused, or a finite
//    aggregate).
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "sync/delta_peer.h"
#include "server/rounds.h"

#include "tiny_spec.h"

// Peer p's full F32 upload (shared tensors + its experts), all values v.
static int full_upload(const ModelSpec *spec, int peer, float v, uint8_t **bytes, size_t *len) {
    static float values[64];
    for (int i = 0; i < 64; i++) values[i] = v;
    StWriteTensor w[64];
    int n = 0;
    for (int t = 0; t < spec->count; t++) {
        if (!model_spec_peer_sends(spec, SYNC_MODE_SPES, 2, peer, t)) continue;
        w[n] = (StWriteTensor){.name = spec->tensors[t].name, .dtype = DTYPE_F32, .ndim = 2, .data = values};
        memcpy(w[n].shape, spec->tensors[t].shape, sizeof w[n].shape);
        n++;
    }
    return safetensors_serialize(w, n, NULL, NULL, 0, bytes, len);
}

// A delta run of FUZZ_CODEC with step 2 aggregated from full uploads.
static Rounds *make_rounds(const ModelSpec *spec) {
    RoundsConfig cfg = {.agg = {.mode = SYNC_MODE_SPES, .num_peers = 2, .experts_per_node = 2, .merge_topk = 2},
                        .keep_steps = 2, .max_upload_bytes = 1 << 20, .max_open_rounds = 2};
    Rounds *r = NULL;
    ModelSpec hello;
    int last;
    if (rounds_create(&cfg, &r) != 0 || build_spec(&hello) != 0 ||
        rounds_hello_delta(r, 0, 2, 2, SYNC_MODE_SPES, DTYPE_I8, &FUZZ_CODEC, &hello, &last) != ROUNDS_OK)
        abort();
    model_spec_free(&hello);
    for (int p = 0; p < 2; p++) {
        uint8_t *bytes;
        size_t len;
        if (full_upload(spec, p, 0.25f * (float)(p + 1), &bytes, &len) != 0 ||
            rounds_upload(r, p, 2, bytes, len) != ROUNDS_OK)
            abort();
    }
    return r;
}

static uint8_t *copy_of(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (size) memcpy(copy, data, size);
    return copy;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Rounds *r = NULL;
    static ModelSpec spec;
    static DeltaPeer peer;
    static float *params;
    if (!r) {
        log_set_level(LOG_ERROR);
        if (build_spec(&spec) != 0) abort();
        r = make_rounds(&spec);
        DeltaPeerTensor x[64];
        size_t at = 0;
        for (int t = 0; t < spec.count; t++) {
            const SpecTensor *s = &spec.tensors[t];
            x[t] = (DeltaPeerTensor){.name = s->name, .ndim = s->ndim, .numel = s->numel, .offset = at,
                                    .sent = model_spec_peer_sends(&spec, SYNC_MODE_SPES, 2, 0, t),
                                    .own = s->expert >= 0 && s->expert / 2 == 0};
            memcpy(x[t].shape, s->shape, sizeof x[t].shape);
            at += s->numel;
        }
        params = calloc(spec.total_numel, sizeof(float));
        if (!params || delta_peer_init(&peer, &FUZZ_CODEC, x, spec.count, spec.total_numel) != 0) abort();
    }
    // Server side.
    if (rounds_upload(r, 0, 4, copy_of(data, size), size) == ROUNDS_OK) {
        uint8_t *bytes;
        size_t len;
        if (full_upload(&spec, 1, 0.5f, &bytes, &len) != 0 || rounds_upload(r, 1, 4, bytes, len) != ROUNDS_OK)
            abort();   // a valid upload completing an accepted round must aggregate
        AggregateBlob *blob;
        if (rounds_get(r, 4, 0, &blob) != ROUNDS_OK || !blob) abort();
        const float *v = (const float *)(blob->bytes + blob->len - spec.total_numel * sizeof(float));
        for (size_t i = 0; i < spec.total_numel; i++)
            if (!isfinite(v[i])) abort();
        rounds_release(r, blob);
        rounds_destroy(r);
        r = make_rounds(&spec);   // step 4 is taken: start again from the base
    }
    // Peer side: the bytes as the delta (FUZZ_CODEC) of step 4 against base step 2.
    SafeTensors st;
    if (safetensors_parse(data, size, "fuzz download", &st) == 0) {
        for (int omitted = 0; omitted < 2; omitted++) {
            delta_peer_set_base(&peer, params, 2);
            if (delta_peer_apply_delta(&peer, &st, omitted, 4, params, "fuzz download") == 0)
                for (size_t i = 0; i < spec.total_numel; i++)
                    if (!isfinite(params[i])) abort();
            memset(params, 0, spec.total_numel * sizeof(float));
        }
        safetensors_close(&st);
    }
    return 0;
}
