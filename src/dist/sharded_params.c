// ZeRO-3's sharded parameters. See sharded_params.h.
#include "dist/sharded_params.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

// The compute copy of n fp32 master values into `compute`; nothing when compute is fp32 (no
// compute copy: the GEMMs read the master).
static void convert_part(Backend *be, void *compute, float *master, size_t n) {
    if (compute) be->ops->convert(be, buf_of(compute, be->compute), buf_f32(master), n);
}

// Part p's gradients, summed over ranks (a reduce-scatter of the part's range of the gradient
// layout, in gwork), added to this rank's gradient shard.
static int reduce_part(ShardedParams *z, int part) {
    const DataParallel *dp = z->dp;
    size_t glo, numel;
    param_part_grad_span(&z->m->table, part, z->m->cfg.n_layers, &glo, &numel);
    if (numel == 0) return SPES_OK;
    const size_t ghi = glo + numel, lo = dp->lo[dp->rank];
    for (int r = 0; r < dp->size; r++) {
        size_t a = max_sz(glo, dp->lo[r]), b = min_sz(ghi, dp->lo[r + 1]);
        z->counts[r] = b > a ? (int)(b - a) : 0;
    }
    SPES_TRY(comm_start_reduce_scatter_sum(dp->comm, z->m->be, z->gwork, z->counts));
    SPES_TRY(comm_wait_all(dp->comm));
    size_t a = max_sz(glo, lo), b = min_sz(ghi, dp->lo[dp->rank + 1]);
    Backend *be = z->m->be;
    if (a < b) be->ops->add_inplace(be, buf_f32(z->gshard + (a - lo)), buf_f32(z->gwork + (a - glo)), b - a);
    return SPES_OK;
}

static int on_event(void *ctx, ModelHookEvent event, int part) {
    ShardedParams *z = ctx;
    Backend *be = z->m->be;
    const int head = z->m->cfg.n_layers + 1;
    bool pre = event == MODEL_HOOK_PRE_FORWARD || event == MODEL_HOOK_PRE_BACKWARD;
    if (pre && part != z->bound) {
        SPES_TRY(part_gather(&z->gather, part, z->shard, z->frozen, z->work));
        size_t offset, numel;
        param_part_span(&z->m->table, part, z->m->cfg.n_layers, &offset, &numel);
        convert_part(be, z->cwork, z->work, numel);
        SPES_TRY(model_bind_part(z->m, part, z->work, z->cwork, z->gwork));
        z->bound = part;
    }
    // The part's gradients start at zero where it first writes them: the head in its forward.
    bool first_write = (event == MODEL_HOOK_PRE_FORWARD && part == head) ||
                       (event == MODEL_HOOK_PRE_BACKWARD && part != z->gbound);
    if (first_write) {
        be->ops->zero(be, z->gwork, z->gwork_n * sizeof(float));
        z->gbound = part;
    }
    if (event == MODEL_HOOK_POST_BACKWARD) {
        SPES_TRY(reduce_part(z, part));
        z->gbound = -1;
    }
    return SPES_OK;
}

// n floats (or compute values) of backend memory; +1: a rank may hold an empty shard or no
// frozen tensor.
static void *alloc_values(Backend *be, size_t n, NumType t) {
    void *p = NULL;
    return backend_alloc(be, (n + 1) * num_type_size(t), &p) == SPES_OK ? p : NULL;
}

