// Parameter-server aggregation throughput and per-round traffic.
//
// Model: the bench-small preset with E = 16 experts per layer (d_model 512, 4 layers, expert
// hidden 1024, vocab 8192): 113 M parameters, 453 MB in F32, 89% of it experts. SPES split:
// 4 peers, m = 4 experts each, so every upload holds the shared tensors + 4 of 16 experts per
// layer. Throughput = bytes of the 4 serialised uploads / time of aggregate_compute (mean of
// shared tensors, owners' experts, written to a pre-faulted output), best of 3; next to it
// memcpy of a model-sized buffer in the same run (bytes copied / time, best of 3).
// Traffic: real serialised payload sizes per peer and round, spes vs fedavg (MB = 10^6 bytes).
// Last lines: `spes-traffic: ...` then `aggregate: gb_s=<x> memcpy_gb_s=<x> ratio=<x>`.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/rng.h"
#include "base/threads.h"
#include "base/timer.h"
#include "model/param_table.h"
#include "server/aggregate.h"
#include "server/upload_check.h"

#define PEERS 4
#define M 4

static int die(void) {
    fprintf(stderr, "bench aggregate: %s\n", spes_last_error());
    return 1;
}

// Serialises what `peer` uploads (everything in fedavg mode) from params[total_numel].
static int serialize_upload(const ModelSpec *spec, SyncMode mode, int peer, const float *params, uint8_t **bytes,
                            size_t *len) {
    StWriteTensor *w = spes_calloc((size_t)spec->count, sizeof *w);
    if (!w) return SPES_ERR;
    int n = 0;
    size_t offset = 0;
    for (int t = 0; t < spec->count; t++) {
        const SpecTensor *st = &spec->tensors[t];
        if (model_spec_peer_sends(spec, mode, M, peer, t)) {
            w[n] = (StWriteTensor){.name = st->name, .dtype = DTYPE_F32, .ndim = st->ndim, .data = params + offset};
            memcpy(w[n].shape, st->shape, sizeof w[n].shape);
            n++;
        }
        offset += st->numel;
    }
    int rc = safetensors_serialize(w, n, NULL, NULL, 0, bytes, len);
    free(w);
    return rc;
}

