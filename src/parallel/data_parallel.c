// Gradient reduction, sharded optimizer state and parameter all-gather. See data_parallel.h.
#include "parallel/data_parallel.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

int dp_stage_from_config(const TrainConfig *cfg, int world_size, DpStage *out) {
    const char *ds = cfg->distributed_strategy, *ss = cfg->fsdp_sharding_strategy;
    *out = DP_DDP;
    if (strcmp(ds, "single") == 0) {
        if (world_size > 1)
            return spes_fail("distributed_strategy is single but the job has %d ranks: set ddp or fsdp, or launch "
                             "one rank (no --nproc_per_node)",
                             world_size);
        return SPES_OK;
    }
    if (strcmp(ds, "ddp") == 0 || strcmp(ss, "NO_SHARD") == 0) return SPES_OK;
    *out = strcmp(ss, "SHARD_OPTIM") == 0 ? DP_ZERO1 : strcmp(ss, "FULL_SHARD") == 0 ? DP_ZERO3 : DP_ZERO2;
    return SPES_OK;
}

const char *dp_stage_name(DpStage s) {
    return s == DP_ZERO1 ? "zero1" : s == DP_ZERO2 ? "zero2" : s == DP_ZERO3 ? "zero3" : "ddp";
}

bool dp_shards_grads(DpStage s) { return s == DP_ZERO2 || s == DP_ZERO3; }

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

bool dp_layout_is_contiguous(const ParamTable *table) {
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        if (pi->trainable && (pi->grad_offset < 0 || (size_t)pi->grad_offset != pi->offset)) return false;
    }
    return true;
}

void *dp_alloc_values(Backend *be, size_t n, NumType t) {
    void *p = NULL;
    return backend_alloc(be, (n + 1) * num_type_size(t), &p) == SPES_OK ? p : NULL;
}

size_t dp_shard_overlap(const size_t *lo, int r, size_t b0, size_t b1, size_t *start) {
    size_t a = max_sz(b0, lo[r]), e = min_sz(b1, lo[r + 1]);
    *start = a;
    return e > a ? e - a : 0;
}

void dp_range_counts(const size_t *lo, int size, size_t b0, size_t b1, int *counts) {
    size_t start;
    for (int r = 0; r < size; r++) counts[r] = (int)dp_shard_overlap(lo, r, b0, b1, &start);
}

size_t dp_bucket_values(double bucket_mb) {
    // A bucket is one MPI/NCCL call: at least 1024 values, at most what an MPI count holds.
    double bucket = bucket_mb * 1e6 / sizeof(float);
    return bucket < 1024 ? 1024 : bucket > (double)(1 << 30) ? (size_t)1 << 30 : (size_t)bucket;
}

void dp_shard_bounds(size_t n, int size, size_t *lo) {
    // Equal shards, the first n % size one value longer.
    size_t base = n / (size_t)size, extra = n % (size_t)size;
    lo[0] = 0;
    for (int r = 0; r < size; r++) lo[r + 1] = lo[r] + base + ((size_t)r < extra);
}

size_t dp_scratch_values(DpStage stage, const ParamTable *table, size_t bucket) {
    // The parameter all-gather of ZeRO-1/2 goes through one bucket of scratch unless the
    // trainable tensors are the front of the parameter buffer (then it runs in place).
    size_t n = table->trainable_numel;
    if ((stage != DP_ZERO1 && stage != DP_ZERO2) || dp_layout_is_contiguous(table)) return 0;
    return bucket < n ? bucket : n;
}

int dp_create(DataParallel *dp, Comm *comm, Backend *be, DpStage stage, const ParamTable *table, int n_layers,
              double bucket_mb) {
    memset(dp, 0, sizeof *dp);
    dp->comm = comm;
    dp->be = be;
    dp->table = table;
    dp->n_layers = n_layers;
    dp->rank = comm_rank(comm);
    dp->size = comm_size(comm);
    dp->stage = stage;
    dp->n = table->trainable_numel;
    dp->bucket = dp_bucket_values(bucket_mb);
    dp->n_buckets = (dp->n + dp->bucket - 1) / dp->bucket;
    dp->hooks = (ModelHooks){.fn = dp_on_model_event, .ctx = dp};
    if (!(dp->lo = spes_calloc((size_t)dp->size + 1, sizeof *dp->lo)) ||
        !(dp->counts = spes_calloc((size_t)dp->size, sizeof *dp->counts)) ||
        !(dp->unfinished = spes_calloc(dp->n_buckets + 1, sizeof *dp->unfinished))) {
        dp_free(dp);
        return SPES_ERR;
    }
    dp_shard_bounds(dp->n, dp->size, dp->lo);
    size_t base = dp->n / (size_t)dp->size;
    if (stage != DP_DDP && base + 1 > (size_t)INT_MAX) {
        dp_free(dp);
        return spes_fail("dist: a shard of %zu values is more than MPI/NCCL counts hold; use more ranks", base + 1);
    }
    // Scratch of one bucket: the parameter all-gather goes through it bucket by bucket, unless
    // the trainable tensors are the front of the parameter buffer in table order (every tensor
    // trainable: no frozen experts), when the all-gather runs in place on the parameters.
    dp->contiguous = dp_layout_is_contiguous(table);
    size_t scratch = dp_scratch_values(stage, table, dp->bucket);
    dp->scratch_n = scratch;
    int rc = SPES_OK;
    if (scratch) rc = backend_alloc(be, scratch * sizeof(float), (void **)&dp->scratch);
    if (rc != SPES_OK) {
        dp_free(dp);
        return spes_fail_context("dist: %s buffers for %zu trainable values", dp_stage_name(stage), dp->n);
    }
    return SPES_OK;
}

