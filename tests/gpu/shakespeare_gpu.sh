#!/usr/bin/env bash
# Quality on the GPU: tests/integration/train_shakespeare.sh (byte-level tinyshakespeare, the
# last 32 KiB held out, a 0.59M-parameter MoE) run for SPES_SHAKESPEARE_STEPS (default 300)
# steps twice: on the cpu in fp32 and on the GPU in amp_bf16. Both must pass that script's
# own check (validation CE 0.8 nats below the unigram entropy), and the GPU run's final
# validation cross-entropy must be within 2% of the CPU run's. (bf16 changes the trajectory
# step by step, so the runs are not expected to match closely, only to reach the same quality.)
# The device and precision reach the script through a `spes` wrapper (tests/gpu/lib/gpu.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/lib/gpu.sh
require_gpu
DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
if [ ! -f "$DATA/tinyshakespeare.txt" ]; then
  echo "SKIPPED: $DATA/tinyshakespeare.txt not found (set SPES_TEST_DATA)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_SHAKESPEARE_STEPS=${SPES_SHAKESPEARE_STEPS:-300}
REAL_SPES=$SPES_BIN

for run in cpu:fp32 "$GPU_DEVICE":amp_bf16; do
  device=${run%%:*} precision=${run##*:} name=${run//:/_}
  SPES_BIN=$REAL_SPES gpu_spes_wrapper "$tmp/spes_$name" "$device" "$precision"
  echo "== $SPES_SHAKESPEARE_STEPS steps on $device ($precision)"
  SPES_BIN="$tmp/spes_$name" SPES_SHAKESPEARE_OUT="$tmp/$name" bash tests/integration/train_shakespeare.sh \
    > "$tmp/$name.log" 2>&1 || { echo "train_shakespeare.sh on $device ($precision) failed:"; tail -40 "$tmp/$name.log"; exit 1; }
  grep -E "device: |validation ce" "$tmp/$name.log" || true
  grep -q "device: $device" "$tmp/$name.log" || { echo "the $name run did not report device $device"; exit 1; }
done

python3 - "$tmp/cpu_fp32/run/metrics.jsonl" "$tmp/${GPU_DEVICE}_amp_bf16/run/metrics.jsonl" <<'EOF'
import json, sys
def final_eval(path):
    evals = [r for r in map(json.loads, open(path)) if "eval" in r]
    assert evals, f"no validation loss in {path}"
    return evals[-1]["ce"], evals[-1]["step"]
(cpu, cpu_step), (gpu, gpu_step) = final_eval(sys.argv[1]), final_eval(sys.argv[2])
assert cpu_step == gpu_step, f"final evaluations at different steps: {cpu_step} vs {gpu_step}"
rel = abs(gpu - cpu) / cpu
print(f"final validation ce at step {gpu_step}: GPU bf16 {gpu:.4f}, CPU fp32 {cpu:.4f} (relative {100 * rel:.2f}%, limit 2%)")
assert rel <= 0.02, f"the GPU run's validation ce differs from the CPU run's by {100 * rel:.2f}% (> 2%)"
EOF
