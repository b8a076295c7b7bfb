#!/usr/bin/env bash
# The clipping warm-up (scheduler.grad_clip_warmup_steps / grad_clip_warmup_factor) reaches the
# trainer as OLMo's train_step applies it: step 1 clips at max_grad_norm, steps 2..W+1 at
# max_grad_norm * factor, later ones at max_grad_norm again (the groups' max_grad_norm is set
# after the clipping). Checked as one run with the warm-up against a run split where the
# threshold changes (stop_at + resume with max_grad_norm overridden): the same weights and
# moments, bit for bit. A run without the warm-up must end elsewhere (the clipping bites).
set -euo pipefail
cd "$(dirname "$0")/../.."
SPES_BIN=${SPES_BIN:-$PWD/build/spes}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2   # fixed thread count: same reduction order in every run

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" clip-warmup-test
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 6
global_train_batch_size: 8
device_train_microbatch_size: 8
save_interval_unsharded: 1000
console_log_interval: 1
EOF
# tiny.yaml clips at max_grad_norm 0.5; the warm-up: steps 2..4 at 0.5 * 0.02 = 0.01.
warm=(--scheduler.grad_clip_warmup_steps=3 --scheduler.grad_clip_warmup_factor=0.02)

run() { local log=$1; shift; "$SPES_BIN" train "$tmp/tiny.yaml" "$@" > "$tmp/$log" 2>&1 || { cat "$tmp/$log"; exit 1; }; }

run warm.log --save_folder="$tmp/warm" "${warm[@]}"
run plain.log --save_folder="$tmp/plain"
run split1.log --save_folder="$tmp/split" --stop_at=1
run split2.log --save_folder="$tmp/split" --resume --force-resume --max_grad_norm=0.01 --stop_at=4
run split3.log --save_folder="$tmp/split" --resume --force-resume

for f in model.safetensors train_state.safetensors; do
  cmp "$tmp/warm/step6/$f" "$tmp/split/step6/$f" ||
    { echo "step6/$f: the clipping warm-up is not max_grad_norm 0.5 at step 1, 0.01 at steps 2-4, 0.5 after"; exit 1; }
done
if cmp -s "$tmp/warm/step6/model.safetensors" "$tmp/plain/step6/model.safetensors"; then
  echo "the clipping warm-up changed nothing: the test's gradients never exceed its thresholds"; exit 1
fi
echo "clipping warm-up: step 1 at max_grad_norm, steps 2-4 at max_grad_norm * factor, bit-exact with the split run"
