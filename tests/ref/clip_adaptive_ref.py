"""Reference for src/train/clip_adaptive.c: OLMo's adaptive gradient clipping, transcribed from
olmo/optim.py of allenai/OLMo at 59a53e3f68e546330ca5a99ec626e58f9ab96494
(Optimizer.clip_grads_and_collect_metrics -> _do_adaptive_clipping, the grad_norm_exp_avg
state) with the order of olmo/train.py's train_step (clip with the param groups'
max_grad_norm_ratio, then set it to scheduler.get_max_grad_norm(cfg.max_grad_norm_ratio,
scheduler_current, ...) for the next step; the groups start at cfg.max_grad_norm_ratio), in
numpy float32 as torch computes it.

Checked against a `spes train` run that saved every step (RUN/stepS/) and wrote each step's
gradient before clipping (SPES_CLIP_DUMP_GRADS=GRADS: GRADS/grad.S.safetensors):
  - after step S the checkpoint holds grad_norm_exp_avg.NAME exactly for the tensors OLMo's
    state holds one for (none after step 1), with the reference's value (relative 1e-5);
  - the AdamW first moment of step S is beta1 * that of step S-1 + (1 - beta1) * coef * grad
    (relative 1e-5 per tensor): the clip factor reached the update. For every clipped tensor the
    check would fail with the unclipped gradient (it tells clipped from not).
Usage: clip_adaptive_ref.py RUN GRADS STEPS RATIO BETA1 BETA2 [--warmup STEPS FACTOR] [--from K]
--from K: the run resumed at step K from a checkpoint without averages (a run without adaptive
clipping): OLMo's state then has none before step K, whose group ratio is cfg's
(fix_optim_state_dict), and steps K..STEPS are checked.
Prints the clipped tensors per step; exits 1 on a mismatch.
"""
import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

f32 = np.float32


def get_max_grad_norm_coeff(initial_value, step, warmup_steps, warmup_factor):
    # Scheduler._get_max_grad_norm_coeff
    if initial_value is None:
        return None
    if warmup_steps is None or warmup_factor is None or step > warmup_steps:
        return initial_value
    return warmup_factor * initial_value


def lerp(a, end, weight):
    # torch.lerp with a scalar weight (float32)
    weight = f32(weight)
    if weight < 0.5:
        return f32(a + weight * (end - a))
    return f32(end - (end - a) * (f32(1) - weight))


