// ZeRO-3's sharded parameters. See sharded_params.h.
#include "parallel/sharded_params.h"

#include <string.h>

#include "base/error.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

// The compute copy of n fp32 master values into `compute`; nothing when compute is fp32 (no
// compute copy: the GEMMs read the master).
static void convert_part(Backend *be, void *compute, float *master, size_t n) {
    if (compute) be->ops->convert(be, buf_of(compute, be->compute), buf_f32(master), n);
}

// Part p's working buffer: p mod 2 with prefetch (neighbouring parts alternate), else the one.
static int buffer_of(const ShardedParams *z, int part) { return z->n_work == 2 ? part % 2 : 0; }

// The gather in flight has completed (comm_wait_all): staged values and frozen tensors into its
// buffer, converted into the compute copy.
static int finish_inflight(ShardedParams *z) {
    const int part = z->inflight, b = buffer_of(z, part);
    z->inflight = -1;
    SPES_TRY(comm_wait_all(z->dp->comm));
    part_gather_finish(&z->gather, b, part, z->frozen, z->work[b]);
    size_t offset, numel;
    param_part_span(&z->m->table, part, z->m->cfg.n_layers, &offset, &numel);
    convert_part(z->m->be, z->cwork[b], z->work[b], numel);
    z->holds[b] = part;
    return SPES_OK;
}

static int start_gather(ShardedParams *z, int part) {
    const int b = buffer_of(z, part);
    if (z->inflight >= 0) SPES_TRY(finish_inflight(z));   // one gather in flight at most
    z->holds[b] = -1;
    SPES_TRY(part_gather_start(&z->gather, b, part, z->shard, z->work[b]));
    z->inflight = part;
    z->gathers++;
    return SPES_OK;
}

// Part `part` in its working buffer (gathered now unless it is there or on its way), bound.
static int ensure_part(ShardedParams *z, int part) {
    if (z->inflight == part) {
        SPES_TRY(finish_inflight(z));
    } else if (z->holds[buffer_of(z, part)] != part) {
        SPES_TRY(start_gather(z, part));
        SPES_TRY(finish_inflight(z));
    }
    if (z->bound == part) return SPES_OK;
    const int b = buffer_of(z, part);
    SPES_TRY(model_bind_part(z->m, part, z->work[b], z->cwork[b], sharded_grads_work(z->grads, part)));
    z->bound = part;
    return SPES_OK;
}

// Prefetch: the part that runs next (forward: part + 1, backward: part - 1) starts gathering
// into the other buffer while this one runs. That buffer's part has run already: the hooks
// come in order, and on cuda the gather starts after the backend's queued work (comm.h).
static int prefetch(ShardedParams *z, int next) {
    if (z->n_work < 2 || next < 0 || next > z->m->cfg.n_layers + 1) return SPES_OK;
    if (z->inflight == next || z->holds[buffer_of(z, next)] == next) return SPES_OK;
    z->prefetched++;
    return start_gather(z, next);
}

static int on_event(void *ctx, ModelHookEvent event, int part) {
    ShardedParams *z = ctx;
    if (event == MODEL_HOOK_PRE_FORWARD || event == MODEL_HOOK_PRE_BACKWARD) {
        SPES_TRY(ensure_part(z, part));
        SPES_TRY(prefetch(z, event == MODEL_HOOK_PRE_FORWARD ? part + 1 : part - 1));
    }
    return sharded_grads_on_event(z->grads, event, part);
}

// The working buffers' contents are stale (the shard changed, or the model's views were rebound).
static int forget_parts(ShardedParams *z) {
    if (z->inflight >= 0) SPES_TRY(finish_inflight(z));
    z->holds[0] = z->holds[1] = -1;
    z->bound = -1;
    return SPES_OK;
}

