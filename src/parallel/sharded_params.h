// ZeRO-3 (fsdp.sharding_strategy FULL_SHARD): a rank keeps the fp32 values of its shard of
// the trainable parameters only, and (sharded_grads.h) the gradient of that shard. Each part
// of the model (the hooks' unit: embedding, layer l, head) is all-gathered into one working
// buffer right before the part runs; its gradients go into the sharded gradients' working
// buffer, reduce-scattered as soon as the part's backward is done.
//
//   held per rank           size                                     ZeRO-2 holds
//   shard                   lo[r+1] - lo[r] trainable values         every parameter
//   frozen store            the frozen tensors (SPES: experts this
//                           peer does not own), packed; every rank
//   working buffers         the largest part's parameters; two with
//                           prefetch
//   gradients               as ZeRO-2 (sharded_grads.h)              the same
//
// The shards are exactly the gradient shards' ranges of the gradient layout, so AdamW updates
// the parameter shard in place from the gradient shard (adamw_step_packed) and nothing is
// all-gathered after the step.
//
// Collectives from hooks. sharded_params_hooks() gathers part p at PRE_FORWARD/PRE_BACKWARD
// unless p is in its working buffer already, binds the part's parameters and gradients to the
// working buffers, and leaves the gradient side to sharded_grads_on_event.
//
// Prefetch (fsdp.prefetch, FSDP's forward_prefetch and backward_prefetch BACKWARD_PRE): two
// working buffers, part p's in buffer p mod 2. At part p's PRE_FORWARD the gather of p + 1
// starts (a non-blocking all-gather into the other buffer), at its PRE_BACKWARD that of p - 1,
// so the next part arrives while this one computes; it is completed when that part's PRE event
// comes. Two buffers also keep a part that is needed again: layer L after the head's forward,
// the embedding and layer 0 from one pass's backward into the next pass's forward. The values
// gathered are the same bits either way.
//
// Every rank must make the same collective calls in the same order, so every rank runs the
// same number of passes per step (sharded_grads_idle_pass replays one through these hooks);
// the gathers follow the events alone, so they match too.
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

#include "parallel/data_parallel.h"
#include "parallel/part_gather.h"
#include "parallel/sharded_grads.h"
#include "model/model.h"

typedef struct {
    Model *m;
    DataParallel *dp;      // the shard boundaries
    ShardedGrads *grads;   // the gradient side
    PartGather gather;
    float *shard;          // [shard_n] this rank's fp32 master values of the gradient layout
    size_t shard_n;
    float *frozen;         // [gather.frozen_numel] the frozen tensors, packed in table order
    float *work[2];        // [n_work][work_n] the working buffers (the largest part's span)
    void *cwork[2];        // [n_work][work_n] their compute copies in be->compute; NULL when fp32
    size_t work_n;
    int n_work;            // 2 with prefetch, else 1
    int holds[2];          // the part each working buffer holds (-1: none)
    int inflight;          // the part whose gather is in flight (-1: none)
    int bound;             // the part last bound to its buffer (-1: none)
    long gathers;          // part gathers started by the hooks, and how many of them as a prefetch
    long prefetched;
    bool sharded;          // the model's buffers are released; parts come from the shards
    ModelHooks hooks;      // the model's hooks while sharded
} ShardedParams;

// For model m (on any backend) trained under dp (stage DP_ZERO3) with gradients `grads`
// (sharded_grads_create'd for m and dp). m, dp and grads must outlive z, and z must not move
// afterwards (z->hooks points at it). Allocates the buffers (two working buffers with
// `prefetch`); the model keeps its parameters until sharded_params_shard.
int sharded_params_create(ShardedParams *z, Model *m, DataParallel *dp, ShardedGrads *grads, bool prefetch);
void sharded_params_free(ShardedParams *z);

// The model's full parameters -> this rank's shard and the frozen store; the model's parameter
// buffers are released. Every rank holds the same full parameters when it is called.
int sharded_params_shard(ShardedParams *z);
// Collective: the model's buffers restored and filled with every part, gathered.
int sharded_params_unshard(ShardedParams *z);

// The hooks for a pass while sharded.
const ModelHooks *sharded_params_hooks(ShardedParams *z);
// After the update: the values changed, so the next part is gathered afresh.
int sharded_params_updated(ShardedParams *z);

// Backend bytes this rank holds for parameters while sharded: shard, frozen store, working
// buffers (fp32 and compute copy), gather staging.
size_t sharded_params_bytes(const ShardedParams *z);
