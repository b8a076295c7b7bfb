// Disk space for a run's checkpoints. See save_space.h.
#include "train/save_space.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/bytes_text.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "train/checkpoint.h"
#include "train/spes_peer.h"

int save_space_checkpoint_bytes(const TrainConfig *cfg, const ParamTable *table, size_t *bytes) {
    size_t sync_state, norm_avgs = 0;
    *bytes = 0;
    SPES_TRY(spes_peer_state_bytes(cfg, table->trainable_numel, &sync_state));
    if (cfg->max_grad_norm_ratio > 0) SPES_TRY(checkpoint_norm_avg_bytes(table, &norm_avgs));
    return checkpoint_disk_bytes(table, sync_state + norm_avgs, bytes);
}

int64_t save_space_saves_left(int64_t start_step, int64_t end_step, int64_t interval) {
    if (end_step <= start_step) return 0;
    if (interval <= 0) return 1;
    int64_t on_grid = end_step / interval - start_step / interval;
    return on_grid + (end_step % interval != 0);
}

int64_t save_space_next_save(int64_t step, int64_t end_step, int64_t interval) {
    int64_t next = interval > 0 ? (step / interval + 1) * interval : end_step;
    return next < end_step ? next : end_step;
}

size_t save_space_needed(size_t each, int keep, int existing, int64_t saves_left) {
    if (saves_left <= 0) return 0;
    int64_t held = saves_left;   // keeping all: every save stays
    if (keep > 0) {
        // Up to keep + 1 while a save runs; a folder already at (or over) keep grows by one.
        int64_t room = (int64_t)keep + 1 - existing;
        held = room < 1 ? 1 : room < saves_left ? room : saves_left;
    }
    return each * (size_t)held;
}

void save_space_check(const TrainConfig *cfg, size_t each, int64_t start_step, int64_t end_step) {
    int64_t saves = save_space_saves_left(start_step, end_step, cfg->save_interval_unsharded);
    int existing = 0;
    size_t free_b;
    if (saves == 0) return;
    int err = fs_free_bytes(cfg->save_folder, &free_b);
    if (err) {
        log_debug("save_folder %s: free space not checked (%s)", cfg->save_folder, strerror(err));
        return;
    }
    if (checkpoint_count(cfg->save_folder, &existing) != SPES_OK) {
        log_debug("save_folder %s: free space not checked (%s)", cfg->save_folder, spes_last_error());
        return;
    }
    size_t needed = save_space_needed(each, cfg->save_num_unsharded_checkpoints_to_keep, existing, saves);
    char free_text[24], each_text[24], needed_text[24];
    bytes_text(free_b, free_text, sizeof free_text);
    bytes_text(each, each_text, sizeof each_text);
    bytes_text(needed, needed_text, sizeof needed_text);
    int64_t next = save_space_next_save(start_step, end_step, cfg->save_interval_unsharded);
    int keep = cfg->save_num_unsharded_checkpoints_to_keep;
    char kept[32] = "keeping all";
    if (keep > 0) snprintf(kept, sizeof kept, "keeping %d", keep);
    if (free_b < each)
        log_warn("save_folder %s: %s free on its filesystem, and a checkpoint takes %s: the save at step %" PRId64
                 " will fail unless space is freed (what was trained since the last checkpoint would be lost)",
                 cfg->save_folder, free_text, each_text, next);
    else if (free_b < needed)
        log_warn("save_folder %s: %s free on its filesystem; the run's %" PRId64 " save%s left of %s each, %s "
                 "(save_num_unsharded_checkpoints_to_keep), need up to %s more: a later save will fail unless space is "
                 "freed",
                 cfg->save_folder, free_text, saves, saves == 1 ? "" : "s", each_text, kept, needed_text);
}

void save_space_describe(const char *folder, size_t each, char *out, size_t cap) {
    char each_text[24], free_text[24];
    bytes_text(each, each_text, sizeof each_text);
    size_t free_b;
    int err = fs_free_bytes(folder, &free_b);
    if (err) {
        snprintf(out, cap, "a checkpoint takes %s; the free space of %s's filesystem cannot be read (%s)", each_text,
                 folder, strerror(err));
        return;
    }
    bytes_text(free_b, free_text, sizeof free_text);
    snprintf(out, cap, "a checkpoint takes %s, and the filesystem of %s has %s free", each_text, folder, free_text);
}
