# shellcheck shell=bash
# Shared by tests/gpu/*.sh (sourced from the repository root, not a test itself): whether a
# CUDA backend opens, a tiny deterministic corpus and model config, and a `spes` wrapper that
# puts a run on a chosen device/precision (to run an existing integration script on the GPU).
# Needs tests/integration/lib/require.sh (require_spes, require_venv).
. tests/integration/lib/require.sh

# require_gpu: exits 77 with the reason when this spes cannot train on a GPU here (it was
# built without CUDA, or no NVIDIA GPU is visible), and 1 with the log when the probe fails
# for any other reason (that is a bug, not a missing GPU). The probe is one training step of
# the tiny model with --device=cuda: it checks that the backend opens AND runs, not only that
# the binary was built with CUDA.
#
# SPES_GPU_TEST_DEVICE=cpu (self-check of a test's own logic on a machine without a GPU; it
# proves nothing about the GPU): the "GPU" runs use the cpu backend instead, amp precisions
# run fp32 there. Tests name the device of their GPU runs "$GPU_DEVICE".
GPU_DEVICE=${SPES_GPU_TEST_DEVICE:-cuda}
require_gpu() {
  require_spes
  if [ "$GPU_DEVICE" = cpu ]; then
    echo "SELF-CHECK: SPES_GPU_TEST_DEVICE=cpu, the GPU runs of this test use the cpu backend"
    return 0
  fi
  local probe rc=0
  probe=$(mktemp -d)
  gpu_tiny_data "$probe"
  gpu_tiny_yaml "$probe"
  "$SPES_BIN" train "$probe/tiny.yaml" --device="$GPU_DEVICE" --max_duration=1 --scheduler.name=constant --save_folder="$probe/run" \
    --save_interval_unsharded=1 >"$probe/probe.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    GPU_DESCRIPTION=$(sed -n 's/.*device: //p' "$probe/probe.log" | head -1)
    rm -rf "$probe"
    echo "GPU: ${GPU_DESCRIPTION:-cuda}"
    return 0
  fi
  local smi="nvidia-smi not found"
  if command -v nvidia-smi >/dev/null 2>&1; then
    smi="nvidia-smi: $(nvidia-smi -L 2>&1 | head -1)"
  fi
  if grep -q "built without CUDA" "$probe/probe.log"; then
    rm -rf "$probe"
    echo "SKIPPED: $SPES_BIN was built without CUDA (no nvcc at build time; $smi)"
    exit 77
  fi
  if grep -q "no NVIDIA GPU is visible" "$probe/probe.log"; then
    rm -rf "$probe"
    echo "SKIPPED: this spes has CUDA but no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-unset}'; $smi)"
    exit 77
  fi
  echo "FAILED: one training step of the tiny model on --device=cuda failed (status $rc), and not for want of a GPU:"
  cat "$probe/probe.log"
  rm -rf "$probe"
  exit 1
}

# gpu_tiny_data DIR / gpu_tiny_yaml DIR: the tiny MoE of tests/integration/lib/tiny_model.sh
# (train_resume.sh's), 6 steps of 2 micro-batches of 4, a checkpoint every step.
source "$(dirname "${BASH_SOURCE[0]}")/../../integration/lib/tiny_model.sh"
gpu_tiny_data() { tiny_tokens "$1"; }
gpu_tiny_yaml() {
  tiny_config "$1" gpu-test
  cat >> "$1/tiny.yaml" <<EOF
max_duration: 6
global_train_batch_size: 8
device_train_microbatch_size: 4
save_interval_unsharded: 1
save_num_unsharded_checkpoints_to_keep: -1
console_log_interval: 1
EOF
}

# gpu_spes_wrapper PATH DEVICE PRECISION: writes an executable PATH that runs $SPES_BIN with
# --device=DEVICE --precision=PRECISION appended to every `train` command (other commands
# unchanged). It execs, so signals and PIDs are the real binary's. Point SPES_BIN at it to run
# an existing integration script (tests/integration/*.sh) on the GPU.
gpu_spes_wrapper() {
  cat > "$1" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = train ]; then exec "$SPES_BIN" "\$@" --device=$2 --precision=$3; fi
exec "$SPES_BIN" "\$@"
EOF
  chmod +x "$1"
}

# gpu_ckpt_compare A.safetensors B.safetensors TOLERANCE [LABEL]: every float tensor of A and
# B (same names, shapes) agrees to max|a-b| <= TOLERANCE * max(max|b|, 1e-30) per tensor
# (relative to the tensor's own scale: element-wise relative error is meaningless for values
# near 0). Prints the worst tensor. Needs numpy + safetensors in the test venv.
gpu_ckpt_compare() {
  "$SPES_VENV_PY" - "$@" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
a, b, tol = load_file(sys.argv[1]), load_file(sys.argv[2]), float(sys.argv[3])
label = sys.argv[4] if len(sys.argv) > 4 else "weights"
assert a.keys() == b.keys(), f"{label}: different tensors: {sorted(set(a) ^ set(b))[:5]}"
worst, worst_name = 0.0, None
for k in sorted(a):
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    assert x.shape == y.shape, f"{label}: {k}: shapes {x.shape} vs {y.shape}"
    rel = float(np.max(np.abs(x - y))) / max(float(np.max(np.abs(y))), 1e-30) if x.size else 0.0
    if rel > worst:
        worst, worst_name = rel, k
print(f"{label}: worst per-tensor relative difference {worst:.3e} ({worst_name}), tolerance {tol:.1e}")
assert worst <= tol, f"{label}: {worst_name} differs by {worst:.3e} of its scale (> {tol:.1e})"
PY
}
