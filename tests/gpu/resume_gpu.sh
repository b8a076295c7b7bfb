#!/usr/bin/env bash
# Resume on the GPU, and across devices, with the tiny MoE of tests/gpu/lib/gpu.sh (2
# micro-batches per step, warm-up + cosine, clipping, weight decay):
#  1. bit-exact on the GPU, in fp32 and in amp_bf16: 6 steps straight vs 3 steps (stop_at)
#     + --resume + 3 steps: the step-6 weights, both AdamW moments, the train state and the
#     loss log are equal byte for byte (the backend's reductions run in a fixed order);
#  1b. amp_bf16 with optimizer.overlap_next_forward (AdamW on a second stream under the next
#     forward): the same bytes as the straight run;
#  2. a CPU checkpoint (step 3, fp32) resumed on the GPU (amp_bf16), and a GPU checkpoint
#     (step 3, amp_bf16) resumed on the cpu: each resumes from step 3, runs to step 6, and its
#     losses continue sensibly: every loss finite, steps 4-6 within 5% of the straight run
#     whose first 3 steps it shares (the difference is one device's rounding for 3 steps),
#     and no jump at the hand-over (|loss4 - loss3| < 10% of loss3).
# (Checkpoints hold fp32 master weights and moments whatever the precision; device and
# precision are not part of the configuration hash, so no --force-resume is needed.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/lib/gpu.sh
require_gpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2
gpu_tiny_data "$tmp"
gpu_tiny_yaml "$tmp"

# train NAME DEVICE PRECISION ARGS...: one `spes train` into $tmp/NAME, log $tmp/NAME.<n>.log
train() {
  local name=$1 device=$2 precision=$3 n=1
  shift 3
  while [ -e "$tmp/$name.$n.log" ]; do n=$((n + 1)); done
  "$SPES_BIN" train "$tmp/tiny.yaml" --device="$device" --precision="$precision" --save_folder="$tmp/$name" "$@" \
    > "$tmp/$name.$n.log" 2>&1 || { echo "$name ($device, $precision, $*) failed:"; cat "$tmp/$name.$n.log"; exit 1; }
  grep -q "device: $device" "$tmp/$name.$n.log" || { echo "$name: not on $device:"; cat "$tmp/$name.$n.log"; exit 1; }
}
strip_perf() { sed 's/,"perf":{[^}]*}//' "$1"; }
# same_bytes A B WHAT: runs A and B left the same step-6 weights, moments and train state and
# the same loss log (6 steps), byte for byte.
same_bytes() {
  local a=$1 b=$2 what=$3 f
  for f in model.safetensors train_state.safetensors train_state.json; do
    cmp "$tmp/$a/step6/$f" "$tmp/$b/step6/$f" || { echo "$what: step6/$f differs"; exit 1; }
  done
  strip_perf "$tmp/$a/metrics.jsonl" > "$tmp/a.jsonl"
  strip_perf "$tmp/$b/metrics.jsonl" > "$tmp/b.jsonl"
  [ "$(wc -l < "$tmp/a.jsonl")" -eq 6 ] || { echo "expected 6 step lines"; cat "$tmp/a.jsonl"; exit 1; }
  cmp "$tmp/a.jsonl" "$tmp/b.jsonl" || { echo "$what: loss logs differ"; diff "$tmp/a.jsonl" "$tmp/b.jsonl"; exit 1; }
}

# 1. bit-exact resume on the GPU
for precision in fp32 amp_bf16; do
  train "straight_$precision" "$GPU_DEVICE" "$precision"
  train "split_$precision" "$GPU_DEVICE" "$precision" --stop_at=3
  if [ ! -d "$tmp/split_$precision/step3" ] || [ -d "$tmp/split_$precision/step4" ]; then
    echo "stop_at=3 did not stop at step 3"; ls "$tmp/split_$precision"; exit 1
  fi
  train "split_$precision" "$GPU_DEVICE" "$precision" --resume
  grep -q "resumed from .*step3" "$tmp/split_$precision.2.log" || { echo "did not resume from step3"; cat "$tmp/split_$precision.2.log"; exit 1; }
  same_bytes "straight_$precision" "split_$precision" "$precision, the straight and the resumed GPU run"
  echo "GPU $precision: 6 straight == 3 + resume + 3, byte for byte (weights, moments, train state, loss log)"
done

# 1b. optimizer.overlap_next_forward: each step's AdamW on a second stream under the next
# forward, which waits per layer; the aux stream held 20 ms at its start and after each layer's
# update (SPES_CUDA_AUX_DELAY_US), so a missing wait would read stale weights for certain. The
# same bytes as the straight run (the save after every step waits for the update first).
SPES_CUDA_AUX_DELAY_US=20000 train overlap_amp_bf16 "$GPU_DEVICE" amp_bf16 --optimizer.overlap_next_forward=true
grep -q "AdamW runs under the next step's forward" "$tmp/overlap_amp_bf16.1.log" || { echo "overlap not on"; cat "$tmp/overlap_amp_bf16.1.log"; exit 1; }
same_bytes straight_amp_bf16 overlap_amp_bf16 "amp_bf16 with optimizer.overlap_next_forward"
echo "GPU amp_bf16: optimizer.overlap_next_forward gives the same bytes (weights, moments, train state, loss log)"

# 2. across devices
train straight_cpu cpu fp32
train cpu_to_gpu cpu fp32 --stop_at=3
train cpu_to_gpu "$GPU_DEVICE" amp_bf16 --resume
grep -q "resumed from .*step3" "$tmp/cpu_to_gpu.2.log" || { echo "GPU did not resume the CPU checkpoint"; cat "$tmp/cpu_to_gpu.2.log"; exit 1; }
train gpu_to_cpu "$GPU_DEVICE" amp_bf16 --stop_at=3
train gpu_to_cpu cpu fp32 --resume
grep -q "resumed from .*step3" "$tmp/gpu_to_cpu.2.log" || { echo "CPU did not resume the GPU checkpoint"; cat "$tmp/gpu_to_cpu.2.log"; exit 1; }

python3 - "$tmp" <<'EOF'
import json, math, sys
d = sys.argv[1]
def losses(name):
    rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl")]
    return {r["step"]: r["loss"] for r in rows if "eval" not in r}
for resumed, reference, what in (("cpu_to_gpu", "straight_cpu", "CPU checkpoint resumed on the GPU"),
                                 ("gpu_to_cpu", "straight_amp_bf16", "GPU checkpoint resumed on the CPU")):
    got, ref = losses(resumed), losses(reference)
    assert sorted(got) == list(range(1, 7)), f"{what}: steps {sorted(got)}"
    assert all(v is not None and math.isfinite(v) for v in got.values()), f"{what}: non-finite loss {got}"
    for s in (1, 2, 3):
        assert got[s] == ref[s], f"{what}: step {s} loss {got[s]} differs from the run that wrote the checkpoint ({ref[s]})"
    for s in (4, 5, 6):
        rel = abs(got[s] - ref[s]) / ref[s]
        assert rel < 0.05, f"{what}: step {s} loss {got[s]:.4f} vs {ref[s]:.4f} ({100 * rel:.1f}% > 5%)"
    jump = abs(got[4] - got[3]) / got[3]
    assert jump < 0.10, f"{what}: the loss jumps at the hand-over: {got[3]:.4f} -> {got[4]:.4f}"
    print(f"{what}: losses " + " ".join(f"{got[s]:.4f}" for s in range(1, 7)) +
          f" (steps 4-6 within 5% of {reference})")
EOF
