// Data parallelism over the ranks of one node: what each strategy does with the gradients,
// the optimizer state and the parameters after the micro-batches of a step.
//
//   strategy           gradients                       optimizer state    parameters
//   ddp / NO_SHARD     full buffer; bucketed           full on every      full, updated everywhere
//                      all-reduce (sum)                rank
//   SHARD_OPTIM (Z1)   full buffer; bucketed           rank's shard only  shard updated, all-gathered
//                      all-reduce (sum)
//   SHARD_GRAD_OP (Z2) rank's shard only: each part    rank's shard only  shard updated, all-gathered
//                      reduce-scattered right after
//                      its backward (sharded_grads.h)
//   FULL_SHARD (Z3)    as ZeRO-2                       rank's shard only  rank's fp32 shard only; each part
//                                                                         all-gathered right before use
//                                                                         (sharded_params.h)
//
// DDP and ZeRO-1 keep the full-size gradient buffer the backward accumulates into (every
// micro-batch adds into it) and reduce it once per step, in buckets (below). ZeRO-2 and ZeRO-3
// have no full-size gradient buffer and no buckets: each micro-batch's gradients are
// reduce-scattered part by part into the ranks' gradient shards (parallel/sharded_grads.h).
//
// Buckets and overlap (DDP, ZeRO-1). The gradient layout is cut into buckets of `bucket`
// values; each is one non-blocking all-reduce, in place. During the last micro-batch's
// backward the model's hooks (model.h) report each part whose gradients are final; a bucket
// starts as soon as every tensor in it is final (ddp.overlap_grad_reduce), so its reduction
// runs while the backward goes on. Buckets always start in one order, the last bucket first
// (the backward's order: head, last layer, ..., embedding), whether overlapped or not and on
// every rank (a rank without micro-batches starts them all at the end): the same MPI/NCCL
// calls on the same data, so overlap changes timing, never bits. ZeRO-1 and ZeRO-2 all-gather
// the updated parameters in buckets of the same size.
//
// Shards are contiguous ranges of the flat gradient buffer (trainable tensors only, in table
// order: frozen experts have no gradient, so they take part in no gradient collective):
// rank r owns [lo[r], lo[r+1]), sizes as equal as whole values allow. A tensor may straddle
// two shards: AdamW is element-wise, so each rank updates its piece exactly as the whole
// tensor would be updated (bit for bit).
//
// The micro-batches of the step are split by the trainer (train/trainer.c: rank r runs
// micro-batches [n*r/N, n*(r+1)/N) and reads only their rows of the batch); each rank's
// gradients are of loss_i / n_micro over the GLOBAL micro-batch count, so the sum over ranks
// is the gradient one rank would have accumulated.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "parallel/comm.h"
#include "model/model.h"
#include "model/param_table.h"
#include "ops/backend.h"
#include "train/optimizer.h"

typedef enum { DP_DDP = 0, DP_ZERO1, DP_ZERO2, DP_ZERO3 } DpStage;

typedef struct {
    Comm *comm;
    Backend *be;
    const ParamTable *table;
    int n_layers;          // the model's, to map tensors to the hooks' parts (param_part)
    int rank, size;
    DpStage stage;
    size_t n;              // trainable values (gradient buffer length)
    size_t *lo;            // [size + 1] shard boundaries
    size_t bucket;         // values per gradient bucket
    size_t n_buckets;
    float *scratch;        // [scratch_n] backend memory: one bucket for the parameter all-gather
    size_t scratch_n;      // when the layout is not contiguous, else NULL
    bool contiguous;       // trainable tensors == the front of the parameter buffer (no frozen ones)
    int *counts;           // [size] scratch
    // one step's reduction (dp_reduce_begin .. dp_reduce_grads)
    float *grads;          // the gradient buffer being reduced
    int *unfinished;       // [n_buckets] tensors in the bucket whose gradients are not final yet
    ptrdiff_t next;        // the next bucket to start (they start from the last down to 0)
    size_t started_in_backward;   // buckets the hooks started (the rest start in dp_reduce_grads)
    ModelHooks hooks;      // the model's hooks that start buckets as the backward finishes parts
} DataParallel;