void dp_free(DataParallel *dp) {
    if (dp->be) backend_free(dp->be, dp->scratch);
    free(dp->lo);
    free(dp->counts);
    free(dp->unfinished);
    memset(dp, 0, sizeof *dp);
}

void dp_state_range(const DataParallel *dp, size_t *lo, size_t *hi) {
    if (dp->stage == DP_DDP) {
        *lo = 0;
        *hi = dp->n;
    } else {
        *lo = dp->lo[dp->rank];
        *hi = dp->lo[dp->rank + 1];
    }
}

// ---- one step's gradient reduction ----

// Adds `delta` to unfinished[] of every bucket holding a trainable tensor of `part` (-1: of any).
static void count_tensors(DataParallel *dp, int part, int delta) {
    const ParamTable *t = dp->table;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *pi = &t->entries[i];
        if (!pi->trainable || pi->grad_offset < 0 || pi->numel == 0) continue;
        if (part >= 0 && param_part(pi, dp->n_layers) != part) continue;
        size_t go = (size_t)pi->grad_offset;
        for (size_t b = go / dp->bucket; b <= (go + pi->numel - 1) / dp->bucket; b++) dp->unfinished[b] += delta;
    }
}

void dp_reduce_begin(DataParallel *dp, float *grads) {
    dp->grads = grads;
    dp->next = (ptrdiff_t)dp->n_buckets - 1;
    dp->started_in_backward = 0;
    memset(dp->unfinished, 0, dp->n_buckets * sizeof *dp->unfinished);
    count_tensors(dp, -1, +1);
}

// Bucket b's all-reduce, started.
static int start_bucket(DataParallel *dp, size_t b) {
    size_t b0 = b * dp->bucket, b1 = min_sz(b0 + dp->bucket, dp->n);
    return comm_start_allreduce_sum(dp->comm, dp->be, dp->grads + b0, b1 - b0);
}

// Starts buckets from dp->next down while they are final (all of them when `all`), so every
// rank starts them in the same order whatever its backward did.
static int start_buckets(DataParallel *dp, bool all) {
    while (dp->next >= 0 && (all || dp->unfinished[dp->next] == 0)) {
        SPES_TRY(start_bucket(dp, (size_t)dp->next));
        dp->next--;
        if (!all) dp->started_in_backward++;
    }
    return SPES_OK;
}

// The model's hook: a part whose gradients are final counts down its tensors' buckets.
int dp_on_model_event(void *ctx, ModelHookEvent event, int part) {
    DataParallel *dp = ctx;
    if (event != MODEL_HOOK_POST_BACKWARD) return comm_progress(dp->comm);
    count_tensors(dp, part, -1);
    SPES_TRY(start_buckets(dp, false));
    return comm_progress(dp->comm);
}

int dp_reduce_grads(DataParallel *dp, float *grads) {
    if (dp_shards_grads(dp->stage))
        return spes_fail("dist: %s reduces its gradients per part (sharded_grads.h), not in buckets", dp_stage_name(dp->stage));
    if (grads != dp->grads) return spes_fail("dist: dp_reduce_grads without dp_reduce_begin on that buffer");
    SPES_TRY(start_buckets(dp, true));
    return comm_wait_all(dp->comm);
}

float *dp_step_grads(DataParallel *dp, float *grads) {
    size_t lo, hi;
    dp_state_range(dp, &lo, &hi);
    return grads ? grads + lo : NULL;
}

int dp_shard_grad_norm(DataParallel *dp, const float *shard, double *norm) {
    size_t mine = dp->lo[dp->rank + 1] - dp->lo[dp->rank];
    double sumsq;
    int rc = grad_sum_of_squares(dp->be, shard, mine, &sumsq);
    if (rc != SPES_OK) sumsq = NAN;
    // A NaN is summed too (no early return): every rank gets it, and no rank's next
    // collective meets another's norm all-reduce.
    SPES_TRY(comm_allreduce_sum(dp->comm, NULL, &sumsq, 1, COMM_F64));
    *norm = sqrt(sumsq);
    return rc;
}


// fn(dp, param offset, gradient-layout offset, length) for every piece of a trainable tensor
// inside [r0, r1) of the gradient layout that is inside this rank's shard (own) or outside it.
typedef void (*PieceFn)(DataParallel *dp, float *dparams, Buf compute, size_t at, size_t g, size_t len, size_t b0);

