#!/usr/bin/env bash
# amp_fp16's dynamic loss scaling, through the real trainer (on the cpu backend, where the
# arithmetic stays fp32): scaling by a power of two is exact, so a run with the scaler trains
# the same bytes as one without; a forced gradient overflow (SPES_FORCE_GRAD_OVERFLOW_STEP)
# skips that step's update, halves the scale, and training carries on; without a scaler (fp32)
# the run stops at that step, before the update. Also: a bad precision
# or device value is refused naming the key, and device: cuda without CUDA or a GPU says why,
# before it opens the data.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" loss-scale-test
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 5
global_train_batch_size: 8
device_train_microbatch_size: 4
save_interval_unsharded: 1
EOF
S=$SPES_BIN
$S train "$tmp/tiny.yaml" --save_folder="$tmp/fp32" > "$tmp/fp32.log" 2>&1
$S train "$tmp/tiny.yaml" --save_folder="$tmp/fp16" --precision=amp_fp16 > "$tmp/fp16.log" 2>&1
cmp "$tmp/fp32/step5/model.safetensors" "$tmp/fp16/step5/model.safetensors"
cmp "$tmp/fp32/step5/train_state.safetensors" "$tmp/fp16/step5/train_state.safetensors"
grep -q "scale 65536" "$tmp/fp16.log" || { echo "console shows no loss scale"; cat "$tmp/fp16.log"; exit 1; }
echo "ok: amp_fp16 loss scaling on fp32 arithmetic trains the same bytes as fp32"

SPES_FORCE_GRAD_OVERFLOW_STEP=3 $S train "$tmp/tiny.yaml" --save_folder="$tmp/ovf" --precision=amp_fp16 > "$tmp/ovf.log" 2>&1
grep -q "step 3: gradient overflow in fp16; step skipped, loss scale now 32768" "$tmp/ovf.log" ||
  { echo "no skip message"; cat "$tmp/ovf.log"; exit 1; }
# The skipped step leaves the weights as they were; the steps after it train again.
cmp "$tmp/ovf/step2/model.safetensors" "$tmp/ovf/step3/model.safetensors"
if cmp -s "$tmp/ovf/step3/model.safetensors" "$tmp/ovf/step4/model.safetensors"; then
  echo "step 4 did not update the weights after the skipped step"; exit 1
fi
grep -q '"step":3,.*"loss_scale":32768,"step_skipped":true' "$tmp/ovf/metrics.jsonl" ||
  { echo "metrics.jsonl lacks the skipped step"; cat "$tmp/ovf/metrics.jsonl"; exit 1; }
grep -q '"loss_scale": 32768' "$tmp/ovf/step5/train_state.json" ||
  { echo "the checkpoint lacks the loss scale"; cat "$tmp/ovf/step5/train_state.json"; exit 1; }
if grep -q loss_scale "$tmp/fp32/step5/train_state.json"; then echo "fp32 checkpoint has a loss scale"; exit 1; fi
$S train "$tmp/tiny.yaml" --save_folder="$tmp/ovf" --precision=amp_fp16 --max_duration=6 --resume > "$tmp/res.log" 2>&1
grep -q "step 6/6 .*scale 32768" "$tmp/res.log" || { echo "resume lost the loss scale"; cat "$tmp/res.log"; exit 1; }
echo "ok: a forced overflow skips the update, halves the scale, training recovers, the scale survives resume"

# Without a loss scaler (fp32) an overflowed gradient would make every weight NaN: the run
# stops before the update, with the reason, and its checkpoints stay those of a clean run.
if SPES_FORCE_GRAD_OVERFLOW_STEP=3 $S train "$tmp/tiny.yaml" --save_folder="$tmp/ovf32" > "$tmp/ovf32.log" 2>&1; then
  echo "fp32 trained on through a non-finite gradient norm"; exit 1
fi
grep -q "step 3: the gradient norm is inf with a finite loss" "$tmp/ovf32.log" ||
  { echo "no gradient norm message"; cat "$tmp/ovf32.log"; exit 1; }
[ ! -e "$tmp/ovf32/step3" ] || { echo "a checkpoint was written for the failed step"; exit 1; }
cmp "$tmp/fp32/step2/model.safetensors" "$tmp/ovf32/step2/model.safetensors"
echo "ok: fp32 stops at a non-finite gradient norm before the update"

if $S train "$tmp/tiny.yaml" --save_folder="$tmp/bad" --precision=bf16 > "$tmp/bad.log" 2>&1; then
  echo "precision bf16 was accepted"; exit 1; fi
grep -q "precision" "$tmp/bad.log" && grep -q "amp_bf16" "$tmp/bad.log"
# A missing GPU is said first, before the data are opened (here: data that do not exist).
if ! $S version | grep -q "cuda(" || ! "${SPES_BUILD:-build}/tests-gpu/gpu_count" 2>/dev/null | grep -qv '^0$'; then
  if $S train "$tmp/tiny.yaml" --save_folder="$tmp/cuda" --device=cuda --data.paths="[$tmp/missing.npy]" > "$tmp/cuda.log" 2>&1; then
    echo "device cuda was accepted without CUDA or a GPU"; exit 1; fi
  grep -q "built without CUDA\|no NVIDIA GPU is visible" "$tmp/cuda.log" || { cat "$tmp/cuda.log"; exit 1; }
fi
echo "ok: bad precision/device values refused with the reason"
