// OLMo's learning-rate schedules and clipping warm-up. See schedule.h. The formulas follow olmo/optim.py of
// allenai/OLMo at commit 59a53e3f68e546330ca5a99ec626e58f9ab96494 (Scheduler._linear_warmup,
// _get_max_grad_norm_coeff, CosWithWarmup, LinearWithWarmup, InvSqrtWithWarmup, MaxScheduler,
// ConstantScheduler, CosLinearEnvelope, ConstantWithWarmupScheduler, build_scheduler), each
// written in the same order of operations so the values are the same doubles.
#include "train/schedule.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static const char *const kind_names[SCHEDULE_KIND_COUNT] = {
    [SCHEDULE_COSINE_WITH_WARMUP] = "cosine_with_warmup",
    [SCHEDULE_LINEAR_WITH_WARMUP] = "linear_with_warmup",
    [SCHEDULE_INVERSE_SQRT_WITH_WARMUP] = "inverse_sqrt_with_warmup",
    [SCHEDULE_MAX] = "max_scheduler",
    [SCHEDULE_CONSTANT] = "constant",
    [SCHEDULE_COSINE_LINEAR_ENVELOPE] = "cosine_linear_envelope",
    [SCHEDULE_CONSTANT_WITH_WARMUP] = "constant_with_warmup",
};

const char *schedule_kind_names(void) {
    return "cosine_with_warmup, linear_with_warmup, inverse_sqrt_with_warmup, max_scheduler, constant, "
           "cosine_linear_envelope or constant_with_warmup";
}

int schedule_kind_from_name(const char *name, ScheduleKind *out) {
    for (int k = 0; k < SCHEDULE_KIND_COUNT; k++)
        if (!strcmp(name, kind_names[k])) {
            *out = (ScheduleKind)k;
            return SPES_OK;
        }
    return spes_fail("scheduler.name '%s' is not supported (use %s)", name, schedule_kind_names());
}

const char *schedule_kind_name(ScheduleKind kind) {
    return (unsigned)kind < SCHEDULE_KIND_COUNT ? kind_names[kind] : "?";
}

int schedule_kind_decays(ScheduleKind kind) {
    return kind == SCHEDULE_COSINE_WITH_WARMUP || kind == SCHEDULE_LINEAR_WITH_WARMUP || kind == SCHEDULE_MAX ||
           kind == SCHEDULE_COSINE_LINEAR_ENVELOPE;
}

int schedule_kind_warms_up(ScheduleKind kind) { return kind != SCHEDULE_CONSTANT; }

int schedule_units_from_name(const char *name, ScheduleUnits *out) {
    for (int u = SCHEDULE_UNITS_STEPS; u <= SCHEDULE_UNITS_TOKENS; u++)
        if (!strcmp(name, schedule_units_name((ScheduleUnits)u))) {
            *out = (ScheduleUnits)u;
            return SPES_OK;
        }
    return spes_fail("scheduler.units '%s' is not supported (use steps or tokens)", name);
}

const char *schedule_units_name(ScheduleUnits units) { return units == SCHEDULE_UNITS_TOKENS ? "tokens" : "steps"; }

// The unit of a position, for messages: "step" or "token".
static const char *unit_word(const ScheduleConfig *s) { return s->units == SCHEDULE_UNITS_TOKENS ? "token" : "step"; }

// olmo/train.py's scheduler_current: global_step or global_train_tokens_seen.
static int64_t position_now(const ScheduleConfig *s, int64_t step, int64_t tokens_seen) {
    return s->units == SCHEDULE_UNITS_TOKENS ? tokens_seen : step;
}

SchedulePos schedule_position(const ScheduleConfig *s, const ScheduleRun *run, int64_t step, int64_t tokens_seen) {
    SchedulePos pos = {.now = position_now(s, step, tokens_seen), .max = run->max_steps};
    if (s->units != SCHEDULE_UNITS_TOKENS) return pos;
    // max_tokens: fixed by a duration in tokens or epochs; for one in steps, the tokens seen
    // plus max(max_duration - global_step, 0) more batches of tokens_per_batch.
    int64_t steps_left = run->max_steps > step ? run->max_steps - step : 0;
    pos.max = run->max_tokens >= 0 ? run->max_tokens : tokens_seen + steps_left * run->tokens_per_step;
    return pos;
}

static int64_t effective_t_max(const ScheduleConfig *s, int64_t max) { return s->t_max > 0 ? s->t_max : max; }

// Raises msg about key through fail (NULL: "key: msg"); SPES_ERR.
static int fail_key(ScheduleFailFn fail, void *ctx, const char *key, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail ? fail(ctx, key, msg) : spes_fail("%s: %s", key, msg);
}

