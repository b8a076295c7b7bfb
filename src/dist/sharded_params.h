// ZeRO-3 (fsdp.sharding_strategy FULL_SHARD): a rank keeps the fp32 values and the gradient
// of its shard of the trainable parameters only. Each part of the model (the hooks' unit:
// embedding, layer l, head) is all-gathered into one working buffer right before the part
// runs, and its gradients go into one working gradient buffer that is reduce-scattered into
// the ranks' gradient shards as soon as the part's backward is done.
//
//   held per rank           size                                     data_parallel.h ZeRO-2 holds
//   shard                   lo[r+1] - lo[r] trainable values         every parameter
//   gradient shard          lo[r+1] - lo[r] values                   every gradient
//   frozen store            the frozen tensors (SPES: experts this
//                           peer does not own), packed; every rank
//   working buffers         the largest part's parameters, the
//                           largest part's gradients
//
// The shards are exactly ZeRO-2's shards of the gradient layout, so AdamW updates the
// parameter shard in place from the gradient shard (adamw_step_packed) and nothing is
// all-gathered after the step.
//
// Gradients. The model's own gradient buffer is released. A part's gradients are bound to the
// working gradient buffer (model_bind_part), zeroed before the part first writes them (the
// head at its PRE_FORWARD: lm_head's gradient is computed with its forward; every other part
// at its PRE_BACKWARD); at its POST_BACKWARD the part's range of the gradient layout is
// reduce-scattered (summed over ranks) and this rank's block added to its gradient shard. So
// each micro-batch's gradient is summed over ranks first and the sums are accumulated over
// micro-batches: another summation order than ZeRO-2's (micro-batches accumulated on each rank,
// then summed over ranks once), equal to it within fp32 rounding, and bit for bit when every
// rank runs one micro-batch (with 2 ranks, where a + b has one order).
//
// Collectives from hooks. sharded_params_hooks() gathers part p at PRE_FORWARD/PRE_BACKWARD
// unless p is the part in the working buffer already, and reduces at POST_BACKWARD. Every
// rank must make the same collective calls in the same order, so every rank runs the same
// number of passes per step: a rank with fewer micro-batches first replays passes without
// work (sharded_params_idle_pass: zero gradients go into the sums), then runs its own.
//
// Outside the steps the model holds its full parameters (sharded_params_unshard: every part
// gathered into the model's own, restored buffers): checkpoints, evaluation and the SPES
// sync read and write them there, then sharded_params_shard takes the shard and the frozen
// store from them again and releases them. Both are collectives.
//
// Backends. Every buffer is the backend's memory and every move a backend copy, so the cpu
// backend (MPI) and cuda (NCCL) run this same code. With a low-precision compute type (amp_bf16,
// amp_fp16) the gathered fp32 part is also converted into a compute working buffer, the copy
// the GEMMs read, as model_params_to_device converts the whole model; unshard converts the
// whole restored model the same way. On cuda the model keeps its host copy (page-locked
// memory, not the device's) while sharded: only device buffers are released.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "dist/data_parallel.h"
#include "dist/part_gather.h"
#include "model/model.h"

typedef struct {
    Model *m;
    DataParallel *dp;      // the gradient side (its shard boundaries, its bucket hooks)
    PartGather gather;
    float *shard;          // [shard_n] this rank's fp32 master values of the gradient layout
    size_t shard_n;
    float *frozen;         // [gather.frozen_numel] the frozen tensors, packed in table order
    float *work;           // [work_n] the working buffer (the largest part's span)
    void *cwork;           // [work_n] its compute copy in be->compute; NULL when compute is fp32
    size_t work_n;
    float *gshard;         // [shard_n] this rank's gradient shard, summed over ranks and micro-batches
    float *gwork;          // [gwork_n] the working gradient buffer (the largest part's gradient range)
    size_t gwork_n;
    int gbound;            // the part whose gradients gwork holds (-1: none)
    int *counts;           // [ranks] scratch: a part's blocks of the reduce-scatter
    int bound;             // the part the working buffer holds (-1: none)
    bool sharded;          // the model's buffers are released; parts come from the shards
    ModelHooks hooks;      // the model's hooks while sharded
} ShardedParams;

// For model m (on any backend) trained under dp (stage DP_ZERO3). m and dp must
// outlive z, and z must not move afterwards (z->hooks points at it). Allocates the buffers;
// the model keeps its parameters and its gradient buffer until sharded_params_shard. The
// gradient buffer stays released for good (model_restore_grads gives it back).
int sharded_params_create(ShardedParams *z, Model *m, DataParallel *dp);
void sharded_params_free(ShardedParams *z);

// The model's full parameters -> this rank's shard and the frozen store; the model's parameter
// (and, the first time, gradient) buffers are released. Every rank holds the same full
// parameters when it is called.
int sharded_params_shard(ShardedParams *z);
// Collective: the model's buffers restored and filled with every part, gathered.
int sharded_params_unshard(ShardedParams *z);

// Before a step's passes: the gradient shard zeroed.
void sharded_params_zero_grads(ShardedParams *z);
// The hooks for a pass while sharded.
const ModelHooks *sharded_params_hooks(ShardedParams *z);
// A pass's collectives without its work (a rank with fewer micro-batches than another).
int sharded_params_idle_pass(ShardedParams *z);
// After the update: the values changed, so the next part is gathered afresh.
void sharded_params_updated(ShardedParams *z);

// Backend bytes this rank holds for parameters while sharded: shard, frozen store, working
// buffers (fp32 and compute copy), gather staging.
size_t sharded_params_bytes(const ShardedParams *z);
// Backend bytes this rank holds for gradients: the gradient shard and the working buffer.
size_t sharded_params_grad_bytes(const ShardedParams *z);
