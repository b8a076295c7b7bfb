// Learning-rate schedules, exactly OLMo's (olmo/optim.py): CosWithWarmup,
// LinearWithWarmup and ConstantScheduler. OLMo calls get_lr(initial_lr, global_step,
// max_steps) with global_step counted from 1 for the first update; so do we.
#pragma once
#include <stdint.h>

typedef enum {
    SCHEDULE_CONSTANT = 0,          // "constant": initial_lr at every step, no warm-up
    SCHEDULE_COSINE_WITH_WARMUP,    // "cosine_with_warmup"
    SCHEDULE_LINEAR_WITH_WARMUP,    // "linear_with_warmup"
} ScheduleKind;

typedef struct {
    ScheduleKind kind;
    int64_t t_warmup;       // scheduler.t_warmup (steps)
    int64_t t_max;          // scheduler.t_max; <= 0: the run's max steps
    double alpha_f;         // scheduler.alpha_f: final lr = alpha_f * initial_lr
    double warmup_min_lr;   // scheduler.warmup_min_lr; < 0: 0.1 * initial_lr (OLMo default)
} ScheduleConfig;

// "constant" / "cosine_with_warmup" / "linear_with_warmup" -> kind; error names the value.
int schedule_kind_from_name(const char *name, ScheduleKind *out);
const char *schedule_kind_name(ScheduleKind kind);
// How schedule_validate reports a bad value: raises msg about config key `key` (as the config
// loader does, at the line that set it: config_schedule_validate) and returns SPES_ERR.
typedef int (*ScheduleFailFn)(void *ctx, const char *key, const char *msg);
// Checks t_warmup >= 0, alpha_f in [0, 1], warmup_min_lr < initial_lr, the decay's end (t_max,
// else max_steps) > t_warmup. A failure names the key through fail(ctx, ...) (NULL: "key: msg").
int schedule_validate(const ScheduleConfig *s, double initial_lr, int64_t max_steps, ScheduleFailFn fail, void *ctx);
double schedule_lr(const ScheduleConfig *s, double initial_lr, int64_t step, int64_t max_steps);
