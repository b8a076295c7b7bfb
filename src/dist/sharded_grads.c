// ZeRO-2/3's sharded gradients. See sharded_grads.h.
#include "dist/sharded_grads.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

// Part p's gradients, summed over ranks (a reduce-scatter of the part's range of the gradient
// layout, in work), added to this rank's gradient shard.
static int reduce_part(ShardedGrads *g, int part) {
    const DataParallel *dp = g->dp;
    size_t glo, numel;
    param_part_grad_span(&g->m->table, part, g->m->cfg.n_layers, &glo, &numel);
    if (numel == 0) return SPES_OK;
    const size_t ghi = glo + numel, lo = dp->lo[dp->rank];
    for (int r = 0; r < dp->size; r++) {
        size_t a = max_sz(glo, dp->lo[r]), b = min_sz(ghi, dp->lo[r + 1]);
        g->counts[r] = b > a ? (int)(b - a) : 0;
    }
    Backend *be = g->m->be;
    SPES_TRY(comm_start_reduce_scatter_sum(dp->comm, be, g->work, g->counts));
    SPES_TRY(comm_wait_all(dp->comm));
    size_t a = max_sz(glo, lo), b = min_sz(ghi, dp->lo[dp->rank + 1]);
    if (a < b) be->ops->add_inplace(be, buf_f32(g->shard + (a - lo)), buf_f32(g->work + (a - glo)), b - a);
    return SPES_OK;
}

int sharded_grads_on_event(ShardedGrads *g, ModelHookEvent event, int part) {
    const int head = g->m->cfg.n_layers + 1;
    // The part's gradients start at zero where it first writes them: the head in its forward.
    bool first_write = (event == MODEL_HOOK_PRE_FORWARD && part == head) ||
                       (event == MODEL_HOOK_PRE_BACKWARD && part != g->held);
    if (first_write) {
        g->m->be->ops->zero(g->m->be, g->work, g->work_n * sizeof(float));
        g->held = part;
    }
    if (event == MODEL_HOOK_POST_BACKWARD) {
        SPES_TRY(reduce_part(g, part));
        g->held = -1;
    }
    return SPES_OK;
}

// ZeRO-2: the parameters are the model's own (master NULL), the gradients go to `work`.
static int on_event_grads_only(void *ctx, ModelHookEvent event, int part) {
    ShardedGrads *g = ctx;
    bool pre = event == MODEL_HOOK_PRE_FORWARD || event == MODEL_HOOK_PRE_BACKWARD;
    if (pre && part != g->viewed) {
        SPES_TRY(model_bind_part(g->m, part, NULL, NULL, g->work));
        g->viewed = part;
    }
    return sharded_grads_on_event(g, event, part);
}

// n floats of backend memory; +1: a rank may hold an empty shard.
static float *alloc_floats(Backend *be, size_t n) {
    void *p = NULL;
    return backend_alloc(be, (n + 1) * sizeof(float), &p) == SPES_OK ? p : NULL;
}

int sharded_grads_create(ShardedGrads *g, Model *m, DataParallel *dp) {
    memset(g, 0, sizeof *g);
    g->m = m;
    g->dp = dp;
    g->held = g->viewed = -1;
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
    g->shard = alloc_floats(m->be, g->shard_n);
    g->work = alloc_floats(m->be, g->work_n);
    g->counts = spes_calloc((size_t)dp->size, sizeof *g->counts);
    if (!g->shard || !g->work || !g->counts) {
        spes_fail_context("sharded gradients on %s (shard of %zu values, working buffer %zu)", m->be->name,
                          g->shard_n, g->work_n);
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
    if (g->m) {
        backend_free(g->m->be, g->shard);
        backend_free(g->m->be, g->work);
    }
    free(g->counts);
    memset(g, 0, sizeof *g);
}

void sharded_grads_zero(ShardedGrads *g) {
    g->m->be->ops->zero(g->m->be, g->shard, g->shard_n * sizeof(float));
    g->viewed = -1;   // between steps the model may have rebound its views (a load, a move)
}

const ModelHooks *sharded_grads_hooks(ShardedGrads *g) { return &g->hooks; }

int sharded_grads_idle_pass(ShardedGrads *g, const ModelHooks *hooks) {
    g->held = -1;
    return model_hook_replay(g->m, true, hooks);
}

size_t sharded_grads_bytes(const ShardedGrads *g) { return (g->shard_n + g->work_n) * sizeof(float); }
