// OLMo's learning-rate schedules. See schedule.h.
#include "train/schedule.h"

#include <math.h>
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

int schedule_validate(const ScheduleConfig *s, double initial_lr, int64_t max_steps) {
    if (s->kind == SCHEDULE_CONSTANT) return SPES_OK;
    if (s->t_warmup < 0) return spes_fail("scheduler.t_warmup is %lld; it must be >= 0", (long long)s->t_warmup);
    if (!(s->alpha_f >= 0 && s->alpha_f <= 1))
        return spes_fail("scheduler.alpha_f is %g; it must be in [0, 1]", s->alpha_f);
    double min_lr = s->warmup_min_lr >= 0 ? s->warmup_min_lr : 0.1 * initial_lr;
    if (s->t_warmup > 0 && !(initial_lr > 0))
        return spes_fail("optimizer.learning_rate is %g: a warm-up (scheduler.t_warmup %lld) needs a rate above 0 to "
                         "rise to",
                         initial_lr, (long long)s->t_warmup);
    if (s->t_warmup > 0 && !(min_lr < initial_lr))
        return spes_fail("scheduler.warmup_min_lr %g must be below optimizer.learning_rate %g", min_lr, initial_lr);
    if (effective_t_max(s, max_steps) <= s->t_warmup)
        return spes_fail("scheduler: the decay ends at step %lld (t_max or max_duration), not after the warm-up "
                         "(t_warmup %lld); raise t_max/max_duration or lower t_warmup",
                         (long long)effective_t_max(s, max_steps), (long long)s->t_warmup);
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
