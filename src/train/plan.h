// What a training run needs before it starts: parameters, memory per rank, FLOPs (`spes plan`,
// and `spes train`'s check at start). Nothing here allocates a model or opens a device.
//
// One source of truth. The parameter counts come from the parameter table the model is built
// from (param_table.h) with the trainable mask the trainer sets (trainer_setup_trainable's rule,
// param_table_set_trainable_experts); the activations from the model's own arena layout
// (model_acts_bytes: the layout() model_acts_plan carves, measured); the distributed buffers
// from the same part spans (param_part_span / param_part_grad_span) and shard boundaries the
// strategies size theirs from; FLOPs from model_train_flops. So a change to the model's memory
// shows up here by construction.
//
// Peak. A rank's backend memory is followed through the run's allocations in the order the
// trainer makes them (a ledger: each buffer added when trainer_create / the first step / a
// checkpoint allocates it, removed when it is freed), and the plan's peak is the ledger's
// high-water mark, the figure the backend's allocation counter reports (be->ops->memory). Three
// phases: setup (trainer_create), the steps, and the boundaries between steps (checkpoint,
// evaluation, SPES sync: ZeRO-3 gathers the full parameters there; the sharded strategies gather
// the full optimizer state into host memory for a checkpoint, which on the cpu backend is the
// backend's memory too). Not counted: a GPU backend's own scratch (cuBLAS workspace, GEMM type
// conversions; bench-gpu reports it as "other"), the MPI/NCCL libraries' buffers, and host
// memory outside the backend (data loader, SPES payloads).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "ops/backend.h"

// The strategies of one node's ranks, as the trainer picks them (parallel/data_parallel.h's DpStage,
// plus one rank without any).
typedef enum { PLAN_SINGLE = 0, PLAN_DDP, PLAN_ZERO1, PLAN_ZERO2, PLAN_ZERO3, PLAN_STRATEGY_COUNT } PlanStrategy;
const char *plan_strategy_name(PlanStrategy s);   // "single", "ddp", "zero1", "zero2", "zero3"

// Where the run trains and how.
typedef struct {
    bool gpu;                   // a device backend (its memory is not the host's); false: cpu
    NumType compute;            // the backend's compute type (fp32 on cpu; amp_bf16: bf16 on a GPU)
    Backend layout;             // backend_plan_traits(gpu, precision): what the arena is laid out for
    int ranks;                  // ranks of the node (1: single)
    PlanStrategy strategy;
    int micro_batch;            // B, instances per forward/backward
    int seq_len;                // T
    int checkpointing;          // the model's mode: 0 none, 1 fine_grained, 2 whole_layer
    bool cpu_offload;           // optimizer.cpu_offload
    bool prefetch;              // fsdp.prefetch (ZeRO-3: two gather slots)
    bool overlap;               // ddp.overlap_grad_reduce (ZeRO-2/3: two gradient working buffers)
    double bucket_mb;           // ddp.bucket_cap_mb
    int eval_batch;             // device_eval_batch_size when the run has lm evaluators, else 0
    bool clip_adaptive;         // max_grad_norm_ratio set: a double per tensor for the per-tensor norms
} PlanTarget;

// The target `spes train` would have for cfg on `ranks` ranks: the strategy from
// distributed_strategy / fsdp.sharding_strategy (dp_stage_from_config), the compute type from
// `precision` on a GPU (fp32 on cpu), B = device_train_microbatch_size, T = max_sequence_length.
int plan_target_from_config(const TrainConfig *cfg, int ranks, bool gpu, PlanTarget *out);

// Parameters of the model (values, not bytes).
typedef struct {
    size_t total;               // every tensor
    size_t trainable;           // this peer's: shared tensors + its own experts (all with using_spes false)
    size_t frozen;              // total - trainable
    size_t active;              // used per token: everything but the experts, plus top_k of E experts per layer
    size_t experts;             // the expert tensors' values
} PlanParams;

// One rank's memory (bytes). Device fields are the backend's memory (host memory on the cpu
// backend); host_* are host memory outside the backend's counter.
typedef struct {
    size_t master;              // fp32 parameters (ZeRO-3 while training: its shard of the trainable ones)
    size_t compute_copy;        // the low-precision copy GEMMs read (0 when compute is fp32)
    size_t frozen_store;        // ZeRO-3: the frozen tensors (SPES: other peers' experts), packed
    size_t grads;               // fp32 gradients: the full buffer, or the rank's shard (ZeRO-2/3)
    size_t moments;             // AdamW m and v on the device (0 with cpu_offload)
    size_t acts;                // the activation arena for (B, T) with the target's checkpointing
    size_t acts_mode[3];        // ... with each activation_checkpointing mode (none, fine_grained, whole_layer)
    size_t logits_chunk;        // the LM head's buffers inside the arena (logits block, staging, padded head)
    size_t work;                // working buffers: ZeRO-3 gather slots (fp32 + compute) and staging,
                                // ZeRO-2/3 gradient working buffers, ZeRO-1/2 all-gather bucket
    size_t boundary_extra;      // added at checkpoints/evaluations/syncs (ZeRO-3's full parameters,
                                // a larger eval arena, the gathered optimizer state on cpu)
    size_t peak_setup, peak_step, peak_boundary;
    size_t peak;                // the largest of the three
    size_t host;                // host memory the backend does not count: page-locked parameter copy
                                // (GPU), moments' host copies, cpu_offload's moments and staging,
                                // the full optimizer state a sharded checkpoint gathers (GPU)
} PlanMemory;

typedef struct {
    PlanTarget target;
    PlanParams params;
    PlanMemory mem;
    double flops_per_token;     // training (forward + backward) FLOPs per token (model_train_flops)
    size_t checkpoint_bytes;    // one checkpoint on disk (checkpoint_disk_bytes, a delta peer's sync state included)
} Plan;

// The plan of cfg's model on `target`.
int plan_compute(const TrainConfig *cfg, const PlanTarget *target, Plan *out);

// The largest micro-batch whose peak fits `budget` bytes (0: not even 1), searched up to `limit`.
int plan_max_micro_batch(const TrainConfig *cfg, const PlanTarget *target, size_t budget, int limit, int *best);
