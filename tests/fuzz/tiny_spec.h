// The tiny model spec the sync fuzz targets feed their payloads against (included by
// fuzz_sync_upload.c and sync_delta_fuzz.h; each is one translation unit).
#pragma once
#include <stdio.h>

#include "sync/model_spec.h"

// embed [6,4]; layers 0..1: router [4,4] and experts 0..3 with gate/up [3,4], down [4,3]; lm_head [6,4].
static int build_spec(ModelSpec *spec) {
    model_spec_init(spec);
    int64_t embed[2] = {6, 4}, router[2] = {4, 4}, gate[2] = {3, 4}, down[2] = {4, 3};
    static const char *proj[3] = {"gate", "up", "down"};
    char name[128];
    if (model_spec_add(spec, "model.embed_tokens.weight", DTYPE_F32, 2, embed)) return -1;
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        if (model_spec_add(spec, name, DTYPE_F32, 2, router)) return -1;
        for (int e = 0; e < 4; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, proj[p]);
                if (model_spec_add(spec, name, DTYPE_F32, 2, p == 2 ? down : gate)) return -1;
            }
    }
    if (model_spec_add(spec, "lm_head.weight", DTYPE_F32, 2, embed)) return -1;
    return model_spec_finish(spec);
}
