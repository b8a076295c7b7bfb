// The failed-save policy. See save_failure.h.
#include "train/save_failure.h"

SaveAction save_after_failure(SaveKind kind, const SaveRetry *retry, double waited_s, bool stopped) {
    if (kind == SAVE_ON_INTERVAL) return SAVE_TRAIN_ON;
    // The retry would start after the bound, or a stop ends the wait: the kind decides what follows.
    bool out_of_time = !(retry->every_s > 0) || waited_s + retry->every_s > retry->for_s;
    if (!stopped && !out_of_time) return SAVE_RETRY;
    return kind == SAVE_FINAL ? SAVE_GIVE_UP : SAVE_TRAIN_ON;
}