def do_adaptive_clipping(grads, state, max_norm_ratio, global_step, betas):
    """_do_adaptive_clipping over one group: returns {name: clip_coef_clamped} and updates state."""
    beta = max(betas)
    coefs = {}
    for name, g in grads.items():
        grad_norm = f32(np.sqrt(np.sum(g.astype(np.float64) ** 2)))   # vector_norm(dtype=float32)
        avg = state.get(name)
        stored = avg is not None
        if avg is None:
            avg = f32(grad_norm)
            if global_step > 1:
                stored = True
        max_allowed_norm = f32(max_norm_ratio) * avg
        clip_coef = f32(max_allowed_norm / (grad_norm + f32(1e-6)))
        clip_coef_clamped = min(clip_coef, f32(1.0))
        avg = lerp(avg, f32(grad_norm * clip_coef_clamped), 1 - beta)
        if stored:
            state[name] = avg
        coefs[name] = clip_coef_clamped
    return coefs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("grads")
    ap.add_argument("steps", type=int)
    ap.add_argument("ratio", type=float)
    ap.add_argument("beta1", type=float)
    ap.add_argument("beta2", type=float)
    ap.add_argument("--warmup", nargs=2, type=float, default=[None, None])
    ap.add_argument("--from", dest="first", type=int, default=1)
    a = ap.parse_args()
    run, grads_dir, steps, ratio, beta1, beta2 = a.run, a.grads, a.steps, a.ratio, a.beta1, a.beta2
    warm_steps = int(a.warmup[0]) if a.warmup[0] is not None else None
    warm_factor = a.warmup[1]
    state = {}
    group_ratio = ratio   # get_param_groups (and fix_optim_state_dict): cfg.max_grad_norm_ratio
    prev_m = None
    if a.first > 1:
        ts = load_file(os.path.join(run, f"step{a.first - 1}", "train_state.safetensors"))
        prev_m = {k[len("exp_avg."):]: v for k, v in ts.items() if k.startswith("exp_avg.")}
    bad = 0
    clipped_total = unclipped_total = discriminated = 0
    for step in range(a.first, steps + 1):
        grads = load_file(os.path.join(grads_dir, f"grad.{step}.safetensors"))
        ts = load_file(os.path.join(run, f"step{step}", "train_state.safetensors"))
        coefs = do_adaptive_clipping(grads, state, group_ratio, step, (beta1, beta2))
        coefs_ratio = group_ratio
        # train_step: the ratio for the next step (scheduler_current = global_step, units steps)
        group_ratio = get_max_grad_norm_coeff(ratio, step, warm_steps, warm_factor)
        clipped = sorted(n for n, c in coefs.items() if c < 1)
        # metrics.jsonl's clipping_rate (OLMo's optim/clipping_rate): the share clipped
        line = next((json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))
                     if json.loads(l).get("step") == step and "clipping_rate" in json.loads(l)), None)
        if line is None or abs(line["clipping_rate"] - len(clipped) / len(coefs)) > 1e-12:
            print(f"FAILED step {step}: metrics.jsonl clipping_rate {line and line['clipping_rate']!r}, "
                  f"reference {len(clipped)}/{len(coefs)}")
            bad += 1
        clipped_total += len(clipped)
        unclipped_total += len(coefs) - len(clipped)
        used = coefs_ratio
        print(f"step {step}: ratio {used:g}, "
              f"{len(clipped)} of {len(coefs)} tensors clipped"
              + (": " + ", ".join(f"{n} x{coefs[n]:.4f}" for n in clipped[:4]) + (" ..." if len(clipped) > 4 else "")
                 if clipped else ""))
        # the state's averages, as checkpointed
        have = {k[len("grad_norm_exp_avg."):]: v for k, v in ts.items() if k.startswith("grad_norm_exp_avg.")}
        if set(have) != set(state):
            print(f"FAILED step {step}: checkpoint holds averages of {sorted(have)[:3]}... ({len(have)}), "
                  f"OLMo's state {len(state)}")
            bad += 1
        for name, v in have.items():
            ref = state.get(name)
            if ref is not None and abs(float(v[0]) - float(ref)) > 1e-5 * abs(float(ref)) + 1e-12:
                print(f"FAILED step {step}: grad_norm_exp_avg.{name} {float(v[0])!r}, reference {float(ref)!r}")
                bad += 1
        # the clipped gradient reached AdamW: exp_avg = m + (1 - beta1) * (coef * g - m)
        for name, g in grads.items():
            m_prev = prev_m[name] if prev_m is not None else np.zeros_like(g)
            got = ts["exp_avg." + name]
            w1 = f32(1 - beta1)

            def rel(coef):
                want = m_prev + w1 * (g * f32(coef) - m_prev)
                return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))

            err = rel(coefs[name])
            if err > 1e-5:
                print(f"FAILED step {step}: exp_avg.{name} off by {err:.2e} (relative) with clip factor {coefs[name]}")
                bad += 1
            if coefs[name] < 0.999:
                if rel(1.0) > 1e-4:
                    discriminated += 1
                else:
                    print(f"FAILED step {step}: {name}: the moments cannot tell its clipping ({rel(1.0):.1e})")
                    bad += 1
        prev_m = {k[len("exp_avg."):]: v for k, v in ts.items() if k.startswith("exp_avg.")}
    print(f"{clipped_total} tensor-steps clipped, {unclipped_total} not; {discriminated} clipped ones visibly so")
    if clipped_total == 0 or unclipped_total == 0:
        print("FAILED: the ratio should clip some tensors and not others")
        bad += 1
    if bad:
        sys.exit(1)
    print("adaptive clipping agrees with OLMo's (reference transcription)")


if __name__ == "__main__":
    main()
