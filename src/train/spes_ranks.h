// A SPES peer whose node trains with several ranks (parallel/): rank 0 alone talks to the
// parameter server (handshake, uploads, downloads); what it learns reaches every rank by
// broadcast: the aggregated parameters after each sync round (and after the handshake, which
// may load an aggregate when rejoining), the load-balancing count factors, and whether the
// round worked. Under ZeRO-1/2 every rank holds the full parameters after each step (the
// all-gather of parallel/data_parallel.h), so rank 0's upload is already whole; under ZeRO-3 the
// trainer gathers them for the steps spes_ranks_step_touches_model names.
//
// With one rank this is exactly the SpesPeer: every call goes straight through.
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "parallel/comm.h"
#include "model/model.h"
#include "train/metrics.h"

typedef struct SpesRanks SpesRanks;

int spes_ranks_create(const TrainConfig *cfg, Comm *comm, SpesRanks **out);
void spes_ranks_free(SpesRanks *r);
const float *spes_ranks_lb_count_factor(const SpesRanks *r);
void spes_ranks_set_stop_flag(SpesRanks *r, volatile sig_atomic_t *stop);
// spes_peer_connect on rank 0, then the model and factors to every rank. Every rank calls it.
int spes_ranks_connect(SpesRanks *r, Model *m, int64_t start_step, int64_t total_steps, bool unsynced);
// TrainerAfterStep (ctx = SpesRanks): every rank calls it.
int spes_ranks_after_step(void *ctx, Model *m, int64_t step);
// TrainerStepTouchesModel (ctx = SpesRanks): rank 0's spes_peer_step_touches_model, broadcast;
// after_step then broadcasts the parameters exactly at those steps.
int spes_ranks_step_touches_model(void *ctx, int64_t step, bool *touches);
// TrainerOnMetrics (ctx = SpesRanks): rank 0's spes_peer_note_metrics.
void spes_ranks_note_metrics(void *ctx, const StepMetrics *m);
// TrainState.save_extra (ctx = SpesRanks): rank 0's spes_peer_save_state (rank 0 saves checkpoints).
int spes_ranks_save_state(void *ctx, const char *dir);
// As spes_peer_unsynced_step, the same on every rank.
int64_t spes_ranks_unsynced_step(const SpesRanks *r);
