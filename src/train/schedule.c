// OLMo's learning-rate schedules. See schedule.h.
#include "train/schedule.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static const char *const kind_names[] = {"constant", "cosine_with_warmup", "linear_with_warmup"};

int schedule_kind_from_name(const char *name, ScheduleKind *out) {
    for (int k = 0; k < 3; k++)
        if (!strcmp(name, kind_names[k])) {
            *out = (ScheduleKind)k;
            return SPES_OK;
        }
    return spes_fail("scheduler.name '%s' is not supported (use constant, cosine_with_warmup or linear_with_warmup)",
                     name);
}

const char *schedule_kind_name(ScheduleKind kind) {
    return (unsigned)kind < 3 ? kind_names[kind] : "?";
}

static int64_t effective_t_max(const ScheduleConfig *s, int64_t max_steps) {
    return s->t_max > 0 ? s->t_max : max_steps;
}

// Raises msg about key through fail (NULL: "key: msg"); SPES_ERR.
static int fail_key(ScheduleFailFn fail, void *ctx, const char *key, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail ? fail(ctx, key, msg) : spes_fail("%s: %s", key, msg);
}

int schedule_validate(const ScheduleConfig *s, double initial_lr, int64_t max_steps, ScheduleFailFn fail, void *ctx) {
    if (s->kind == SCHEDULE_CONSTANT) return SPES_OK;
    if (s->t_warmup < 0)
        return fail_key(fail, ctx, "scheduler.t_warmup", "must be >= 0, got %lld", (long long)s->t_warmup);
    if (!(s->alpha_f >= 0 && s->alpha_f <= 1))
        return fail_key(fail, ctx, "scheduler.alpha_f", "must be in [0, 1], got %g", s->alpha_f);
    double min_lr = s->warmup_min_lr >= 0 ? s->warmup_min_lr : 0.1 * initial_lr;
    if (s->t_warmup > 0 && !(initial_lr > 0))
        return fail_key(fail, ctx, "optimizer.learning_rate",
                        "must be above 0 for the warm-up (scheduler.t_warmup %lld) to rise to it, got %g",
                        (long long)s->t_warmup, initial_lr);
    if (s->t_warmup > 0 && !(min_lr < initial_lr))
        return fail_key(fail, ctx, "scheduler.warmup_min_lr", "must be below optimizer.learning_rate (%g), got %g",
                        initial_lr, min_lr);
    if (effective_t_max(s, max_steps) <= s->t_warmup) {
        // The end of the decay is t_max when set, else the run's length (max_duration).
        const char *end = s->t_max > 0 ? "scheduler.t_max" : "max_duration";
        return fail_key(fail, ctx, end, "the decay ends at step %lld, not after the warm-up (scheduler.t_warmup %lld): "
                        "raise %s or lower scheduler.t_warmup",
                        (long long)effective_t_max(s, max_steps), (long long)s->t_warmup, end);
    }
    return SPES_OK;
}

// OLMo's Scheduler._linear_warmup: from warmup_min_lr (default 0.1*lr) up to lr.
static double linear_warmup(const ScheduleConfig *s, double initial_lr, int64_t step) {
    double min_lr = s->warmup_min_lr >= 0 ? s->warmup_min_lr : initial_lr * 0.10;
    int64_t done = step < s->t_warmup ? step : s->t_warmup;
    return min_lr + (initial_lr - min_lr) * (double)done / (double)s->t_warmup;
}

double schedule_lr(const ScheduleConfig *s, double initial_lr, int64_t step, int64_t max_steps) {
    if (s->kind == SCHEDULE_CONSTANT) return initial_lr;
    int64_t t_max = effective_t_max(s, max_steps);
    double eta_min = initial_lr * s->alpha_f;
    if (step < s->t_warmup) return linear_warmup(s, initial_lr, step);
    if (step >= t_max) return eta_min;
    double t = (double)(step - s->t_warmup), span = (double)(t_max - s->t_warmup);
    if (s->kind == SCHEDULE_COSINE_WITH_WARMUP) return eta_min + (initial_lr - eta_min) * (1 + cos(M_PI * t / span)) / 2;
    return initial_lr - (initial_lr - eta_min) * (t / span);
}
