#!/usr/bin/env bash
# amp_fp16 dynamic loss scaling on the GPU, with a forced overflow. The trainer honours
# SPES_FORCE_GRAD_OVERFLOW_STEP=N: step N's gradients are made non-finite, as if fp16 had
# overflowed. The tiny MoE of tests/gpu/lib/gpu.sh trains 8 steps with --precision=amp_fp16,
# a checkpoint every step, once with the overflow forced at step 3 and once without (control).
# Expected (torch.cuda.amp.GradScaler semantics):
#  - step 3 is skipped: its weights and AdamW moments are byte-identical to step 2's, and the
#    optimizer's step count does not advance (when train_state.json records it);
#  - the loss scale halves at step 3 (checkpoint of step 3 = half of step 2's) and does not
#    fall further; the control run's scale does not halve at step 3;
#  - training recovers: steps 4-8 change the weights, every loss is finite, the loss falls
#    from step 1 to step 8; steps 1-2 equal the control run's;
#  - the scale is on the console (a "scale" figure on the step lines; both S and S/2 appear)
#    and in the checkpoint (a numeric key containing "scale" in train_state.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/lib/gpu.sh
require_gpu
if [ "$GPU_DEVICE" = cpu ]; then
  echo "SKIPPED: self-check mode (SPES_GPU_TEST_DEVICE=cpu): loss scaling on the cpu is tests/integration/train_loss_scale.sh"
  exit 77
fi
require_venv numpy safetensors
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gpu_tiny_data "$tmp"
gpu_tiny_yaml "$tmp"
OVERFLOW_STEP=3

run() {   # run NAME [env assignments...]
  local name=$1
  shift
  env "$@" "$SPES_BIN" train "$tmp/tiny.yaml" --device="$GPU_DEVICE" --precision=amp_fp16 --max_duration=8 \
    --save_folder="$tmp/$name" > "$tmp/$name.log" 2>&1 || { echo "$name run failed:"; cat "$tmp/$name.log"; exit 1; }
}
run forced SPES_FORCE_GRAD_OVERFLOW_STEP=$OVERFLOW_STEP
run control
cat "$tmp/forced.log"

"$SPES_VENV_PY" - "$tmp" "$OVERFLOW_STEP" <<'PY'
import json, math, re, sys
from safetensors.numpy import load_file
d, n = sys.argv[1], int(sys.argv[2])

def scales(obj, path=""):
    """Every numeric value under a key containing 'scale' (any depth) in a JSON object."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else k
            if "scale" in k.lower() and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[p] = float(v)
            out.update(scales(v, p))
    return out

def state(run, step):
    return json.load(open(f"{d}/{run}/step{step}/train_state.json"))

def scale(run, step):
    found = scales(state(run, step))
    assert found, (f"{run}/step{step}/train_state.json records no loss scale (no numeric key containing 'scale'): "
                   f"{json.dumps(state(run, step))[:400]}")
    key = next((k for k in found if "loss" in k.lower()), sorted(found)[0])
    return key, found[key]

def raw(path):
    return open(path, "rb").read()

key, s2 = scale("forced", n - 1)
_, s3 = scale("forced", n)
print(f"checkpoint {key}: step {n - 1} {s2:g}, step {n} {s3:g}")
assert s2 > 0 and math.isfinite(s2), f"bad loss scale {s2}"
assert abs(s3 - s2 / 2) <= 1e-9 * s2, f"the loss scale did not halve at the forced overflow: {s2:g} -> {s3:g}"
for step in range(n + 1, 9):
    s = scale("forced", step)[1]
    assert math.isfinite(s) and s >= s3, f"step {step}: the loss scale fell again ({s:g} < {s3:g}) without an overflow"
c2, c3 = scale("control", n - 1)[1], scale("control", n)[1]
assert c3 >= c2, f"the control run (no forced overflow) halved its scale at step {n} too: {c2:g} -> {c3:g}"

# The overflow step is skipped: weights and moments unchanged, the optimizer step count too.
for f in ("model.safetensors", "train_state.safetensors"):
    assert raw(f"{d}/forced/step{n}/{f}") == raw(f"{d}/forced/step{n - 1}/{f}"), \
        f"step {n} changed {f}: the overflowed step was not skipped"
    assert raw(f"{d}/forced/step{n - 1}/{f}") == raw(f"{d}/control/step{n - 1}/{f}"), \
        f"steps before the overflow differ from the control run ({f})"
st2, st3 = state("forced", n - 1), state("forced", n)
if "optimizer_step" in st2:
    assert st3["optimizer_step"] == st2["optimizer_step"], \
        f"optimizer_step advanced on the skipped step: {st2['optimizer_step']} -> {st3['optimizer_step']}"
    assert state("forced", 8)["optimizer_step"] == st2["optimizer_step"] + 8 - n, "optimizer steps after the skip"

# Recovery: later steps update again, losses finite and falling.
for step in range(n + 1, 9):
    assert raw(f"{d}/forced/step{step}/model.safetensors") != raw(f"{d}/forced/step{step - 1}/model.safetensors"), \
        f"step {step} did not update the weights: training did not recover"
rows = [json.loads(l) for l in open(f"{d}/forced/metrics.jsonl")]
loss = {r["step"]: r["loss"] for r in rows if "eval" not in r}
assert sorted(loss) == list(range(1, 9)), f"steps logged: {sorted(loss)}"
bad = [s for s in range(1, 9) if s != n and (loss[s] is None or not math.isfinite(loss[s]))]
assert not bad, f"non-finite losses at steps {bad}"
assert loss[8] < loss[1], f"the loss did not fall: {loss[1]} -> {loss[8]}"
print("losses: " + " ".join(f"{loss[s]:.4f}" if loss[s] is not None else "null" for s in range(1, 9)))

# The console shows the scale: both values appear as a "scale" figure.
console = open(f"{d}/forced.log").read()
shown = {float(x) for x in re.findall(r"scale[^0-9\n]{0,12}([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)", console,
                                      flags=re.IGNORECASE)}
assert shown, "the console shows no loss scale"
for v in (s2, s3):
    assert any(abs(x - v) <= 1e-3 * v for x in shown), f"the console never shows the scale {v:g} (shown: {sorted(shown)})"
print(f"console shows the scale: {sorted(shown)}")
print(f"amp_fp16: overflow at step {n} skipped, scale {s2:g} -> {s3:g}, training recovered")
PY