int schedule_validate(const ScheduleConfig *s, double initial_lr, int64_t max, ScheduleFailFn fail, void *ctx) {
    if (!schedule_kind_warms_up(s->kind)) return SPES_OK;
    if (s->t_warmup < 0)
        return fail_key(fail, ctx, "scheduler.t_warmup", "must be >= 0, got %lld", (long long)s->t_warmup);
    // OLMo's InvSqrtWithWarmup is lr * sqrt(t_warmup / step): 0 at every step without a warm-up.
    if (s->kind == SCHEDULE_INVERSE_SQRT_WITH_WARMUP && s->t_warmup == 0)
        return fail_key(fail, ctx, "scheduler.t_warmup", "must be > 0 for inverse_sqrt_with_warmup (its rate is "
                        "learning_rate * sqrt(t_warmup / step): 0 at every step), got 0");
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
    if (schedule_kind_decays(s->kind) && effective_t_max(s, max) <= s->t_warmup) {
        // The end of the decay is t_max when set, else the run's length (max_duration).
        const char *end = s->t_max > 0 ? "scheduler.t_max" : "max_duration";
        return fail_key(fail, ctx, end, "the decay ends at %s %lld, not after the warm-up (scheduler.t_warmup %lld): "
                        "raise %s or lower scheduler.t_warmup",
                        unit_word(s), (long long)effective_t_max(s, max), (long long)s->t_warmup, end);
    }
    return SPES_OK;
}

// Scheduler._linear_warmup: from warmup_min_lr (default 0.1*lr) up to lr.
static double linear_warmup(const ScheduleConfig *s, double initial_lr, int64_t step) {
    double min_lr = s->warmup_min_lr >= 0 ? s->warmup_min_lr : initial_lr * 0.10;
    int64_t done = step < s->t_warmup ? step : s->t_warmup;
    return min_lr + (initial_lr - min_lr) * (double)done / (double)s->t_warmup;
}

// The decaying kinds after the warm-up and before t_max: t steps into a decay of span steps
// from initial_lr towards eta_min.
static double decay(ScheduleKind kind, double initial_lr, double eta_min, double t, double span) {
    switch (kind) {
    case SCHEDULE_LINEAR_WITH_WARMUP: return initial_lr - (initial_lr - eta_min) * (t / span);
    case SCHEDULE_COSINE_LINEAR_ENVELOPE: {
        double linear_envelope = 1 - (t / span);
        double cosine_schedule = (initial_lr - eta_min) * (1 + cos(M_PI * t / span)) / 2;
        return eta_min + linear_envelope * cosine_schedule;
    }
    default: return eta_min + (initial_lr - eta_min) * (1 + cos(M_PI * t / span)) / 2;   // cosine
    }
}

// CosWithWarmup, LinearWithWarmup and CosLinearEnvelope share their frame: the warm-up, then
// the decay up to t_max (default the run's max steps), then alpha_f * lr.
static double decaying_lr(const ScheduleConfig *s, ScheduleKind kind, double initial_lr, int64_t step,
                          int64_t max_steps) {
    int64_t t_max = effective_t_max(s, max_steps);
    double eta_min = initial_lr * s->alpha_f;
    if (step < s->t_warmup) return linear_warmup(s, initial_lr, step);
    if (step >= t_max) return eta_min;
    return decay(kind, initial_lr, eta_min, (double)(step - s->t_warmup), (double)(t_max - s->t_warmup));
}

// InvSqrtWithWarmup. With t_warmup 0 OLMo's sqrt(0 / step) is 0 from step 1 (step 0 divides by
// zero there; no update runs at step 0): 0 here at every step. Only max_scheduler reaches it so.
static double inverse_sqrt_lr(const ScheduleConfig *s, double initial_lr, int64_t step) {
    if (step < s->t_warmup) return linear_warmup(s, initial_lr, step);
    if (s->t_warmup == 0) return 0.0;
    int64_t denom = step > s->t_warmup ? step : s->t_warmup;
    return initial_lr * sqrt((double)s->t_warmup / (double)denom);
}

double schedule_lr(const ScheduleConfig *s, double initial_lr, int64_t step, int64_t max_steps) {
    switch (s->kind) {
    case SCHEDULE_CONSTANT: return initial_lr;
    case SCHEDULE_CONSTANT_WITH_WARMUP: return step < s->t_warmup ? linear_warmup(s, initial_lr, step) : initial_lr;
    case SCHEDULE_INVERSE_SQRT_WITH_WARMUP: return inverse_sqrt_lr(s, initial_lr, step);
    case SCHEDULE_MAX: {   // build_scheduler's sched1 (cosine) and sched2 (inverse sqrt), same settings
        double cosine = decaying_lr(s, SCHEDULE_COSINE_WITH_WARMUP, initial_lr, step, max_steps);
        double inv_sqrt = inverse_sqrt_lr(s, initial_lr, step);
        return inv_sqrt > cosine ? inv_sqrt : cosine;   // Python's max(sched1, sched2)
    }
    default: return decaying_lr(s, s->kind, initial_lr, step, max_steps);
    }
}

int schedule_clip_warmup_on(const ScheduleConfig *s) {
    return s->grad_clip_warmup_steps >= 0 && s->grad_clip_warmup_factor > 0;
}

double schedule_max_grad_norm(const ScheduleConfig *s, double max_grad_norm, int64_t now) {
    if (max_grad_norm <= 0 || !schedule_clip_warmup_on(s) || now > s->grad_clip_warmup_steps) return max_grad_norm;
    return s->grad_clip_warmup_factor * max_grad_norm;
}

double schedule_clip_max_norm(const ScheduleConfig *s, double max_grad_norm, int64_t step, int64_t tokens_before) {
    // OLMo's get_param_groups starts the groups at max_grad_norm; train_step(s) clips, then sets
    // them to get_max_grad_norm(scheduler_current of step s) for step s + 1.
    if (step <= 1) return max_grad_norm;
    return schedule_max_grad_norm(s, max_grad_norm, position_now(s, step - 1, tokens_before));
}