int sharded_params_create(ShardedParams *z, Model *m, DataParallel *dp) {
    memset(z, 0, sizeof *z);
    z->m = m;
    z->dp = dp;
    z->bound = -1;
    z->hooks = (ModelHooks){.fn = on_event, .ctx = z};
    if (dp->stage != DP_ZERO3)
        return spes_fail("sharded_params: the data-parallel stage is %s, not zero3", dp_stage_name(dp->stage));
    Backend *be = m->be;
    const int L = m->cfg.n_layers;
    SPES_TRY(part_gather_create(&z->gather, dp->comm, be, &m->table, L, dp->lo));
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(&m->table, p, L, &offset, &numel);
        z->work_n = max_sz(z->work_n, numel);
    }
    for (int p = 0; p <= L + 1; p++) {
        size_t glo, numel;
        param_part_grad_span(&m->table, p, L, &glo, &numel);
        z->gwork_n = max_sz(z->gwork_n, numel);
    }
    z->shard_n = dp->lo[dp->rank + 1] - dp->lo[dp->rank];
    z->gbound = -1;
    z->shard = alloc_values(be, z->shard_n, NUM_F32);
    z->gshard = alloc_values(be, z->shard_n, NUM_F32);
    z->frozen = alloc_values(be, z->gather.frozen_numel, NUM_F32);
    z->work = alloc_values(be, z->work_n, NUM_F32);
    z->gwork = alloc_values(be, z->gwork_n, NUM_F32);
    if (be->compute != NUM_F32) z->cwork = alloc_values(be, z->work_n, be->compute);
    z->counts = spes_calloc((size_t)dp->size, sizeof *z->counts);
    bool ok = z->shard && z->gshard && z->frozen && z->work && z->gwork && z->counts &&
              (be->compute == NUM_F32 || z->cwork);
    if (!ok) {
        spes_fail_context("ZeRO-3 buffers on %s (shard of %zu values, frozen %zu, working %zu)", be->name, z->shard_n,
                          z->gather.frozen_numel, z->work_n);
        sharded_params_free(z);   // after the message: it clears z
        return SPES_ERR;
    }
    return SPES_OK;
}

void sharded_params_free(ShardedParams *z) {
    part_gather_free(&z->gather);
    if (z->m) {
        Backend *be = z->m->be;
        backend_free(be, z->shard);
        backend_free(be, z->gshard);
        backend_free(be, z->frozen);
        backend_free(be, z->work);
        backend_free(be, z->cwork);
        backend_free(be, z->gwork);
    }
    free(z->counts);
    memset(z, 0, sizeof *z);
}

int sharded_params_shard(ShardedParams *z) {
    if (z->sharded) return spes_fail("sharded_params: sharded already");
    const Model *m = z->m;
    Backend *be = m->be;
    const size_t lo = z->dp->lo[z->dp->rank], hi = z->dp->lo[z->dp->rank + 1];
    // shard[i - lo] = value i of the gradient layout, from its tensor's place in the master
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *pi = &m->table.entries[i];
        if (!pi->trainable || pi->grad_offset < 0) continue;
        size_t go = (size_t)pi->grad_offset, a = max_sz(go, lo), b = min_sz(go + pi->numel, hi);
        if (a < b) be->ops->copy(be, z->shard + (a - lo), m->dparams + pi->offset + (a - go), (b - a) * sizeof(float));
    }
    part_pack_frozen(&z->gather, m->dparams, z->frozen);
    SPES_TRY(backend_sync(be));   // the copies have read the master before it is freed
    SPES_TRY(model_release_grads(z->m));   // they live in the shards now (a no-op after the first time)
    SPES_TRY(model_release_params(z->m));
    z->sharded = true;
    z->bound = -1;
    return SPES_OK;
}

int sharded_params_unshard(ShardedParams *z) {
    if (!z->sharded) return spes_fail("sharded_params: not sharded");
    Model *m = z->m;
    SPES_TRY(model_restore_params(m));
    const int L = m->cfg.n_layers;
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(&m->table, p, L, &offset, &numel);
        SPES_TRY(part_gather(&z->gather, p, z->shard, z->frozen, m->dparams + offset));
    }
    convert_part(m->be, m->cparams, m->dparams, m->table.total_numel);
    z->sharded = false;
    z->bound = -1;
    return backend_sync(m->be);
}

void sharded_params_zero_grads(ShardedParams *z) {
    z->m->be->ops->zero(z->m->be, z->gshard, z->shard_n * sizeof(float));
}

const ModelHooks *sharded_params_hooks(ShardedParams *z) { return &z->hooks; }

int sharded_params_idle_pass(ShardedParams *z) {
    z->gbound = -1;
    return model_hook_replay(z->m, true, &z->hooks);
}

void sharded_params_updated(ShardedParams *z) { z->bound = -1; }

size_t sharded_params_grad_bytes(const ShardedParams *z) { return (z->shard_n + z->gwork_n) * sizeof(float); }

size_t sharded_params_bytes(const ShardedParams *z) {
    size_t compute = z->cwork ? z->work_n * num_type_size(z->m->be->compute) : 0;
    return (z->shard_n + z->gather.frozen_numel + z->work_n + z->gather.gathered_n) * sizeof(float) + compute;
}
