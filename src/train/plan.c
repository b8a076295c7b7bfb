// Parameters, memory per rank and FLOPs of a run, before it starts. See plan.h.
#include "train/plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "parallel/data_parallel.h"
#include "parallel/part_gather.h"
#include "model/model_internal.h"   // model_acts_bytes: the arena's layout, measured
#include "model/param_table.h"
#include "train/save_space.h"
#include "train/trainer.h"

const char *plan_strategy_name(PlanStrategy s) {
    static const char *const names[PLAN_STRATEGY_COUNT] = {"single", "ddp", "zero1", "zero2", "zero3"};
    return (unsigned)s < PLAN_STRATEGY_COUNT ? names[s] : "?";
}

int plan_target_from_config(const TrainConfig *cfg, int ranks, bool gpu, PlanTarget *out) {
    memset(out, 0, sizeof *out);
    if (ranks < 1) return spes_fail("plan: %d ranks (at least 1)", ranks);
    Precision precision;
    SPES_TRY(precision_from_name(cfg->precision, &precision));
    out->gpu = gpu;
    backend_plan_traits(gpu, precision, &out->layout);   // as the backend `spes train` opens
    out->compute = out->layout.compute;
    out->ranks = ranks;
    out->strategy = PLAN_SINGLE;
    if (ranks > 1) {   // one rank trains without any strategy, whatever the config names (trainer.c)
        DpStage stage;
        SPES_TRY(dp_stage_from_config(cfg, ranks, &stage));
        out->strategy = stage == DP_DDP ? PLAN_DDP : stage == DP_ZERO1 ? PLAN_ZERO1 : stage == DP_ZERO2 ? PLAN_ZERO2 : PLAN_ZERO3;
    }
    out->micro_batch = cfg->device_train_microbatch_size;
    out->seq_len = cfg->model.max_seq_len;
    SPES_TRY(model_checkpointing_mode(cfg->activation_checkpointing, &out->checkpointing));
    out->cpu_offload = cfg->adamw.cpu_offload;
    out->prefetch = cfg->fsdp_prefetch;
    out->overlap = cfg->ddp_overlap_grad_reduce;
    out->bucket_mb = cfg->ddp_bucket_cap_mb;
    out->clip_adaptive = cfg->max_grad_norm_ratio > 0;
    for (int i = 0; i < cfg->n_evaluators; i++)   // lm evaluators run forward passes of this batch
        if (!cfg->evaluators[i].requests) out->eval_batch = cfg->device_eval_batch_size;
    return SPES_OK;
}

// A rank's backend memory over the run: buffers added and removed in the trainer's order.
typedef struct {
    size_t now, peak;
} Ledger;

// Both backends count an allocation of 0 bytes as 1 (they hand out a distinct pointer).
static void take(Ledger *l, size_t bytes) {
    l->now += bytes ? bytes : 1;
    if (l->now > l->peak) l->peak = l->now;
}
static void give(Ledger *l, size_t bytes) { l->now -= bytes ? bytes : 1; }

// dp_alloc_values: one value more than asked (an empty shard still has a buffer).
static size_t dp_values_bytes(size_t n, NumType t) { return (n + 1) * num_type_size(t); }

// The largest part's span of the parameter buffer (ZeRO-3's working buffers) and of the gradient
// layout (ZeRO-2/3's gradient working buffers): the sizes sharded_params_create and
// sharded_grads_create take, from the same spans.
static void part_spans(const ParamTable *t, int L, size_t *params_n, size_t *grads_n) {
    *params_n = *grads_n = 0;
    for (int p = 0; p <= L + 1; p++) {
        size_t offset, numel;
        param_part_span(t, p, L, &offset, &numel);
        if (numel > *params_n) *params_n = numel;
        param_part_grad_span(t, p, L, &offset, &numel);
        if (numel > *grads_n) *grads_n = numel;
    }
}

// The table with this config's trainable mask (trainer_setup_trainable's rule).
static int build_table(const TrainConfig *cfg, ModelConfig *mc, ParamTable *table) {
    *mc = cfg->model;
    SPES_TRY(model_config_validate(mc));
    int first, last;
    SPES_TRY(trainer_own_experts(cfg, mc->num_experts, &first, &last));
    SPES_TRY(param_table_build(mc, table));
    bool *mask = spes_calloc((size_t)table->count, sizeof(bool));
    if (!mask) {
        param_table_free(table);
        return SPES_ERR;
    }
    param_table_expert_mask(table, first, last, mask);
    param_table_set_trainable(table, mask);
    free(mask);
    return SPES_OK;
}