// The stage from distributed_strategy + fsdp.sharding_strategy (`single` with more than one
// rank is an error).
int dp_stage_from_config(const TrainConfig *cfg, int world_size, DpStage *out);
const char *dp_stage_name(DpStage s);   // "ddp", "zero1", "zero2", "zero3"
// True when the stage keeps gradient shards only (ZeRO-2 and ZeRO-3: parallel/sharded_grads.h).
bool dp_shards_grads(DpStage s);

// Values per gradient bucket for ddp.bucket_cap_mb (at least 1024, at most 2^30).
size_t dp_bucket_values(double bucket_mb);
// lo[size + 1]: the shard boundaries of n values over `size` ranks (equal, the first n % size
// one value longer).
void dp_shard_bounds(size_t n, int size, size_t *lo);
// Values of the collective scratch dp_create allocates (ZeRO-1/2 with frozen tensors: one bucket).
size_t dp_scratch_values(DpStage stage, const ParamTable *table, size_t bucket);
// `table` (of a model of n_layers layers) must outlive dp; dp must not be moved afterwards
// (dp->hooks points at it).
int dp_create(DataParallel *dp, Comm *comm, Backend *be, DpStage stage, const ParamTable *table, int n_layers,
              double bucket_mb);
// Backend memory for n values of type t, zeroed, one more than asked so that an empty shard
// (or ZeRO-3's pack of frozen tensors when there are none) still has a buffer; NULL with a
// message.
void *dp_alloc_values(Backend *be, size_t n, NumType t);
// The overlap of [b0, b1) with shard r, [lo[r], lo[r+1]): its length (0: none), from *start.
size_t dp_shard_overlap(const size_t *lo, int r, size_t b0, size_t b1, size_t *start);
// counts[r] = the length of [b0, b1)'s overlap with shard r (r < size): the blocks of a
// collective over that range of the gradient layout.
void dp_range_counts(const size_t *lo, int size, size_t b0, size_t b1, int *counts);
// True when every trainable tensor's gradient offset equals its parameter offset (no frozen
// tensor before a trainable one): the gradient layout is then a prefix of the parameters.
bool dp_layout_is_contiguous(const ParamTable *table);
void dp_free(DataParallel *dp);

// The range of the gradient layout whose optimizer state this rank holds ([0, n) under DDP).
void dp_state_range(const DataParallel *dp, size_t *lo, size_t *hi);

// One step's gradient reduction (DDP, ZeRO-1). dp_reduce_begin before the step's
// micro-batches; set model->hooks = &dp->hooks around the LAST micro-batch to start buckets
// during its backward (leave it NULL to reduce everything after the backward); then
// dp_reduce_grads starts the buckets not started yet and waits for all: `grads` then holds the
// sum over ranks on every rank. Every rank calls both, also a rank that computed no micro-batch.
void dp_reduce_begin(DataParallel *dp, float *grads);
int dp_reduce_grads(DataParallel *dp, float *grads);
// The function behind dp->hooks: POST_BACKWARD of a part starts the buckets it completes;
// every event lets the started collectives progress.
int dp_on_model_event(void *ctx, ModelHookEvent event, int part);
// DDP/ZeRO-1: the gradient AdamW reads on this rank, laid out from the state range's start.
float *dp_step_grads(DataParallel *dp, float *grads);
// ZeRO-2/3: the L2 norm of the whole gradient from the ranks' gradient shards
// ([lo[rank+1] - lo[rank]] values each; a collective that every rank enters, also one whose
// own sum failed: its NaN reaches the others). Clipping is AdamW's grad_scale.
int dp_shard_grad_norm(DataParallel *dp, const float *shard, double *norm);
// ZeRO-1/2: every rank's updated shard of the trainable parameters (fp32 master `dparams`,
// and the compute copy when there is one) reaches every rank. No-op under DDP; an error under
// ZeRO-3 (its parameters stay sharded).
int dp_gather_params(DataParallel *dp, const ParamTable *table, float *dparams, Buf compute);

// Checkpoints: the full optimizer state on every rank (host), from the shards.
// `full` must be a host AdamW over the whole trainable range; its step is opt's. opt's
// moments must be on the host (adamw_state_to_host), on every rank: each rank enters the
// gathers (see comm_all_ok).
int dp_gather_state(DataParallel *dp, const AdamW *opt, AdamW *full);
// Resume: this rank's shard of a full host state (loaded from a checkpoint at any world size).
int dp_scatter_state(DataParallel *dp, const AdamW *full, AdamW *opt);
