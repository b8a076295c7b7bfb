// Learning-rate schedules and the gradient-clipping warm-up, exactly OLMo's (olmo/optim.py,
// allenai/OLMo at 59a53e3f: Scheduler and its subclasses, build_scheduler). OLMo calls
// get_lr(initial_lr, scheduler_current, scheduler_max): with scheduler.units steps (the default)
// the global step, counted from 1 for the first update, and the run's max steps; with units
// tokens the tokens seen and the run's max tokens (olmo/train.py's scheduler_current /
// scheduler_max). So do we (schedule_position).
#pragma once
#include <stdint.h>

// scheduler.name; values in OLMo's SchedulerType order (olmo/config.py).
typedef enum {
    SCHEDULE_COSINE_WITH_WARMUP = 0,    // CosWithWarmup
    SCHEDULE_LINEAR_WITH_WARMUP,        // LinearWithWarmup
    SCHEDULE_INVERSE_SQRT_WITH_WARMUP,  // InvSqrtWithWarmup: lr * sqrt(t_warmup / step) after the warm-up
    SCHEDULE_MAX,                       // "max_scheduler", MaxScheduler: the larger of cosine_with_warmup
                                        // and inverse_sqrt_with_warmup, both built from this one config
    SCHEDULE_CONSTANT,                  // ConstantScheduler: initial_lr at every step, no warm-up
    SCHEDULE_COSINE_LINEAR_ENVELOPE,    // CosLinearEnvelope: the cosine decay times a linear one
    SCHEDULE_CONSTANT_WITH_WARMUP,      // ConstantWithWarmupScheduler
    SCHEDULE_KIND_COUNT
} ScheduleKind;

// scheduler.units: what the schedule counts (OLMo's SchedulerUnits). t_warmup, t_max and
// grad_clip_warmup_steps are in these units.
typedef enum {
    SCHEDULE_UNITS_STEPS = 0,   // optimizer steps
    SCHEDULE_UNITS_TOKENS,      // training tokens seen (global batch x sequence length a step)
} ScheduleUnits;

typedef struct {
    ScheduleKind kind;
    ScheduleUnits units;    // scheduler.units
    int64_t t_warmup;       // scheduler.t_warmup (in units)
    int64_t t_max;          // scheduler.t_max (in units); <= 0: the run's max
    double alpha_f;         // scheduler.alpha_f: final lr = alpha_f * initial_lr
    double warmup_min_lr;   // scheduler.warmup_min_lr; < 0: 0.1 * initial_lr (OLMo default)
    int64_t grad_clip_warmup_steps;   // scheduler.grad_clip_warmup_steps (in units); < 0: null (no clipping warm-up)
    double grad_clip_warmup_factor;   // scheduler.grad_clip_warmup_factor; <= 0: null (no clipping warm-up)
} ScheduleConfig;

// OLMo's SchedulerType names -> kind; the error names the value and lists the names.
int schedule_kind_from_name(const char *name, ScheduleKind *out);
const char *schedule_kind_name(ScheduleKind kind);
// "a, b, ... or z": every name, for messages.
const char *schedule_kind_names(void);
// Whether the kind decays to alpha_f * lr at t_max (so reads t_max and alpha_f): cosine, linear,
// max_scheduler (its cosine part), cosine_linear_envelope.
int schedule_kind_decays(ScheduleKind kind);
// Whether the kind warms up over t_warmup (every kind but constant).
int schedule_kind_warms_up(ScheduleKind kind);
// "steps" / "tokens" -> units; the error names the value.
int schedule_units_from_name(const char *name, ScheduleUnits *out);
const char *schedule_units_name(ScheduleUnits units);

// The run a schedule spans, as olmo/train.py's max_steps / max_tokens read it.
typedef struct {
    int64_t max_steps;         // the run's optimizer steps (config_max_steps)
    int64_t tokens_per_step;   // OLMo's tokens_per_batch: global_train_batch_size x max_sequence_length
    int64_t max_tokens;        // OLMo's max_tokens where fixed: max_duration in tokens ("<N>T"), or
                               // epochs x batches per epoch x tokens_per_step ("<N>ep"); -1 for a
                               // duration in steps, where it is tokens seen + steps left x tokens_per_step
} ScheduleRun;

// Where a step stands on the schedule: OLMo's scheduler_current and scheduler_max.
typedef struct {
    int64_t now, max;
} SchedulePos;
// The schedule's position at step `step` (from 1), tokens_seen counting that step's batch (OLMo's
// fit adds both before train_step): units steps (step, run's max steps), units tokens
// (tokens_seen, max tokens).
SchedulePos schedule_position(const ScheduleConfig *s, const ScheduleRun *run, int64_t step, int64_t tokens_seen);

// How schedule_validate reports a bad value: raises msg about config key `key` (as the config
// loader does, at the line that set it: config_schedule_validate) and returns SPES_ERR.
typedef int (*ScheduleFailFn)(void *ctx, const char *key, const char *msg);
// Checks t_warmup >= 0, alpha_f in [0, 1], warmup_min_lr < initial_lr, and for decaying kinds
// that the decay's end (t_max, else max: the run's length in the schedule's units) is after
// t_warmup; inverse_sqrt_with_warmup needs t_warmup > 0. A failure names the key through
// fail(ctx, ...) (NULL: "key: msg").
int schedule_validate(const ScheduleConfig *s, double initial_lr, int64_t max, ScheduleFailFn fail, void *ctx);
// OLMo's Scheduler.get_lr for the configured kind at position `now` of `max` (in the schedule's
// units: schedule_position).
double schedule_lr(const ScheduleConfig *s, double initial_lr, int64_t now, int64_t max);
// Whether both clipping warm-up keys are set (OLMo ignores one without the other).
int schedule_clip_warmup_on(const ScheduleConfig *s);
// OLMo's Scheduler.get_max_grad_norm (_get_max_grad_norm_coeff): max_grad_norm *
// grad_clip_warmup_factor while now <= grad_clip_warmup_steps (both set), else max_grad_norm.
// `now` is the schedule's position (scheduler_current: steps or tokens seen). A max_grad_norm
// <= 0 (null: no clipping) stays as it is.
double schedule_max_grad_norm(const ScheduleConfig *s, double max_grad_norm, int64_t now);
// The threshold OLMo's trainer clips step `step`'s gradient with. Its train_step clips before it
// sets the param groups' max_grad_norm for the step, so step s clips with the value set at step
// s - 1 and step 1 with max_grad_norm itself. A resume goes on as the run would have (OLMo's
// fix_optim_state_dict puts the groups back to max_grad_norm when it loads a checkpoint, so its
// first step after a resume inside the warm-up clips at max_grad_norm). tokens_before: the tokens
// seen through step s - 1, the position of step s - 1 under units tokens.
double schedule_clip_max_norm(const ScheduleConfig *s, double max_grad_norm, int64_t step, int64_t tokens_before);