static void count_params(const ModelConfig *mc, const ParamTable *t, PlanParams *p) {
    memset(p, 0, sizeof *p);
    p->total = t->total_numel;
    p->trainable = t->trainable_numel;
    p->frozen = p->total - p->trainable;
    for (int i = 0; i < t->count; i++)
        if (t->entries[i].expert >= 0) p->experts += t->entries[i].numel;
    // Each token runs top_k of each layer's E experts (all experts have the same size).
    p->active = p->total - p->experts + p->experts / (size_t)mc->num_experts * (size_t)mc->top_k;
}

// The ledger of one rank, in trainer_create's, trainer_step's and the boundaries' order.
static int plan_memory(const ModelConfig *mc, const ParamTable *t, const PlanTarget *g, PlanMemory *m) {
    memset(m, 0, sizeof *m);
    const int L = mc->n_layers;
    const size_t P = t->total_numel, T = t->trainable_numel, f4 = sizeof(float);
    const size_t cs = g->compute != NUM_F32 ? num_type_size(g->compute) : 0;   // no compute copy in fp32
    const bool dist = g->strategy != PLAN_SINGLE, zgrads = g->strategy == PLAN_ZERO2 || g->strategy == PLAN_ZERO3,
               z3 = g->strategy == PLAN_ZERO3, sharded_state = dist && g->strategy != PLAN_DDP;
    if (dist && g->ranks < 2) return spes_fail("plan: strategy %s needs 2 ranks or more", plan_strategy_name(g->strategy));

    for (int k = 0; k < 3; k++) {
        m->acts_mode[k] = model_acts_bytes(mc, &g->layout, g->micro_batch, g->seq_len, (ActKeep)k, &m->logits_chunk);
        if (!m->acts_mode[k])
            return spes_fail("plan: activation memory for micro-batch %d x seq %d overflows", g->micro_batch, g->seq_len);
    }
    m->acts = m->acts_mode[g->checkpointing];

    // Shards of the gradient layout (rank 0's, the largest: the first n % ranks are one longer).
    size_t *lo = spes_calloc((size_t)g->ranks + 1, sizeof *lo);
    if (!lo) return SPES_ERR;
    dp_shard_bounds(T, g->ranks, lo);
    const size_t shard_n = lo[1] - lo[0];
    free(lo);
    const size_t state_n = sharded_state ? shard_n : T;
    size_t pwork_n, gwork_n;
    part_spans(t, L, &pwork_n, &gwork_n);
    const int gslots = g->overlap ? 2 : 1, pslots = g->prefetch ? 2 : 1;

    Ledger l = {0};
    // trainer_create: the model (frozen), then its gradients (model_set_trainable)
    take(&l, P * f4);
    if (cs) take(&l, P * cs);
    if (T) take(&l, T * f4);
    if (dist) {
        DpStage stage = g->strategy == PLAN_DDP     ? DP_DDP
                        : g->strategy == PLAN_ZERO1 ? DP_ZERO1
                        : g->strategy == PLAN_ZERO2 ? DP_ZERO2
                                                    : DP_ZERO3;
        size_t scratch = dp_scratch_values(stage, t, dp_bucket_values(g->bucket_mb));
        if (scratch) take(&l, scratch * f4);
        m->work += scratch * f4;
    }
    if (zgrads) {   // sharded_grads_create: shard and working buffers, then the model's buffer goes
        take(&l, dp_values_bytes(shard_n, NUM_F32));
        for (int b = 0; b < gslots; b++) take(&l, dp_values_bytes(gwork_n, NUM_F32));
        if (T) give(&l, T * f4);
        m->grads = dp_values_bytes(shard_n, NUM_F32);
        m->work += (size_t)gslots * dp_values_bytes(gwork_n, NUM_F32);
    } else {
        m->grads = T * f4;
    }
    size_t frozen_n = P - T, staging_n = 0;
    if (z3) {   // sharded_params_create: gather staging, shard, frozen store, working buffers
        staging_n = part_gather_staging_values(t, L);
        for (int s = 0; staging_n && s < pslots; s++) take(&l, staging_n * f4);
        take(&l, dp_values_bytes(shard_n, NUM_F32));
        take(&l, dp_values_bytes(frozen_n, NUM_F32));
        for (int b = 0; b < pslots; b++) {
            take(&l, dp_values_bytes(pwork_n, NUM_F32));
            if (cs) take(&l, dp_values_bytes(pwork_n, g->compute));
        }
        m->frozen_store = dp_values_bytes(frozen_n, NUM_F32);
        m->work += (size_t)pslots * (staging_n * f4 + dp_values_bytes(pwork_n, NUM_F32) +
                                     (cs ? dp_values_bytes(pwork_n, g->compute) : 0));
    }
    // AdamW (its shard under ZeRO-1/2/3): on the device unless offloaded
    if (state_n && !g->cpu_offload) {
        take(&l, state_n * f4);
        take(&l, state_n * f4);
        m->moments = 2 * state_n * f4;
    }
    if (g->clip_adaptive) {   // adaptive clipping's per-tensor sums (train/clip_adaptive.h)
        const size_t sums = ((size_t)t->count + 1) * sizeof(double);
        take(&l, sums);
        m->work += sums;
    }
    if (g->gpu) {   // the GEMM that measures the GPU's peak at start (two n x n compute buffers)
        const size_t probe = (size_t)4096 * 4096 * num_type_size(g->compute);
        take(&l, probe);
        take(&l, probe);
        give(&l, probe);
        give(&l, probe);
    }
    m->peak_setup = l.peak;

    // The first step: ZeRO-3 releases the model's parameters, the arena is planned.
    size_t params_bytes = P * f4 + P * cs;
    if (z3) give(&l, params_bytes);
    m->master = z3 ? dp_values_bytes(shard_n, NUM_F32) : P * f4;
    m->compute_copy = z3 ? 0 : P * cs;
    Ledger step = {.now = l.now, .peak = l.now};
    take(&step, m->acts);
    m->peak_step = step.peak;

    // Boundaries: an evaluation may grow the arena for good (model_acts_plan reuses a larger
    // one), ZeRO-3 restores the full parameters, a sharded checkpoint gathers the full optimizer
    // state (adamw_create on the cpu backend: the backend's memory on cpu, host memory on a GPU).
    size_t eval_acts = g->eval_batch > 0 ? model_acts_bytes(mc, &g->layout, g->eval_batch, g->seq_len, ACT_KEEP_INPUTS, NULL) : 0;
    size_t arena = eval_acts > m->acts ? eval_acts : m->acts;
    // That state is an AdamW on the cpu backend with the run's settings: with cpu_offload its
    // moments and staging are host_alloc'd (4 arrays, never the backend's), else backend buffers.
    size_t full_state = sharded_state && T ? (g->cpu_offload ? 4 : 2) * T * f4 : 0;
    bool full_on_backend = !g->gpu && !g->cpu_offload;
    m->boundary_extra = (arena - m->acts) + (z3 ? params_bytes : 0) + (full_on_backend ? full_state : 0);
    m->peak_boundary = step.now + m->boundary_extra;
    m->peak = m->peak_setup;
    if (m->peak_step > m->peak) m->peak = m->peak_step;
    if (m->peak_boundary > m->peak) m->peak = m->peak_boundary;

    // Host memory the backend does not count.
    if (g->gpu) m->host += P * f4;                                   // the page-locked host copy
    if (state_n && g->cpu_offload) m->host += 4 * state_n * f4;      // m, v and the staging of g and p
    else if (state_n && g->gpu) m->host += 2 * state_n * f4;         // the moments' host copies
    if (!full_on_backend) m->host += full_state;                      // a sharded checkpoint's full state
    return SPES_OK;
}

