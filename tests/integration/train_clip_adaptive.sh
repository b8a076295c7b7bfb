#!/usr/bin/env bash
# max_grad_norm_ratio, OLMo's adaptive clipping (src/train/clip_adaptive.h), through the real
# trainer on the tiny MoE (2 micro-batches a step):
#   - against tests/ref/clip_adaptive_ref.py, OLMo's _do_adaptive_clipping transcribed in numpy,
#     fed each step's gradient before clipping (SPES_CLIP_DUMP_GRADS): the checkpointed
#     grad_norm_exp_avg of every step (none after step 1) and the clip factor each tensor's
#     AdamW moment shows; the ratio clips some tensors and not others; again with the clipping
#     warm-up (scheduler.grad_clip_warmup_steps / _factor multiply the ratio);
#   - resume is bit-exact: 6 steps straight vs stops after step 1 (no averages saved yet) and 3;
#     also with optimizer.overlap_next_forward, and with amp_fp16 loss scaling (cpu: fp32
#     arithmetic, power-of-two scales, so the same bytes);
#   - a checkpoint without averages (a run without the key) resumes with it as OLMo's would
#     (averages started at the next step), checked against the reference;
#   - the ratio bites (the run differs from one with max_grad_norm alone), and the key enters
#     the config hash only when set.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2   # fixed thread count: same reduction order in every run

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" clip-adaptive-test
cat >> "$tmp/tiny.yaml" <<YAML
max_duration: 6
global_train_batch_size: 8
device_train_microbatch_size: 4
save_interval_unsharded: 1
save_num_unsharded_checkpoints_to_keep: -1
console_log_interval: 1
YAML
ratio=1.05
run() { local log=$1; shift; "$SPES_BIN" train "$tmp/tiny.yaml" "$@" > "$tmp/$log" 2>&1 || { cat "$tmp/$log"; exit 1; }; }
same() {   # same A B WHAT [FILES]: the step6 files of two runs are equal byte for byte
  for f in ${4:-model.safetensors train_state.safetensors train_state.json}; do
    cmp "$tmp/$1/step6/$f" "$tmp/$2/step6/$f" || { echo "FAIL: step6/$f differs $3"; exit 1; }
  done
}
have_ref() { [ -x "${SPES_VENV_PY:-}" ]; }   # the reference needs numpy and safetensors

mkdir -p "$tmp/grads" "$tmp/wgrads" "$tmp/ograds"
SPES_CLIP_DUMP_GRADS="$tmp/grads" run ref.log --save_folder="$tmp/straight" --max_grad_norm_ratio=$ratio
grep -q "adaptive clipping, each tensor to $ratio" "$tmp/ref.log" || { echo "FAIL: no adaptive clipping line"; exit 1; }
grep -q "max_grad_norm: ignored: max_grad_norm_ratio is set" "$tmp/ref.log" ||
  { echo "FAIL: no warning that max_grad_norm is ignored"; exit 1; }
if grep -aq "grad_norm_exp_avg" "$tmp/straight/step1/train_state.safetensors"; then
  echo "FAIL: step1's checkpoint holds norm averages (OLMo's state has none before step 2)"; exit 1
fi
grep -aq "grad_norm_exp_avg" "$tmp/straight/step2/train_state.safetensors" || { echo "FAIL: step2 holds no norm averages"; exit 1; }
if have_ref; then
  "$SPES_VENV_PY" tests/ref/clip_adaptive_ref.py "$tmp/straight" "$tmp/grads" 6 $ratio 0.9 0.95
  warm=(--scheduler.grad_clip_warmup_steps=3 --scheduler.grad_clip_warmup_factor=0.9)
  SPES_CLIP_DUMP_GRADS="$tmp/wgrads" run warm.log --save_folder="$tmp/warm" --max_grad_norm_ratio=$ratio "${warm[@]}"
  "$SPES_VENV_PY" tests/ref/clip_adaptive_ref.py "$tmp/warm" "$tmp/wgrads" 6 $ratio 0.9 0.95 --warmup 3 0.9
else
  echo "(reference checks skipped: no test virtualenv; run tests/setup_venv.sh)"
fi

# Resume: stop after step 1 (averages not kept yet) and after step 3: the same bytes as straight.
run split1.log --save_folder="$tmp/split" --max_grad_norm_ratio=$ratio --stop_at=1
run split2.log --save_folder="$tmp/split" --max_grad_norm_ratio=$ratio --stop_at=3 --resume
run split3.log --save_folder="$tmp/split" --max_grad_norm_ratio=$ratio --resume
grep -q "resumed from .*step3" "$tmp/split3.log" || { echo "FAIL: did not resume from step3"; cat "$tmp/split3.log"; exit 1; }
same straight split "after stops at steps 1 and 3 and resumes"
# optimizer.overlap_next_forward: the factors applied part by part under the next forward
run overlap.log --save_folder="$tmp/overlap" --max_grad_norm_ratio=$ratio --optimizer.overlap_next_forward=true
grep -q "AdamW runs under the next step's forward" "$tmp/overlap.log" || { echo "FAIL: overlap not on"; exit 1; }
same straight overlap "with optimizer.overlap_next_forward"
# amp_fp16: the norms of the unscaled gradients (power-of-two scales: exact on the cpu)
run fp16.log --save_folder="$tmp/fp16" --max_grad_norm_ratio=$ratio --precision=amp_fp16
grep -q "amp_fp16 dynamic loss scaling" "$tmp/fp16.log" || { echo "FAIL: no loss scaling"; exit 1; }
same straight fp16 "with amp_fp16 loss scaling" "model.safetensors train_state.safetensors"
echo "resume (after steps 1 and 3), overlap_next_forward and amp_fp16: the same bytes as the straight run"

# The ratio bites: the run with max_grad_norm alone ends elsewhere.
run plain.log --save_folder="$tmp/plain"
if cmp -s "$tmp/straight/step6/model.safetensors" "$tmp/plain/step6/model.safetensors"; then
  echo "FAIL: max_grad_norm_ratio changed nothing"; exit 1
fi
# Turning the key on is a config change (hashed when set; a config without it keeps its hash).
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/plain" --resume --max_grad_norm_ratio=$ratio \
    --max_duration=8 > "$tmp/change.log" 2>&1; then
  echo "FAIL: resumed with max_grad_norm_ratio turned on without --force-resume"; exit 1
fi
grep -q "changed: .*max_grad_norm_ratio" "$tmp/change.log" || { echo "FAIL: the change is not named"; cat "$tmp/change.log"; exit 1; }

# A checkpoint without averages (its run had no adaptive clipping) resumed with the key: the
# averages start at the next step, as OLMo's state would (checked against the reference).
run old1.log --save_folder="$tmp/old" --stop_at=3
SPES_CLIP_DUMP_GRADS="$tmp/ograds" run old2.log --save_folder="$tmp/old" --resume --force-resume --max_grad_norm_ratio=$ratio
grep -aq "grad_norm_exp_avg" "$tmp/old/step4/train_state.safetensors" || { echo "FAIL: step4 holds no norm averages"; exit 1; }
if have_ref; then "$SPES_VENV_PY" tests/ref/clip_adaptive_ref.py "$tmp/old" "$tmp/ograds" 6 $ratio 0.9 0.95 --from 4; fi
echo "max_grad_norm_ratio: OLMo's adaptive clipping, resumed bit-exactly"
