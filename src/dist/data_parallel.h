// Data parallelism over the ranks of one node: what each strategy does with the gradient
// buffer, the optimizer state and the parameters after the micro-batches of a step.
//
//   strategy           gradients                     optimizer state        parameters
//   ddp / NO_SHARD     bucketed all-reduce (sum)     full on every rank     full, updated everywhere
//   SHARD_OPTIM (Z1)   bucketed all-reduce (sum)     rank's shard only      shard updated, all-gathered
//   SHARD_GRAD_OP (Z2) bucketed reduce-scatter       rank's shard only      shard updated, all-gathered
//   FULL_SHARD (Z3)    as Z2; parameter sharding is not implemented: runs as Z2, with a warning
//
// ZeRO-2 keeps the full-size gradient buffer the backward accumulates into (the model's
// backward has no per-layer hook to reduce and free gradients as they are produced); what is
// sharded is the reduced gradient, the clipping and the update.
//
// Shards are contiguous ranges of the flat gradient buffer (trainable tensors only, in table
// order: frozen experts have no gradient, so they take part in no gradient collective):
// rank r owns [lo[r], lo[r+1]), sizes as equal as whole values allow. A tensor may straddle
// two shards: AdamW is element-wise, so each rank updates its piece exactly as the whole
// tensor would be updated (bit for bit).
//
// The micro-batches of the step are split by the trainer (train/rank_batch.h); each rank's
// gradients are of loss_i / n_micro over the GLOBAL micro-batch count, so the sum over ranks
// is the gradient one rank would have accumulated.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "dist/comm.h"
#include "model/param_table.h"
#include "ops/backend.h"
#include "train/optimizer.h"

typedef enum { DP_DDP = 0, DP_ZERO1, DP_ZERO2 } DpStage;

typedef struct {
    Comm *comm;
    Backend *be;
    int rank, size;
    DpStage stage;
    size_t n;              // trainable values (gradient buffer length)
    size_t *lo;            // [size + 1] shard boundaries
    size_t bucket;         // values per gradient bucket
    float *scratch;        // [scratch_n] backend memory: one bucket (ZeRO-2 reduce-scatter; the
    size_t scratch_n;      // parameter all-gather when the layout is not contiguous), else NULL
    bool contiguous;       // trainable tensors == the front of the parameter buffer (no frozen ones)
    int *counts;           // [size] scratch
} DataParallel;

// The stage from distributed_strategy + fsdp.sharding_strategy (`single` with more than one
// rank is an error; FULL_SHARD warns that it runs as SHARD_GRAD_OP).
int dp_stage_from_config(const TrainConfig *cfg, int world_size, DpStage *out);
const char *dp_stage_name(DpStage s);   // "ddp", "zero1", "zero2"

int dp_create(DataParallel *dp, Comm *comm, Backend *be, DpStage stage, const ParamTable *table, double bucket_mb);
// True when every trainable tensor's gradient offset equals its parameter offset (no frozen
// tensor before a trainable one): the gradient layout is then a prefix of the parameters.
bool dp_layout_is_contiguous(const ParamTable *table);
void dp_free(DataParallel *dp);

// The range of the gradient layout whose optimizer state this rank holds ([0, n) under DDP).
void dp_state_range(const DataParallel *dp, size_t *lo, size_t *hi);

// Sums the ranks' gradients in `grads`: all of it (DDP/ZeRO-1), or only this rank's shard
// range (ZeRO-2: the rest of the buffer keeps this rank's own, unreduced values).
int dp_reduce_grads(DataParallel *dp, float *grads);
// The gradient AdamW reads on this rank, laid out from the state range's start.
float *dp_step_grads(DataParallel *dp, float *grads);
// L2 norm of the whole (reduced) gradient; under ZeRO-2 from the shards' sums of squares.
double dp_grad_norm(DataParallel *dp, float *grads);
// Multiplies the gradient this rank's AdamW reads by s.
void dp_grad_scale(DataParallel *dp, float *grads, float s);
// ZeRO-1/2: every rank's updated shard of the trainable parameters (fp32 master `dparams`,
// and the compute copy when there is one) reaches every rank. No-op under DDP.
int dp_gather_params(DataParallel *dp, const ParamTable *table, float *dparams, Buf compute);

// Checkpoints: the full optimizer state on every rank (host), from the shards.
// `full` must be a host AdamW over the whole trainable range; its step is opt's.
int dp_gather_state(DataParallel *dp, AdamW *opt, AdamW *full);
// Resume: this rank's shard of a full host state (loaded from a checkpoint at any world size).
int dp_scatter_state(DataParallel *dp, const AdamW *full, AdamW *opt);