int plan_compute(const TrainConfig *cfg, const PlanTarget *target, Plan *out) {
    memset(out, 0, sizeof *out);
    out->target = *target;
    if (target->micro_batch < 1 || target->seq_len < 1)
        return spes_fail("plan: micro-batch %d x seq %d", target->micro_batch, target->seq_len);
    Model m;   // the table and config only: what model_train_flops reads
    memset(&m, 0, sizeof m);
    SPES_TRY(build_table(cfg, &m.cfg, &m.table));
    count_params(&m.cfg, &m.table, &out->params);
    int rc = plan_memory(&m.cfg, &m.table, target, &out->mem);
    out->flops_per_token = model_train_flops(&m, 1, target->seq_len) / target->seq_len;
    if (rc == SPES_OK) rc = save_space_checkpoint_bytes(cfg, &m.table, &out->checkpoint_bytes);
    param_table_free(&m.table);
    return rc;
}

int plan_max_micro_batch(const TrainConfig *cfg, const PlanTarget *target, size_t budget, int limit, int *best) {
    *best = 0;
    PlanTarget g = *target;
    Plan p;
    // The peak grows with B (the arena does): the largest B with peak <= budget, by doubling
    // then bisection.
    int lo = 0, hi = 1;
    for (;;) {
        g.micro_batch = hi;
        SPES_TRY(plan_compute(cfg, &g, &p));
        if (p.mem.peak > budget) break;
        lo = hi;
        if (hi >= limit) break;
        hi = hi * 2 > limit ? limit : hi * 2;
    }
    if (lo == hi) {
        *best = lo;
        return SPES_OK;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        g.micro_batch = mid;
        SPES_TRY(plan_compute(cfg, &g, &p));
        if (p.mem.peak <= budget) lo = mid;
        else hi = mid;
    }
    *best = lo;
    return SPES_OK;
}
