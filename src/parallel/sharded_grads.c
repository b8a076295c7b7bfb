// ZeRO-2/3's sharded gradients. See sharded_grads.h.
#include "parallel/sharded_grads.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

// Part p's working buffer: p mod 2 with overlap (neighbouring parts alternate), else the one.
static int buffer_of(const ShardedGrads *g, int part) { return g->n_work == 2 ? part % 2 : 0; }

float *sharded_grads_work(const ShardedGrads *g, int part) { return g->work[buffer_of(g, part)]; }

// Starts the reduce-scatter of part p's range of the gradient layout (in its working buffer,
// summed over ranks): it is then pending until finish_pending.
static int start_reduce(ShardedGrads *g, int part) {
    const DataParallel *dp = g->dp;
    size_t glo, numel;
    param_part_grad_span(&g->m->table, part, g->m->cfg.n_layers, &glo, &numel);
    if (numel == 0) return SPES_OK;
    const int b = buffer_of(g, part);
    dp_range_counts(dp->lo, dp->size, glo, glo + numel, g->counts[b]);
    SPES_TRY(comm_start_reduce_scatter_sum(dp->comm, g->m->be, g->work[b], g->counts[b]));
    g->pending = part;
    return SPES_OK;
}

// Waits for the pending reduce-scatter and adds this rank's block to its gradient shard.
static int finish_pending(ShardedGrads *g) {
    if (g->pending < 0) return SPES_OK;
    const DataParallel *dp = g->dp;
    const int part = g->pending;
    g->pending = -1;
    SPES_TRY(comm_wait_all(dp->comm));
    size_t glo, numel;
    param_part_grad_span(&g->m->table, part, g->m->cfg.n_layers, &glo, &numel);
    size_t a, n = dp_shard_overlap(dp->lo, dp->rank, glo, glo + numel, &a);
    Backend *be = g->m->be;
    if (n)
        be->ops->add_inplace(be, buf_f32(g->shard + (a - dp->lo[dp->rank])), buf_f32(sharded_grads_work(g, part) + (a - glo)),
                             n);
    return SPES_OK;
}

int sharded_grads_on_event(ShardedGrads *g, ModelHookEvent event, int part) {
    const int head = g->m->cfg.n_layers + 1;
    // The part's gradients start at zero where it first writes them: the head in its forward.
    bool first_write = (event == MODEL_HOOK_PRE_FORWARD && part == head) ||
                       (event == MODEL_HOOK_PRE_BACKWARD && part != g->held);
    if (first_write) {
        // Its buffer may still be read by the pending reduce-scatter (of the part two later).
        if (g->pending >= 0 && buffer_of(g, g->pending) == buffer_of(g, part)) SPES_TRY(finish_pending(g));
        g->m->be->ops->zero(g->m->be, sharded_grads_work(g, part), g->work_n * sizeof(float));
        g->held = part;
    }
    if (event == MODEL_HOOK_POST_BACKWARD) {
        // One reduction in flight at most, added in the order they started: the bits do not
        // depend on the overlap.
        SPES_TRY(finish_pending(g));
        SPES_TRY(start_reduce(g, part));
        g->held = -1;
        if (g->n_work == 1) return finish_pending(g);
    }
    return g->pending >= 0 ? comm_progress(g->dp->comm) : SPES_OK;
}

// ZeRO-2: the parameters are the model's own (master NULL), the gradients go to the part's
// working buffer.
static int on_event_grads_only(void *ctx, ModelHookEvent event, int part) {
    ShardedGrads *g = ctx;
    bool pre = event == MODEL_HOOK_PRE_FORWARD || event == MODEL_HOOK_PRE_BACKWARD;
    if (pre && part != g->viewed) {
        SPES_TRY(model_bind_part(g->m, part, NULL, NULL, sharded_grads_work(g, part)));
        g->viewed = part;
    }
    return sharded_grads_on_event(g, event, part);
}

int sharded_grads_create(ShardedGrads *g, Model *m, DataParallel *dp, bool overlap) {
    memset(g, 0, sizeof *g);
    g->m = m;
    g->dp = dp;
    g->held = g->viewed = g->pending = -1;
    g->n_work = overlap ? 2 : 1;
    g->hooks = (ModelHooks){.fn = on_event_grads_only, .ctx = g};
    if (!dp_shards_grads(dp->stage))
        return spes_fail("sharded_grads: the data-parallel stage is %s, not zero2 or zero3", dp_stage_name(dp->stage));
    const int L = m->cfg.n_layers;
    for (int p = 0; p <= L + 1; p++) {
        size_t glo, numel;
        param_part_grad_span(&m->table, p, L, &glo, &numel);
        g->work_n = max_sz(g->work_n, numel);
    }
    g->shard_n = dp->lo[dp->rank + 1] - dp->lo[dp->rank];
    g->shard = dp_alloc_values(m->be, g->shard_n, NUM_F32);
    bool ok = g->shard != NULL;
    for (int b = 0; b < g->n_work; b++) {
        g->work[b] = dp_alloc_values(m->be, g->work_n, NUM_F32);
        g->counts[b] = spes_calloc((size_t)dp->size, sizeof *g->counts[b]);
        ok = ok && g->work[b] && g->counts[b];
    }
    if (!ok) {
        spes_fail_context("sharded gradients on %s (shard of %zu values, %d working buffers of %zu)", m->be->name,
                          g->shard_n, g->n_work, g->work_n);
        sharded_grads_free(g);   // after the message: it clears g
        return SPES_ERR;
    }
    if (model_release_grads(m) != SPES_OK) {
        sharded_grads_free(g);
        return SPES_ERR;
    }
    return SPES_OK;
}

void sharded_grads_free(ShardedGrads *g) {
    for (int b = 0; b < 2; b++) {
        if (g->m) backend_free(g->m->be, g->work[b]);
        free(g->counts[b]);
    }
    if (g->m) backend_free(g->m->be, g->shard);
    memset(g, 0, sizeof *g);
}

int sharded_grads_zero(ShardedGrads *g) {
    SPES_TRY(finish_pending(g));   // nothing is pending after sharded_grads_finish; a failed pass may leave one
    g->m->be->ops->zero(g->m->be, g->shard, g->shard_n * sizeof(float));
    g->viewed = -1;   // between steps the model may have rebound its views (a load, a move)
    g->held = -1;
    return SPES_OK;
}

int sharded_grads_finish(ShardedGrads *g) { return finish_pending(g); }

const ModelHooks *sharded_grads_hooks(ShardedGrads *g) { return &g->hooks; }

int sharded_grads_idle_pass(ShardedGrads *g, const ModelHooks *hooks) {
    g->held = -1;
    return model_hook_replay(g->m, true, hooks);
}

size_t sharded_grads_bytes(const ShardedGrads *g) {
    return (g->shard_n + (size_t)g->n_work * g->work_n) * sizeof(float);
}
