// Sharded gradients: ZeRO-2 and ZeRO-3 (fsdp SHARD_GRAD_OP and FULL_SHARD). A rank keeps the
// gradient of its shard of the trainable values only (data_parallel.h's shards), never the
// full gradient buffer: the model's own gradient buffer is released.
//
//   held per rank        size
//   gradient shard       lo[r+1] - lo[r] values, summed over ranks and micro-batches
//   working buffers      1 or 2 (overlap) x the largest part's range of the gradient layout
//                        (a part: embedding, layer l, head; the model hooks' unit)
//
// A part's gradient views point at its working buffer. It is zeroed where the part first
// writes its gradients (the head at its PRE_FORWARD: lm_head's gradient is computed with its
// forward; every other part at its PRE_BACKWARD), and at the part's POST_BACKWARD the part's
// range is reduce-scattered (summed over ranks) and this rank's block added to its gradient
// shard.
//
// Overlap (ddp.overlap_grad_reduce, the default): two working buffers, part p's in buffer
// p % 2, so the reduce-scatter of a part runs while the backward of the part below it writes
// the other buffer; it is waited for (and its block added) at the next POST_BACKWARD, before a
// buffer it reads is zeroed, or at sharded_grads_finish. One reduction is in flight at most and
// blocks are added in the order the reductions started, so overlap changes timing, never bits.
// Without overlap: one buffer, each reduction waited for at once. So each micro-batch's gradient is summed over ranks first, and the sums are
// accumulated over micro-batches, as FSDP and DeepSpeed ZeRO-2 do: another summation order
// than DDP's (micro-batches accumulated on each rank, then summed over ranks once), equal to
// it within fp32 rounding, and bit for bit when every rank runs one micro-batch with 2 ranks
// (a + b has one order). The price: a rank with k micro-batches in a step moves k times the
// gradient bytes that DDP's one all-reduce moves.
//
// The reductions are collectives run from the model's hooks, so every rank must run the same
// number of passes per step: a rank with fewer micro-batches than another first replays passes
// without work (sharded_grads_idle_pass: zero gradients go into the sums).
//
// Who binds the views: under ZeRO-2 the parameters stay the model's own and this file's hooks
// (sharded_grads_hooks) bind each part's gradients to the working buffer; under ZeRO-3
// sharded_params.h binds a part's gathered parameters and these gradients together and calls
// sharded_grads_on_event for the gradient side.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "parallel/data_parallel.h"
#include "model/model.h"

typedef struct {
    Model *m;
    DataParallel *dp;      // the shard boundaries and the communicator
    float *shard;          // [shard_n] this rank's gradient shard (backend memory)
    size_t shard_n;
    float *work[2];        // [n_work][work_n] the working gradient buffers (backend memory)
    size_t work_n;
    int n_work;            // 2 with overlap, else 1
    int held;              // the part whose gradients are being written (-1: none)
    int viewed;            // ZeRO-2's hooks: the part last bound to its buffer (-1: none)
    int pending;           // the part whose reduce-scatter is in flight (-1: none)
    int *counts[2];        // [n_work][ranks] each buffer's blocks of its reduce-scatter
    ModelHooks hooks;      // ZeRO-2's hooks (sharded_grads_hooks)
} ShardedGrads;

// For model m (on any backend) trained under dp (ZeRO-2 or ZeRO-3). m and dp must outlive g,
// and g must not move afterwards (g->hooks points at it). Allocates the buffers (two working
// buffers with `overlap`) and releases the model's gradient buffer for good
// (model_restore_grads gives it back).
int sharded_grads_create(ShardedGrads *g, Model *m, DataParallel *dp, bool overlap);
void sharded_grads_free(ShardedGrads *g);

// Before a step's passes: the gradient shard zeroed (and ZeRO-2's views bound afresh).
int sharded_grads_zero(ShardedGrads *g);
// After a step's passes (idle ones too), before the shard is read: the reduction in flight
// waited for and added. A collective.
int sharded_grads_finish(ShardedGrads *g);
// The working buffer part `part`'s gradient views must point at (laid out as the part's range
// of the gradient layout).
float *sharded_grads_work(const ShardedGrads *g, int part);
// The gradient side of a hook event (the part's gradient views bound to its working buffer):
// zeroes the buffer where the part first writes, reduces at POST_BACKWARD.
int sharded_grads_on_event(ShardedGrads *g, ModelHookEvent event, int part);
// ZeRO-2's hooks for a pass: each part's gradient views bound to the working buffer, then
// sharded_grads_on_event.
const ModelHooks *sharded_grads_hooks(ShardedGrads *g);
// A pass's collectives without its work, through `hooks` (ZeRO-2's, or ZeRO-3's that gather
// the parts too).
int sharded_grads_idle_pass(ShardedGrads *g, const ModelHooks *hooks);
// Backend bytes this rank holds for gradients: the shard and the working buffers.
size_t sharded_grads_bytes(const ShardedGrads *g);
