// Dynamic loss scaling. See loss_scale.h.
#include "train/loss_scale.h"

void loss_scale_init(LossScaler *s, bool enabled) {
    *s = (LossScaler){.enabled = enabled, .scale = enabled ? LOSS_SCALE_INIT : 1.0, .growth_interval = 2000};
}

bool loss_scale_update(LossScaler *s, bool finite) {
    if (!s->enabled) return finite;
    if (!finite) {
        s->scale = s->scale * 0.5 < LOSS_SCALE_MIN ? LOSS_SCALE_MIN : s->scale * 0.5;
        s->good_steps = 0;
        s->skipped++;
        return false;
    }
    if (++s->good_steps >= s->growth_interval) {
        s->scale *= 2.0;
        s->good_steps = 0;
    }
    return true;
}
