// The training loop: data -> micro-batches -> forward/backward (gradient accumulation) ->
// global-norm clip -> learning-rate schedule -> AdamW -> after-step hook -> log, save, eval.
//
// Gradient accumulation follows OLMo's Trainer.train_batch: each micro-batch's losses are
// means over that micro-batch and are divided by the number of micro-batches, so the
// step's gradient is that of the mean of the micro-batch means. The schedule is evaluated
// at the 1-based number of the step being taken (OLMo increments global_step first).
//
// One trainer runs one model on one rank. With several ranks (opt.comm, src/parallel/) every rank
// builds the same trainer: the loader hands every rank the same global batch and each rank
// computes a contiguous share of its micro-batches (rank r: micro-batches [r*M/N, (r+1)*M/N)
// of M), so every micro-batch holds exactly the instances it holds on one rank and the step's
// losses are bit-identical to one rank's; gradients are then summed over ranks as
// parallel/data_parallel.h says (ZeRO-3: parallel/sharded_params.h; the model's parameter buffers are
// released during trainer_run and hold the full parameters before and after it). Rank 0
// alone writes checkpoints, metrics and runs evaluations;
// the others log warnings and errors only. SPES hooks in through `after_step` (called after
// every optimizer step with the model and the step number: upload/download happen there)
// and trainer_setup_trainable (the single place the trainable mask is decided).
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/save_failure.h"

typedef struct Trainer Trainer;
typedef struct Comm Comm;

// Called after every optimizer step. It may change the parameters (load an aggregated
// model); the optimizer state is kept. SPES_ERR stops training with that error.
typedef int (*TrainerAfterStep)(void *ctx, Model *m, int64_t step);
// Asked right before after_step for the same step, on every rank: whether after_step will read
// or write the parameters then (every rank must get the same answer). Under ZeRO-3 the full
// parameters exist only for such steps; otherwise after_step's Model has none.
typedef int (*TrainerStepTouchesModel)(void *ctx, int64_t step, bool *touches);
// Called on rank 0 with each step's metrics as they are written (a SPES peer reports them to
// its server with its next upload). Must not fail or block.
typedef void (*TrainerOnMetrics)(void *ctx, const StepMetrics *m);

typedef struct {
    bool resume;                    // --resume: newest complete checkpoint (as try_load_latest_save)
    bool ignore_config_hash;        // resume although the configuration changed
    double peak_flops;              // FLOP/s that MFU is relative to; <= 0: measured (sgemm) at start
    volatile sig_atomic_t *stop;    // counts stop signals (SIGINT/SIGTERM), set asynchronously: non-zero
                                    // finishes the step, saves, returns; one more while a save waits to
                                    // retry ends the wait (save_failure.h)
    volatile sig_atomic_t *save_now;   // set asynchronously (SIGUSR1): save after the step, go on; cleared
    volatile sig_atomic_t *save_waiting;   // set (NULL: not told) from a save's first failed attempt until it
                                           // ends: the signal handler then only counts a stop
    SaveRetry save_retry;           // retries of a final or requested save that failed (zero: none)
    TrainerAfterStep after_step;
    TrainerStepTouchesModel after_step_touches_model;   // NULL: every step touches it
    void *after_step_ctx;
    TrainerOnMetrics on_metrics;    // NULL: none
    void *on_metrics_ctx;
    const float *lb_count_factor;   // [L*E] load-balancing count factors (SPES decayed aux loss), NULL = 1;
                                    // read every step: the owner may update it in place
    Comm *comm;                     // the ranks of this node (parallel/comm.h); NULL or one rank: no collectives.
                                    // after_step is called on every rank (it decides what rank 0 does alone)
} TrainerOptions;

// Opens the data, builds and initialises (or loads / resumes) the model and optimizer.
// cfg must outlive the trainer.
int trainer_create(const TrainConfig *cfg, const TrainerOptions *opt, Trainer **out);
void trainer_free(Trainer *t);

// Steps until max_duration or stop_at, or until *opt.stop is set; saves every
// save_interval_unsharded steps, after a step during which rank 0's *opt.save_now was set, and at
// the end; evaluates every eval_interval steps. A save that cannot be written is handled as
// save_failure.h says: an interval's is reported and training goes on; a final one that stays
// unwritten makes this fail, naming the steps lost.
int trainer_run(Trainer *t);
// One optimizer step on the next global batch; fills *out (wall-clock fields too).
int trainer_step(Trainer *t, StepMetrics *out);
// Token-weighted mean cross-entropy of every lm evaluator, logged and written to metrics.jsonl.
// With several ranks every rank calls it (ZeRO-3 gathers the full parameters); rank 0 evaluates.
int trainer_evaluate(Trainer *t);
// Writes save_folder/step<N> and prunes old ones to the keep count. With several ranks every
// rank calls it (sharded optimizer state is gathered); rank 0 writes. A write that fails is
// handled by `kind` (save_failure.h): SPES_OK with the step left unsaved (reported) when the run
// goes on, SPES_ERR naming what is lost when a final save gives up.
int trainer_save(Trainer *t, SaveKind kind);

Model *trainer_model(Trainer *t);
int64_t trainer_step_count(const Trainer *t);     // optimizer steps done
int64_t trainer_max_steps(const Trainer *t);
// The state the next save writes (a SPES peer marks it not synced before saving after a failed round).
TrainState *trainer_state(Trainer *t);

// The trainable mask for this config: every tensor (plain or using_dilico), or with using_spes the shared tensors
// plus the peer's own experts of every layer, m = num_train_experts_per_node from expert_first_owned
// (sync/expert_owners.h: [peer_id*m, (peer_id+1)*m) when the peers partition the experts; with
// replicas peer_id modulo the groups). Reallocates the model's gradient buffer.
int trainer_setup_trainable(Model *m, const TrainConfig *cfg);
// The experts [first, last] this config trains (the rule above), or an error naming the bad keys.
int trainer_own_experts(const TrainConfig *cfg, int experts, int *first, int *last);
