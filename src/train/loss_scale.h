// Dynamic loss scaling for precision amp_fp16 (the rule of torch.amp.GradScaler): the loss is
// multiplied by `scale` before the backward so small fp16 gradients do not flush to zero; a
// step whose gradients hold inf/NaN is skipped and the scale halves; after growth_interval
// good steps in a row the scale doubles. Scaling by powers of two is exact, so an fp32 run
// with the scaler on trains the same bits as one without (unless it overflows).
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    bool enabled;
    double scale;            // current loss scale (1 when disabled)
    int64_t good_steps;      // finite steps since the last change
    int64_t growth_interval; // torch's default 2000
    int64_t skipped;         // steps skipped so far (this run)
} LossScaler;

#define LOSS_SCALE_INIT 65536.0
#define LOSS_SCALE_MIN (1.0 / 65536.0)

void loss_scale_init(LossScaler *s, bool enabled);
// After a backward: finite = every gradient is finite. Returns whether the optimizer step
// goes ahead, and updates the scale (halve on overflow, double after growth_interval good steps).
bool loss_scale_update(LossScaler *s, bool finite);
