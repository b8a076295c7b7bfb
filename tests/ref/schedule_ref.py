"""Reference for src/train/schedule.c: OLMo's learning-rate schedules (olmo/optim.py:
Scheduler._linear_warmup, CosWithWarmup, LinearWithWarmup, ConstantScheduler), evaluated
over a grid of settings and steps. Prints one case a line:
  kind t_warmup t_max alpha_f warmup_min_lr initial_lr step max_steps expected_lr
(t_max 0 = None, warmup_min_lr -1 = None). Usage: schedule_ref.py > cases.txt
"""
from math import cos, pi


def linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr):
    warmup_min_lr = warmup_min_lr if warmup_min_lr is not None else initial_lr * 0.10
    assert 0 <= warmup_min_lr < initial_lr
    return warmup_min_lr + (initial_lr - warmup_min_lr) * min(step, warmup_steps) / warmup_steps


def get_lr(kind, warmup_steps, t_max, alpha_f, warmup_min_lr, initial_lr, step, max_steps):
    if kind == "constant":
        return initial_lr
    max_steps = max_steps if t_max is None else t_max
    eta_min = initial_lr * alpha_f
    if step < warmup_steps:
        return linear_warmup(initial_lr, step, warmup_steps, warmup_min_lr)
    elif step >= max_steps:
        return eta_min
    step = step - warmup_steps
    max_steps = max_steps - warmup_steps
    if kind == "cosine_with_warmup":
        return eta_min + (initial_lr - eta_min) * (1 + cos(pi * step / max_steps)) / 2
    return initial_lr - (initial_lr - eta_min) * (step / max_steps)


for kind in ("constant", "cosine_with_warmup", "linear_with_warmup"):
    for t_warmup, t_max, alpha_f, wmin in ((10, None, 0.1, None), (0, None, 0.0, None), (7, 50, 0.25, 1e-5),
                                           (2000, None, 0.1, None)):
        for lr, max_steps in ((5e-4, 100), (3e-3, 5000)):
            if t_warmup >= (t_max or max_steps):
                continue
            for step in sorted({0, 1, 2, t_warmup - 1, t_warmup, t_warmup + 1, 33, (t_max or max_steps) - 1,
                                t_max or max_steps, (t_max or max_steps) + 5, max_steps}):
                if step < 0:
                    continue
                v = get_lr(kind, t_warmup, t_max, alpha_f, wmin, lr, step, max_steps)
                print(kind, t_warmup, t_max or 0, alpha_f, -1 if wmin is None else wmin, lr, step, max_steps,
                      repr(v))
