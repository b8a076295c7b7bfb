#!/usr/bin/env bash
# scheduler.units tokens reaches the trainer as OLMo's train.py reads it: the scheduler gets the
# tokens seen (this step's batch counted) over the run's max tokens, and t_warmup, t_max and
# grad_clip_warmup_steps count tokens. With 256 tokens a step (8 x 32), a run in tokens whose
# lengths are the steps run's times 256 is that run, bit for bit and lr for lr, whether
# max_duration is in steps or in tokens; the same numbers read as tokens give another run. A run
# in tokens split by a resume is the uninterrupted one (tokens_seen comes back with the checkpoint).
set -euo pipefail
cd "$(dirname "$0")/../.."
SPES_BIN=${SPES_BIN:-$PWD/build/spes}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2   # fixed thread count: same reduction order in every run

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" schedule-units-test
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 6
global_train_batch_size: 8
device_train_microbatch_size: 8
save_interval_unsharded: 1000
console_log_interval: 1
EOF
# tiny.yaml warms up over 2 steps and clips at 0.5; a clipping warm-up of 2 steps at 0.02 too.
steps=(--scheduler.grad_clip_warmup_steps=2 --scheduler.grad_clip_warmup_factor=0.02)
tokens=(--scheduler.units=tokens --scheduler.t_warmup=512 --scheduler.grad_clip_warmup_steps=512
        --scheduler.grad_clip_warmup_factor=0.02)
literal=(--scheduler.units=tokens "${steps[@]}")

run() { local log=$1; shift; "$SPES_BIN" train "$tmp/tiny.yaml" "$@" > "$tmp/$log" 2>&1 || { cat "$tmp/$log"; exit 1; }; }
lrs() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["lr"]) for l in open(sys.argv[1]) if "\"lr\"" in l))' "$1"; }
same() {   # same DIR_A DIR_B WHAT: step6's weights and moments, and every step's lr
  for f in model.safetensors train_state.safetensors; do
    cmp "$tmp/$1/step6/$f" "$tmp/$2/step6/$f" || { echo "step6/$f: $3"; exit 1; }
  done
  [ "$(lrs "$tmp/$1/metrics.jsonl")" = "$(lrs "$tmp/$2/metrics.jsonl")" ] || { echo "lr: $3"; exit 1; }
}

run steps.log --save_folder="$tmp/steps" "${steps[@]}"
run tokens.log --save_folder="$tmp/tokens" "${tokens[@]}"
run tokens_t.log --save_folder="$tmp/tokens_t" "${tokens[@]}" --max_duration=1536T
run literal.log --save_folder="$tmp/literal" "${literal[@]}"
run split1.log --save_folder="$tmp/split" "${tokens[@]}" --stop_at=3
run split2.log --save_folder="$tmp/split" "${tokens[@]}" --resume

[ "$(lrs "$tmp/steps/metrics.jsonl" | wc -w)" = 6 ] || { echo "metrics.jsonl: expected 6 steps' lr"; exit 1; }
same steps tokens "units tokens with lengths x 256 tokens a step differs from the run in steps"
same steps tokens_t "units tokens over max_duration 1536T differs from the run in steps"
same tokens split "a run in tokens split at step 3 by a resume differs from the uninterrupted one"
if [ "$(lrs "$tmp/literal/metrics.jsonl")" = "$(lrs "$tmp/steps/metrics.jsonl")" ] ||
   cmp -s "$tmp/literal/step6/model.safetensors" "$tmp/steps/step6/model.safetensors"; then
  echo "t_warmup 2 read as tokens changed nothing: the schedule still counts steps"; exit 1
fi
echo "scheduler.units tokens: the steps run in tokens (max_duration in steps or tokens), bit-exact across a resume"
