#!/usr/bin/env bash
# What `spes train` writes during a run besides its checkpoints (metrics.jsonl, the TensorBoard
# event file, the console) cannot end the run; the checkpoints come first (base/append_log.h,
# base/log_sink.h). Without root (train_log_full_disk.sh fills disks):
#   removed  save_folder is removed mid-run: the next lines are lost, counted and said once; the
#            next save recreates the folder, metrics.jsonl and the event file start anew there and
#            the console says how many lines were lost; a --resume from the recreated folder ends
#            byte-identical to an undisturbed run.
#   pipe     the console is a pipe whose reader ends (`spes train ... 2>&1 | head -1`): no SIGPIPE
#            death; the run trains to its end and saves, byte-identical.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
export SPES_NUM_THREADS=1

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 400
tiny_config "$tmp" logio
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 1200
global_train_batch_size: 16
device_train_microbatch_size: 8
save_interval_unsharded: 300
save_num_unsharded_checkpoints_to_keep: -1
console_log_interval: 100
EOF
model=(--model.d_model=128 --model.mlp_hidden_size=256)   # about 10 ms a step

fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# wait_for FILE PATTERN [PID]: until FILE has a line matching PATTERN (60 s at most).
wait_for() {
  for _ in $(seq 1 1200); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && return 1
    sleep 0.05
  done
  return 1
}
same() {   # same A B STEP: the checkpoints of STEP are the same bytes
  for f in model.safetensors train_state.safetensors; do
    cmp -s "$1/step$3/$f" "$2/step$3/$f" || bad "$2/step$3/$f differs from $1's"
  done
}
# steps DIR: the steps of DIR/metrics.jsonl's lines, each line checked to be JSON.
steps() {
  python3 -c 'import json, sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$1/metrics.jsonl"
}

"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/plain" > "$tmp/plain.log" 2>&1 ||
  { tail -5 "$tmp/plain.log"; bad "the plain run failed"; }

# removed: rm -rf save_folder after step 400's line; step 600's save recreates it.
dir=$tmp/removed/run
mkdir -p "$tmp/removed"
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$dir" --stop_at=900 > "$tmp/removed.log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for "$tmp/removed.log" "step 400/1200" "$pid" || bad "removed: never reached step 400"
rm -rf "$dir"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || { tail -5 "$tmp/removed.log"; bad "removed: exit $rc"; }
grep -q "warn\] $dir/metrics.jsonl was removed or replaced during the run; starting it anew" "$tmp/removed.log" ||
  bad "removed: no word of the removed metrics.jsonl"
grep -q "warn\] cannot write $dir/metrics.jsonl at step [45][0-9][0-9]: No such file or directory. Training goes on" "$tmp/removed.log" ||
  bad "removed: the failing metrics.jsonl was not said"
[ "$(grep -c "cannot write $dir/metrics.jsonl" "$tmp/removed.log")" = 1 ] || bad "removed: the failure was not said once"
grep -q "warn\] $dir/metrics.jsonl is written again; lost while it could not be (No such file or directory): [0-9]* lines (steps [45][0-9]*-600)" "$tmp/removed.log" ||
  bad "removed: the lost lines were not counted"
grep -q "saved $dir/step600" "$tmp/removed.log" || bad "removed: step 600 was not saved in the recreated folder"
got=$(steps "$dir") || bad "removed: metrics.jsonl is not JSON lines"
[ "$(echo "$got" | cut -d' ' -f1)" = 601 ] && [ "$(echo "$got" | wc -w)" = 300 ] ||
  bad "removed: metrics.jsonl should hold steps 601-900, holds from '$(echo "$got" | cut -d' ' -f1)' ($(echo "$got" | wc -w) lines)"
ls "$dir"/events.out.tfevents.* > /dev/null 2>&1 || bad "removed: no event file in the recreated folder"
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$dir" --resume > "$tmp/resumed.log" 2>&1 ||
  { tail -5 "$tmp/resumed.log"; bad "removed: the resume failed"; }
grep -q "resumed from $dir/step900" "$tmp/resumed.log" || bad "removed: did not resume from step 900"
same "$tmp/plain" "$dir" 1200

# pipe: the console's reader ends after one line.
set +o pipefail
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/pipe" 2>&1 | head -1 > "$tmp/pipe.head"
rc=${PIPESTATUS[0]}
set -o pipefail
[ "$rc" = 0 ] || bad "pipe: spes train exit $rc with its console's reader gone (141: SIGPIPE)"
[ -s "$tmp/pipe.head" ] || bad "pipe: no first line"
same "$tmp/plain" "$tmp/pipe" 1200
[ "$(steps "$tmp/pipe" | wc -w)" = 1200 ] || bad "pipe: metrics.jsonl does not hold the 1200 steps"

[ "$fail" = 0 ] || exit 1
echo "train_log_io: OK"
