"""Reference for src/train/schedule.c: OLMo's learning-rate schedules, transcribed line by line
from olmo/optim.py of allenai/OLMo at 59a53e3f68e546330ca5a99ec626e58f9ab96494
(Scheduler._linear_warmup, CosWithWarmup, LinearWithWarmup, InvSqrtWithWarmup, MaxScheduler,
ConstantScheduler, CosLinearEnvelope, ConstantWithWarmupScheduler, and build_scheduler, which
makes max_scheduler's sched1/sched2 a cosine_with_warmup and an inverse_sqrt_with_warmup of the
same config), evaluated over a grid of settings and steps. Prints one case a line:
  kind t_warmup t_max alpha_f warmup_min_lr initial_lr step max_steps expected_lr
(t_max 0 = None, warmup_min_lr -1 = None). Usage: schedule_ref.py > cases.txt

Also the clipping warm-up: Scheduler._get_max_grad_norm_coeff and the order in which olmo/train.py's
train_step uses it (clip_grads_and_collect_metrics with the param groups' max_grad_norm, then
group["max_grad_norm"] = scheduler.get_max_grad_norm(cfg.max_grad_norm, global_step, ...)), the
groups starting at cfg.max_grad_norm (get_param_groups): clip_thresholds().

And scheduler.units (SchedulerUnits steps / tokens): olmo/train.py's Trainer.max_steps, max_tokens,
scheduler_current and scheduler_max, with fit()'s bookkeeping (global_step and
global_train_tokens_seen advanced before train_step) and train_step's order (clip with the
groups' max_grad_norm, then set lr and max_grad_norm from scheduler_current / scheduler_max):
train_loop(). Usage: schedule_ref.py loop > loop_cases.txt prints one step a line:
  units kind max_duration instances batch seq t_warmup t_max clip_steps clip_factor max_grad_norm
  step tokens_before lr clip
(t_max 0 = None, clip_steps / clip_factor -1 = None).
"""
import sys
from math import cos, pi, sqrt


def linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr):
    warmup_min_lr = warmup_min_lr if warmup_min_lr is not None else initial_lr * 0.10
    assert 0 <= warmup_min_lr < initial_lr
    return warmup_min_lr + (initial_lr - warmup_min_lr) * min(step, warmup_steps) / warmup_steps


def cos_with_warmup(warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    max_steps = max_steps if t_max is None else t_max
    eta_min = initial_lr * alpha_f
    if step < warmup_steps:
        return linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr)
    elif step >= max_steps:
        return eta_min
    else:
        step = step - warmup_steps
        max_steps = max_steps - warmup_steps
        return eta_min + (initial_lr - eta_min) * (1 + cos(pi * step / max_steps)) / 2


def linear_with_warmup(warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    max_steps = max_steps if t_max is None else t_max
    eta_min = initial_lr * alpha_f
    if step < warmup_steps:
        return linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr)
    elif step >= max_steps:
        return eta_min
    else:
        step = step - warmup_steps
        max_steps = max_steps - warmup_steps
        return initial_lr - (initial_lr - eta_min) * (step / max_steps)


def inv_sqrt_with_warmup(warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    if step < warmup_steps:
        return linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr)
    del max_steps
    return initial_lr * sqrt(warmup_steps / max(warmup_steps, step))


def max_scheduler(*args):
    return max(cos_with_warmup(*args), inv_sqrt_with_warmup(*args))


