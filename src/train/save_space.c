// Disk space for a run's checkpoints. See save_space.h.
#include "train/save_space.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "base/bytes_text.h"
#include "base/error.h"
#include "base/log.h"
#include "train/checkpoint.h"

int64_t save_space_saves_left(int64_t start_step, int64_t end_step, int64_t interval) {
    if (end_step <= start_step) return 0;
    if (interval <= 0) return 1;
    int64_t on_grid = end_step / interval - start_step / interval;
    return on_grid + (end_step % interval != 0);
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
    struct statvfs fs;
    if (saves == 0) return;
    if (statvfs(cfg->save_folder, &fs) != 0) {
        log_debug("save_folder %s: free space not checked (%s)", cfg->save_folder, strerror(errno));
        return;
    }
    if (checkpoint_count(cfg->save_folder, &existing) != SPES_OK) {
        log_debug("save_folder %s: free space not checked (%s)", cfg->save_folder, spes_last_error());
        return;
    }
    size_t free_b = (size_t)fs.f_bavail * (size_t)fs.f_frsize;
    size_t needed = save_space_needed(each, cfg->save_num_unsharded_checkpoints_to_keep, existing, saves);
    char free_text[24], each_text[24], needed_text[24];
    bytes_text(free_b, free_text, sizeof free_text);
    bytes_text(each, each_text, sizeof each_text);
    bytes_text(needed, needed_text, sizeof needed_text);
    int64_t interval = cfg->save_interval_unsharded;
    int64_t next = interval > 0 ? (start_step / interval + 1) * interval : end_step;
    if (next > end_step) next = end_step;
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
    struct statvfs fs;
    if (statvfs(folder, &fs) != 0) {
        snprintf(out, cap, "a checkpoint takes %s; the free space of %s's filesystem cannot be read (%s)", each_text,
                 folder, strerror(errno));
        return;
    }
    bytes_text((size_t)fs.f_bavail * (size_t)fs.f_frsize, free_text, sizeof free_text);
    snprintf(out, cap, "a checkpoint takes %s, and the filesystem of %s has %s free", each_text, folder, free_text);
}
