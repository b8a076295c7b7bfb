// The peer side of SPES inside `spes train`: which tensors this node trains, the decayed
// load-balancing factor for its own experts, and every `sync_steps` steps the round trip
// to the parameter server (upload trainable tensors, wait for the aggregate, load it; the
// optimizer state is kept).
//
//   SpesPeer *peer; spes_peer_create(cfg, &peer);       // before the trainer: opt.lb_count_factor
//   trainer_create(cfg, &opt with after_step = spes_peer_after_step, ctx = peer, ...)
//   spes_peer_connect(peer, trainer_model(t));          // Hello: model fingerprint, topology
//   trainer_run(t); spes_peer_free(peer);
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "model/model.h"
#include "train/metrics.h"

typedef struct SpesPeer SpesPeer;

// Needs cfg->using_spes or cfg->using_dilico. cfg must outlive the peer.
int spes_peer_create(const TrainConfig *cfg, SpesPeer **out);
void spes_peer_free(SpesPeer *p);
// [L*E] count factors c_{l,e} for the load-balancing loss (all 1 unless
// spes_config.using_decayed_aux_loss); the buffer lives as long as the peer and is updated
// in place, so the trainer can hold the pointer.
const float *spes_peer_lb_count_factor(const SpesPeer *p);
// Handshake with the server: the whole model's names, shapes and dtypes, num_peers,
// experts per node, mode. `start_step` is the step training starts from (0, or the resumed
// one) so the decayed factor starts at the right value. A resumed peer then catches up with
// the run: `unsynced` (the checkpoint's round never completed) redoes the sync of start_step,
// otherwise the server's newest aggregate is loaded when the run has moved on.
int spes_peer_connect(SpesPeer *p, Model *m, int64_t start_step, int64_t total_steps, bool unsynced);
// TrainerAfterStep: on steps that are multiples of sync_steps, one sync round. When it fails
// (server gone past retry_timeout_s, a refused upload, a signal) the model keeps the step's
// local weights and spes_peer_unsynced_step() names the step, so the caller can save them.
int spes_peer_after_step(void *ctx, Model *m, int64_t step);
// Whether spes_peer_after_step(step) will read or write the model: a sync step, or a step end
// that applies an overlapped round (decided here once; after_step then does what was decided).
bool spes_peer_step_touches_model(SpesPeer *p, int64_t step);
// A step's metrics, reported to the server with the next upload (its status page): loss terms,
// tokens/s, MFU, device memory (GPU memory in use, else peak RSS) and routing balance.
void spes_peer_note_metrics(SpesPeer *p, const StepMetrics *m);
// The flag SIGINT/SIGTERM set: a round in flight is abandoned (not waited for) when it is set.
void spes_peer_set_stop_flag(SpesPeer *p, volatile sig_atomic_t *stop);
// The step whose sync failed or was abandoned, -1 when every round so far completed.
int64_t spes_peer_unsynced_step(const SpesPeer *p);

// int8 runs (spes_config.payload_dtype: int8): writes the peer's sync state into a checkpoint
// directory being saved, DIR/spes_sync_state.safetensors: the error-feedback residual of the
// uploaded tensors ("error_feedback", F32) and the step of the aggregate it is relative to
// (__metadata__ "base_step"). spes_peer_connect reads it back from save_folder/step<start_step>
// and fetches that aggregate from the server as its base, so that a resumed run sends the same
// bytes as an uninterrupted one. Other runs: nothing written.
int spes_peer_save_state(SpesPeer *p, const char *dir);
// Whether a run of cfg saves a sync state in its checkpoints: a SPES or fedavg peer whose payloads
// are int8 / int4 deltas (their error feedback and base step).
bool spes_peer_saves_sync_state(const TrainConfig *cfg);
// The bytes spes_peer_save_state writes for a run of cfg uploading `sent` values (its
// trainable ones): 0 when the run saves no sync state; the base step taken at its longest.
int spes_peer_state_bytes(const TrainConfig *cfg, size_t sent, size_t *bytes);

// c(t) = 0.7 + 0.3 * t / (0.2 * T) for t < 0.2 * T, then 1 (DESIGN.md).
float spes_decayed_factor(int64_t step, int64_t total_steps);

// Whether a peer syncs at the end of `step` (K = sync_steps). Without a warm-up
// (spes_config.sync_warmup_steps 0, the reference): every K steps. With a warm-up W (a multiple
// of K and of the warm-up's interval e): every e steps up to W; then, inside (W, W + K), at
// W + floor(K / 2^j) for j = J..1 (J the largest with floor(K / 2^J) >= e; a value only once),
// so each gap is at most about twice the one before it; from W + K on every K steps again. The
// ramp is there because the server takes an upload at most 4 round gaps ahead of its newest
// round (server/rounds.h): a jump from gaps of 1 step to K = 25 would be refused.
bool spes_sync_due(int64_t step, int64_t sync_steps, int64_t warmup_steps, int64_t warmup_every);
// Loads every tensor of an aggregate (safetensors bytes, F32 or BF16) into the model's
// parameters; an aggregate that lacks a model tensor or has a wrong shape is an error.
int spes_load_aggregate(Model *m, const uint8_t *bytes, size_t len, const char *what);