int sharded_params_create(ShardedParams *z, Model *m, DataParallel *dp, ShardedGrads *grads, bool prefetch) {
    memset(z, 0, sizeof *z);
    z->m = m;
    z->dp = dp;
    z->grads = grads;
    z->n_work = prefetch ? 2 : 1;
    z->bound = z->inflight = z->holds[0] = z->holds[1] = -1;
    z->hooks = (ModelHooks){.fn = on_event, .ctx = z};
    if (dp->stage != DP_ZERO3)
        return spes_fail("sharded_params: the data-parallel stage is %s, not zero3", dp_stage_name(dp->stage));
    Backend *be = m->be;
    const int L = m->cfg.n_layers;
    SPES_TRY(part_gather_create(&z->gather, dp->comm, be, &m->table, L, dp->lo, z->n_work));
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(&m->table, p, L, &offset, &numel);
        z->work_n = max_sz(z->work_n, numel);
    }
    z->shard_n = dp->lo[dp->rank + 1] - dp->lo[dp->rank];
    z->shard = dp_alloc_values(be, z->shard_n, NUM_F32);
    z->frozen = dp_alloc_values(be, z->gather.frozen_numel, NUM_F32);
    bool ok = z->shard && z->frozen;
    for (int b = 0; b < z->n_work; b++) {
        z->work[b] = dp_alloc_values(be, z->work_n, NUM_F32);
        if (be->compute != NUM_F32) z->cwork[b] = dp_alloc_values(be, z->work_n, be->compute);
        ok = ok && z->work[b] && (be->compute == NUM_F32 || z->cwork[b]);
    }
    if (!ok) {
        spes_fail_context("ZeRO-3 buffers on %s (shard of %zu values, frozen %zu, %d working buffers of %zu)", be->name,
                          z->shard_n, z->gather.frozen_numel, z->n_work, z->work_n);
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
        backend_free(be, z->frozen);
        for (int b = 0; b < 2; b++) {
            backend_free(be, z->work[b]);
            backend_free(be, z->cwork[b]);
        }
    }
    memset(z, 0, sizeof *z);
}

int sharded_params_shard(ShardedParams *z) {
    if (z->sharded) return spes_fail("sharded_params: sharded already");
    SPES_TRY(forget_parts(z));
    const Model *m = z->m;
    Backend *be = m->be;
    const int rank = z->dp->rank;
    const size_t lo = z->dp->lo[rank];
    // shard[i - lo] = value i of the gradient layout, from its tensor's place in the master
    for (int i = 0; i < m->table.count; i++) {
        const ParamInfo *pi = &m->table.entries[i];
        if (!pi->trainable || pi->grad_offset < 0) continue;
        size_t go = (size_t)pi->grad_offset, a, n = dp_shard_overlap(z->dp->lo, rank, go, go + pi->numel, &a);
        if (n) be->ops->copy(be, z->shard + (a - lo), m->dparams + pi->offset + (a - go), n * sizeof(float));
    }
    part_pack_frozen(&z->gather, m->dparams, z->frozen);
    SPES_TRY(backend_sync(be));   // the copies have read the master before it is freed
    SPES_TRY(model_release_params(z->m));
    z->sharded = true;
    return SPES_OK;
}

int sharded_params_unshard(ShardedParams *z) {
    if (!z->sharded) return spes_fail("sharded_params: not sharded");
    SPES_TRY(forget_parts(z));
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
    return backend_sync(m->be);
}

const ModelHooks *sharded_params_hooks(ShardedParams *z) { return &z->hooks; }

int sharded_params_updated(ShardedParams *z) { return forget_parts(z); }

size_t sharded_params_bytes(const ShardedParams *z) {
    size_t compute = z->cwork[0] ? (size_t)z->n_work * z->work_n * num_type_size(z->m->be->compute) : 0;
    size_t floats = z->shard_n + z->gather.frozen_numel + (size_t)z->n_work * (z->work_n + z->gather.gathered_n);
    return floats * sizeof(float) + compute;
}