def constant(warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    del step, max_steps
    return initial_lr


def cos_linear_envelope(warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    max_steps = max_steps if t_max is None else t_max
    eta_min = initial_lr * alpha_f

    if step < warmup_steps:
        return linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr)
    if step >= max_steps:
        return eta_min
    else:
        step = step - warmup_steps
        max_steps = max_steps - warmup_steps
        linear_envelope = 1 - (step / max_steps)
        cosine_schedule = (initial_lr - eta_min) * (1 + cos(pi * step / max_steps)) / 2
        return eta_min + linear_envelope * cosine_schedule


def constant_with_warmup(warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    if step < warmup_steps:
        return linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr)
    del max_steps
    return initial_lr


def max_grad_norm_coeff(grad_clip_warmup_steps, grad_clip_warmup_factor, initial_value, step):
    if initial_value is None:
        return None
    elif (
        grad_clip_warmup_steps is None
        or grad_clip_warmup_factor is None
        or step > grad_clip_warmup_steps
    ):
        return initial_value
    else:
        return grad_clip_warmup_factor * initial_value


def clip_thresholds(grad_clip_warmup_steps, grad_clip_warmup_factor, max_grad_norm, n_steps):
    """The max_grad_norm each of OLMo's global steps 1..n_steps clips with."""
    group_max_grad_norm = max_grad_norm   # get_param_groups
    used = []
    for global_step in range(1, n_steps + 1):   # fit: global_step += 1, then train_step
        used.append(group_max_grad_norm)     # optim.clip_grads_and_collect_metrics
        group_max_grad_norm = max_grad_norm_coeff(grad_clip_warmup_steps, grad_clip_warmup_factor, max_grad_norm,
                                                  global_step)
    return used


class OlmoTrainLoop:
    """olmo/train.py's Trainer, the parts that feed the scheduler (global_step and
    global_train_tokens_seen counted in fit(); max_steps, max_tokens, scheduler_current and
    scheduler_max as properties, verbatim)."""

    def __init__(self, units, max_duration, instances, global_train_batch_size, max_sequence_length):
        self.units = units
        self.max_duration = max_duration   # int steps, or str "<N>T" / "<N>ep"
        self.total_size = instances        # dataset.total_size
        self.global_train_batch_size = global_train_batch_size
        self.max_sequence_length = max_sequence_length
        self.global_step = 0
        self.global_train_tokens_seen = 0

    @property
    def tokens_per_batch(self):
        return self.global_train_batch_size * self.max_sequence_length

    @property
    def batches_per_epoch(self):
        return self.total_size // self.global_train_batch_size

    @property
    def max_steps(self):
        if isinstance(self.max_duration, int):
            return self.max_duration
        elif self.max_duration.endswith("T"):
            max_tokens = int(float(self.max_duration[:-1].strip()))
            tokens_remaining = max(max_tokens - self.global_train_tokens_seen, 0)
            steps_remaining = -(-tokens_remaining // self.tokens_per_batch)   # math.ceil of the division
            return self.global_step + steps_remaining
        elif self.max_duration.endswith("ep"):
            max_epochs = int(self.max_duration[:-2].strip())
            return max_epochs * self.batches_per_epoch
        else:
            return int(float(self.max_duration))

    @property
    def max_tokens(self):
        if isinstance(self.max_duration, int):
            return self.global_train_tokens_seen + max(self.max_duration - self.global_step, 0) * self.tokens_per_batch
        elif self.max_duration.endswith("T"):
            return int(float(self.max_duration[:-1].strip()))
        elif self.max_duration.endswith("ep"):
            max_epochs = int(self.max_duration[:-2].strip())
            return max_epochs * self.batches_per_epoch * self.tokens_per_batch
        else:
            return self.global_train_tokens_seen + max(int(float(self.max_duration)) - self.global_step, 0) * self.tokens_per_batch

    @property
    def scheduler_current(self):
        return self.global_step if self.units == "steps" else self.global_train_tokens_seen

    @property
    def scheduler_max(self):
        return self.max_steps if self.units == "steps" else self.max_tokens


def train_loop(units, kind, max_duration, instances, batch, seq, t_warmup, t_max, clip_steps, clip_factor,
               max_grad_norm, lr=1e-3):
    """Per step of the run: (step, tokens seen before it, lr, clip threshold), full batches only
    (OLMo's fit asserts every batch has device_train_batch_size instances)."""
    t = OlmoTrainLoop(units, max_duration, instances, batch, seq)
    get_lr = SCHEDULERS[kind]
    group_max_grad_norm = max_grad_norm   # get_param_groups
    rows = []
    while t.global_step < t.max_steps:
        tokens_before = t.global_train_tokens_seen
        t.global_step += 1                                   # fit()
        t.global_train_tokens_seen += batch * seq
        clip = group_max_grad_norm                           # clip_grads_and_collect_metrics
        step_lr = get_lr(t_warmup, t_max, 0.1, None, lr, t.scheduler_current, t.scheduler_max)
        group_max_grad_norm = max_grad_norm_coeff(clip_steps, clip_factor, max_grad_norm, t.scheduler_current)
        rows.append((t.global_step, tokens_before, step_lr, clip))
    return rows


# (units, kind, max_duration, instances, batch, seq, t_warmup, t_max, clip_steps, clip_factor, max_grad_norm)
LOOP_RUNS = (
    ("steps", "cosine_with_warmup", 12, 1000, 4, 16, 3, None, 2, 0.5, 1.0),
    ("tokens", "cosine_with_warmup", 12, 1000, 4, 16, 192, None, 128, 0.5, 1.0),   # the same run in tokens
    ("tokens", "cosine_with_warmup", 12, 1000, 4, 16, 3, None, 2, 0.5, 1.0),       # step counts read as tokens
    ("tokens", "linear_with_warmup", "700T", 1000, 4, 16, 100, None, 70, 0.25, 2.0),   # a duration in tokens
    ("tokens", "cosine_linear_envelope", "1ep", 40, 4, 16, 50, 500, -1, None, 1.0),  # epochs; t_max in tokens
    ("steps", "max_scheduler", "1000T", 1000, 4, 16, 4, None, None, None, 1.0),    # steps of a duration in tokens
    ("tokens", "constant_with_warmup", 8, 1000, 3, 10, 65, None, 30, 3.0, 0.5),
)


def loop_cases():
    for units, kind, dur, inst, batch, seq, tw, tm, cs, cf, mgn in LOOP_RUNS:
        for step, before, lr, clip in train_loop(units, kind, dur, inst, batch, seq, tw, tm,
                                                 None if cs == -1 else cs, cf, mgn):
            yield (units, kind, dur, inst, batch, seq, tw, tm or 0, -1 if cs is None or cs == -1 else cs,
                   -1 if cf is None else cf, mgn, step, before, lr, clip)


SCHEDULERS = {
    "cosine_with_warmup": cos_with_warmup,
    "linear_with_warmup": linear_with_warmup,
    "inverse_sqrt_with_warmup": inv_sqrt_with_warmup,
    "max_scheduler": max_scheduler,
    "constant": constant,
    "cosine_linear_envelope": cos_linear_envelope,
    "constant_with_warmup": constant_with_warmup,
}

DECAYING = ("cosine_with_warmup", "linear_with_warmup", "max_scheduler", "cosine_linear_envelope")


def cases():
    """(kind, t_warmup, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps, expected) over the grid."""
    for kind, get_lr in SCHEDULERS.items():
        for t_warmup, t_max, alpha_f, wmin in ((10, None, 0.1, None), (0, None, 0.0, None), (7, 50, 0.25, 1e-5),
                                               (2000, None, 0.1, None), (5, 200, 0.1, None)):
            for lr, max_steps in ((5e-4, 100), (3e-3, 5000)):
                if t_warmup >= (t_max or max_steps) and kind in DECAYING:
                    continue   # the decay would end inside the warm-up: refused by schedule_validate
                if t_warmup == 0 and kind == "inverse_sqrt_with_warmup":
                    continue   # lr 0 at every step: refused by schedule_validate
                for step in sorted({0, 1, 2, t_warmup - 1, t_warmup, t_warmup + 1, 33, (t_max or max_steps) - 1,
                                    t_max or max_steps, (t_max or max_steps) + 5, max_steps, 4 * max_steps}):
                    # OLMo's inverse sqrt divides by zero at step 0 without a warm-up; no update runs at step 0.
                    if step < 0 or (step == 0 and t_warmup == 0 and kind == "max_scheduler"):
                        continue
                    yield kind, t_warmup, t_max, alpha_f, wmin, lr, step, max_steps, get_lr(
                        t_warmup, t_max, alpha_f, wmin, lr, step, max_steps)


if __name__ == "__main__" and sys.argv[1:] == ["loop"]:
    for case in loop_cases():
        print(*case[:-2], repr(case[-2]), repr(case[-1]))
elif __name__ == "__main__":
    for kind, t_warmup, t_max, alpha_f, wmin, lr, step, max_steps, v in cases():
        print(kind, t_warmup, t_max or 0, alpha_f, -1 if wmin is None else wmin, lr, step, max_steps, repr(v))