int main(void) {
    threads_set(0);
    ModelConfig mc;
    if (model_config_preset("bench-small", &mc) != SPES_OK) return die();
    mc.num_experts = PEERS * M;
    if (model_config_validate(&mc) != SPES_OK) return die();
    ParamTable table;
    if (param_table_build(&mc, &table) != SPES_OK) return die();
    ModelSpec spec;
    model_spec_init(&spec);
    for (int i = 0; i < table.count; i++)
        if (model_spec_add(&spec, table.entries[i].name, DTYPE_F32, table.entries[i].ndim, table.entries[i].shape) !=
            SPES_OK)
            return die();
    if (model_spec_finish(&spec) != SPES_OK) return die();
    size_t model_bytes = spec.total_numel * sizeof(float);

    float *params = spes_alloc_aligned(model_bytes);
    float *out = spes_alloc_aligned(model_bytes);
    if (!params || !out) return die();
    Rng rng;
    rng_seed(&rng, 1234);
    for (size_t i = 0; i < spec.total_numel; i++) params[i] = (float)(0.02 * (rng_uniform(&rng) - 0.5));
    memset(out, 0, model_bytes);   // fault the output pages in before timing

    // Traffic per round, from real payloads.
    uint8_t *bytes;
    size_t spes_up = 0, fedavg_up = 0;
    if (serialize_upload(&spec, SYNC_MODE_FEDAVG, 0, params, &bytes, &fedavg_up) != SPES_OK) return die();
    free(bytes);   // the aggregate has the same tensors as a fedavg upload: same size down, both modes

    // The 4 spes uploads, parsed and validated as the server would.
    AggregateConfig cfg = {.mode = SYNC_MODE_SPES, .num_peers = PEERS, .experts_per_node = M, .merge_interval = 0,
                           .merge_alpha_start = 0.5f, .merge_decay_steps = 1000, .merge_topk = 4};
    uint8_t *up_bytes[PEERS];
    SafeTensors up[PEERS];
    const StTensor **rows = spes_calloc((size_t)PEERS * spec.count, sizeof *rows);
    size_t upload_total = 0;
    for (int p = 0; p < PEERS; p++) {
        size_t len;
        if (serialize_upload(&spec, SYNC_MODE_SPES, p, params, &up_bytes[p], &len) != SPES_OK ||
            safetensors_parse(up_bytes[p], len, "upload", &up[p]) != SPES_OK ||
            upload_check(&spec, SYNC_MODE_SPES, M, p, &up[p], rows + (size_t)p * spec.count) != SPES_OK)
            return die();
        upload_total += len;
        if (p == 0) spes_up = len;
    }
    uint8_t **outs = spes_calloc((size_t)spec.count, sizeof *outs);
    size_t offset = 0;
    for (int t = 0; t < spec.count; t++) {
        outs[t] = (uint8_t *)(out + offset);
        offset += spec.tensors[t].numel;
    }
    size_t expert_numel = 0;
    for (int t = 0; t < spec.count; t++)
        if (spec.tensors[t].expert >= 0) expert_numel += spec.tensors[t].numel;
    printf("model: bench-small with E=%d: %d tensors, %.1f M params, %.1f MB F32 (experts %.0f%%); %d peers x %d "
           "experts\n",
           mc.num_experts, spec.count, spec.total_numel / 1e6, model_bytes / 1e6,
           100.0 * expert_numel / spec.total_numel, PEERS, M);
    printf("threads: %d\n", threads_get());

    double best = 1e30, best_merge = 1e30, best_copy = 1e30;
    for (int rep = 0; rep < 4; rep++) {   // rep 0 warms up
        double t0 = now_seconds();
        if (aggregate_compute(&spec, &cfg, 7, rows, outs, DTYPE_F32) != SPES_OK) return die();
        double t1 = now_seconds();
        if (rep > 0 && t1 - t0 < best) best = t1 - t0;
        memcpy(out, params, model_bytes);
        double t2 = now_seconds();
        if (rep > 0 && t2 - t1 < best_copy) best_copy = t2 - t1;
    }
    cfg.merge_interval = 10;   // one merge step, for the record
    for (int rep = 0; rep < 2; rep++) {
        double t0 = now_seconds();
        if (aggregate_compute(&spec, &cfg, 10, rows, outs, DTYPE_F32) != SPES_OK) return die();
        double t1 = now_seconds() - t0;
        if (t1 < best_merge) best_merge = t1;
    }
    double gb_s = upload_total / best / 1e9, copy_gb_s = model_bytes / best_copy / 1e9;
    printf("aggregate (no merge): %.1f MB of uploads in %.3f s; merge step (top-4 of 16): %.3f s\n", upload_total / 1e6,
           best, best_merge);
    printf("memcpy: %.1f MB in %.3f s\n", model_bytes / 1e6, best_copy);
    printf("spes-traffic: spes_up_mb=%.1f spes_down_mb=%.1f fedavg_up_mb=%.1f fedavg_down_mb=%.1f\n", spes_up / 1e6,
           fedavg_up / 1e6, fedavg_up / 1e6, fedavg_up / 1e6);
    printf("aggregate: gb_s=%.2f memcpy_gb_s=%.2f ratio=%.2f\n", gb_s, copy_gb_s, gb_s / copy_gb_s);
    for (int p = 0; p < PEERS; p++) {
        safetensors_close(&up[p]);
        free(up_bytes[p]);
    }
    free(rows);
    free(outs);
    spes_free_aligned(params);
    spes_free_aligned(out);
    model_spec_free(&spec);
    param_table_free(&table);
    return 0;
}