static void for_pieces(DataParallel *dp, const ParamTable *table, size_t r0, size_t r1, bool own, float *dparams,
                       Buf compute, PieceFn fn) {
    size_t lo = dp->lo[dp->rank], hi = dp->lo[dp->rank + 1];
    for (int i = 0; i < table->count; i++) {
        const ParamInfo *pi = &table->entries[i];
        if (!pi->trainable || pi->grad_offset < 0) continue;
        size_t go = (size_t)pi->grad_offset, s0 = max_sz(go, r0), s1 = min_sz(go + pi->numel, r1);
        if (s0 >= s1) continue;
        if (own) {
            size_t a = max_sz(s0, lo), b = min_sz(s1, hi);
            if (a < b) fn(dp, dparams, compute, pi->offset + (a - go), a, b - a, r0);
        } else {   // up to two pieces: before the shard and after it
            size_t b1 = min_sz(s1, lo), a2 = max_sz(s0, hi);
            if (s0 < b1) fn(dp, dparams, compute, pi->offset + (s0 - go), s0, b1 - s0, r0);
            if (a2 < s1) fn(dp, dparams, compute, pi->offset + (a2 - go), a2, s1 - a2, r0);
        }
    }
}

static void put_piece(DataParallel *dp, float *dparams, Buf compute, size_t at, size_t g, size_t len, size_t b0) {
    dp->be->ops->copy(dp->be, dp->scratch + (g - b0), dparams + at, len * sizeof(float));
}

static void take_piece(DataParallel *dp, float *dparams, Buf compute, size_t at, size_t g, size_t len, size_t b0) {
    if (!dp->contiguous) dp->be->ops->copy(dp->be, dparams + at, dp->scratch + (g - b0), len * sizeof(float));
    if (compute.p) dp->be->ops->convert(dp->be, buf_at(compute, at), buf_f32(dparams + at), len);
}

int dp_gather_params(DataParallel *dp, const ParamTable *table, float *dparams, Buf compute) {
    if (dp->stage == DP_ZERO3) return spes_fail("dist: zero3 keeps its parameters sharded; nothing to all-gather");
    if (dp->stage == DP_DDP || dp->n == 0) return SPES_OK;
    if (dp->contiguous) {
        // Shards are ranges of the parameter buffer itself: gathered in place, one bucket at a time.
        for (size_t b0 = 0; b0 < dp->n; b0 += dp->bucket) {
            size_t b1 = min_sz(b0 + dp->bucket, dp->n);
            dp_range_counts(dp->lo, dp->size, b0, b1, dp->counts);
            SPES_TRY(comm_allgather(dp->comm, dp->be, dparams + b0, dp->counts));
            if (compute.p) for_pieces(dp, table, b0, b1, false, dparams, compute, take_piece);
        }
        return backend_sync(dp->be);
    }
    for (size_t b0 = 0; b0 < dp->n; b0 += dp->scratch_n) {
        size_t b1 = min_sz(b0 + dp->scratch_n, dp->n);
        dp_range_counts(dp->lo, dp->size, b0, b1, dp->counts);
        for_pieces(dp, table, b0, b1, true, dparams, compute, put_piece);
        SPES_TRY(comm_allgather(dp->comm, dp->be, dp->scratch, dp->counts));
        for_pieces(dp, table, b0, b1, false, dparams, compute, take_piece);
    }
    return backend_sync(dp->be);
}

int dp_gather_state(DataParallel *dp, const AdamW *opt, AdamW *full) {
    if (full->numel != dp->n) return spes_fail("dist: full optimizer state of %zu values, expected %zu", full->numel, dp->n);
    full->step = opt->step;
    adamw_copy_norm_avg(full, opt);   // every rank holds all of them
    if (dp->n == 0) return SPES_OK;
    size_t lo, hi;
    dp_state_range(dp, &lo, &hi);
    memcpy(full->m + lo, opt->m, (hi - lo) * sizeof(float));
    memcpy(full->v + lo, opt->v, (hi - lo) * sizeof(float));
    if (dp->stage == DP_DDP) return SPES_OK;
    for (int r = 0; r < dp->size; r++) dp->counts[r] = (int)(dp->lo[r + 1] - dp->lo[r]);
    SPES_TRY(comm_allgather(dp->comm, NULL, full->m, dp->counts));
    return comm_allgather(dp->comm, NULL, full->v, dp->counts);
}

int dp_scatter_state(DataParallel *dp, const AdamW *full, AdamW *opt) {
    if (full->numel != dp->n) return spes_fail("dist: full optimizer state of %zu values, expected %zu", full->numel, dp->n);
    size_t lo, hi;
    dp_state_range(dp, &lo, &hi);
    if (opt->numel != hi - lo) return spes_fail("dist: optimizer shard of %zu values, expected %zu", opt->numel, hi - lo);
    opt->step = full->step;
    adamw_copy_norm_avg(opt, full);
    if (hi > lo) {
        memcpy(opt->m, full->m + lo, (hi - lo) * sizeof(float));
        memcpy(opt->v, full->v + lo, (hi - lo) * sizeof(float));
    }
    return adamw_state_to_device(opt);
}
