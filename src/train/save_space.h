// Disk space for a run's checkpoints: how many saves are left, how much more the save_folder
// holds at its fullest, and `spes train`'s warning at start when its filesystem has less, so a
// full disk is said before the hours of training a failed save would throw away.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "model/param_table.h"

// One checkpoint of this run on disk (checkpoint_disk_bytes), with what the config adds to it: a
// SPES peer's sync state (spes_peer_state_bytes) and max_grad_norm_ratio's norm averages
// (checkpoint_norm_avg_bytes).
int save_space_checkpoint_bytes(const TrainConfig *cfg, const ParamTable *table, size_t *bytes);

// Saves the trainer makes between start_step (done) and end_step: one at every multiple of
// `interval` (<= 0: none) and the final one when end_step is not a multiple. 0 when
// end_step <= start_step (a finished run saves nothing more).
int64_t save_space_saves_left(int64_t start_step, int64_t end_step, int64_t interval);
// The save after `step`: the next multiple of `interval` (<= 0: none), or end_step when that comes first.
int64_t save_space_next_save(int64_t step, int64_t end_step, int64_t interval);

// Bytes the save_folder grows by at its fullest over the rest of the run: checkpoints of `each`
// bytes, `existing` complete ones there now, `keep` kept (<= 0: all, as checkpoint_prune). A
// save writes its checkpoint before the oldest is pruned, so a folder keeping k holds k + 1
// while saving; one keeping all grows by every save left.
size_t save_space_needed(size_t each, int keep, int existing, int64_t saves_left);

// The check at start (rank 0, after the save_folder exists): a warning when its filesystem has
// less free space than the next save needs, or than the run's checkpoints need. Never an error
// (space may be freed before the save comes); a filesystem that cannot be asked is a debug line.
void save_space_check(const TrainConfig *cfg, size_t each, int64_t start_step, int64_t end_step);

// For a failed save's message: "a checkpoint takes 529 kB, and the filesystem of FOLDER has 120 kB
// free" (or says the free space could not be read, and why).
void save_space_describe(const char *folder, size_t each, char *out, size_t cap);
