// Shared by the sync unit tests: a tiny MoE spec and serialised uploads for it.
// embed [6,4]; layers 0..1: router [E,4], experts e: gate [3,4], up [3,4], down [4,3]; lm_head [6,4].
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "sync/model_spec.h"

static inline int sync_test_spec(ModelSpec *spec, int E, int64_t lm_head_rows) {
    model_spec_init(spec);
    int64_t embed[2] = {6, 4}, router[2] = {E, 4}, gate[2] = {3, 4}, down[2] = {4, 3}, head[2] = {lm_head_rows, 4};
    char name[128];
    static const char *proj[3] = {"gate", "up", "down"};
    SPES_TRY(model_spec_add(spec, "model.embed_tokens.weight", DTYPE_F32, 2, embed));
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        SPES_TRY(model_spec_add(spec, name, DTYPE_F32, 2, router));
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, proj[p]);
                SPES_TRY(model_spec_add(spec, name, DTYPE_F32, 2, p == 2 ? down : gate));
            }
    }
    SPES_TRY(model_spec_add(spec, "lm_head.weight", DTYPE_F32, 2, head));
    return model_spec_finish(spec);
}

// Serialises the tensors `peer` sends (mode, m) with value v(t, i) = peer + 0.5*t + 0.01*i;
// `tweak` (may be NULL) can change names, dtypes, shapes or values before serialising.
typedef void (*SyncTestTweak)(StWriteTensor *w, float *data, int t);
static inline int sync_test_upload(const ModelSpec *spec, SyncMode mode, int m, int peer, DType dtype, SyncTestTweak tweak,
                                   uint8_t **bytes, size_t *len) {
    StWriteTensor *w = calloc((size_t)spec->count, sizeof *w);
    void **data = calloc((size_t)spec->count, sizeof *data);
    int n = 0;
    for (int t = 0; t < spec->count; t++) {
        if (!model_spec_peer_sends(spec, mode, m, peer, t)) continue;
        const SpecTensor *st = &spec->tensors[t];
        float *f = malloc(st->numel * sizeof(float));
        for (size_t i = 0; i < st->numel; i++) f[i] = (float)peer + 0.5f * (float)t + 0.01f * (float)i;
        w[n] = (StWriteTensor){.name = st->name, .dtype = DTYPE_F32, .ndim = st->ndim, .data = f};
        memcpy(w[n].shape, st->shape, sizeof w[n].shape);
        if (tweak) tweak(&w[n], f, t);
        if (dtype == DTYPE_BF16 && w[n].dtype == DTYPE_F32) {
            uint16_t *h = malloc(st->numel * 2);
            for (size_t i = 0; i < st->numel; i++) h[i] = f32_to_bf16(f[i]);
            free(f);
            w[n].dtype = DTYPE_BF16;
            w[n].data = h;
        }
        data[n] = (void *)w[n].data;
        n++;
    }
    int rc = safetensors_serialize(w, n, NULL, NULL, 0, bytes, len);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(w);
    return rc;
}

// The upload most tests need: peer's SPES upload (2 experts a peer) of sync_test_spec(4, 6), f32.
static inline int sync_test_small_upload(int peer, uint8_t **bytes, size_t *len) {
    ModelSpec spec;
    SPES_TRY(sync_test_spec(&spec, 4, 6));
    int rc = sync_test_upload(&spec, SYNC_MODE_SPES, 2, peer, DTYPE_F32, NULL, bytes, len);
    model_spec_free(&spec);
    return rc;
}
