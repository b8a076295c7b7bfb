#!/usr/bin/env bash
# A save that meets a full disk does not end the run (train/save_failure.h), on small tmpfs mounts
# filled by a filler file:
#   mid    a save_interval save fails (the error names the path, No space left on device, the
#          checkpoint's size and the free space): training goes on, the console says which step
#          the newest checkpoint is, no .tmp is left; the filler is deleted and the next interval's
#          save works; the run ends byte-identical to one on a roomy disk. Also with 2 ranks.
#   final  the final save fails and is retried (--save_retry); the filler is deleted and a retry
#          writes it, byte-identical to the roomy run's.
#   lost   the final save stays unwritten past --save_retry (3 attempts in 2.5 s): exit 1 naming the steps lost; the
#          older checkpoint is intact.
#   stop   a SIGUSR1 save that fails waits to retry; SIGTERM ends that wait, the stop's own (final)
#          save fails and waits, a second SIGTERM ends it: exit 1 at once, saying nothing was saved.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
. tests/integration/lib/tmpfs_disk.sh
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  tmpfs_unmount_all
  rm -rf "$tmp"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
export SPES_NUM_THREADS=1

# disk NAME: a 40 MB tmpfs at $tmp/NAME (root only: skipped without it).
disk() { tmpfs_disk "$1" 40m; }
# fill NAME BYTES: a filler file leaves BYTES free on the disk.
fill() {
  local avail
  avail=$(df -B1 --output=avail "$tmp/$1" | tail -1)
  head -c $((avail - $2)) /dev/zero > "$tmp/$1/filler"
}

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 400
tiny_config "$tmp" fulldisk
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 1200
global_train_batch_size: 16
device_train_microbatch_size: 8
save_interval_unsharded: 300
save_num_unsharded_checkpoints_to_keep: -1
console_log_interval: 100
EOF
# A checkpoint of 6.5 MB against 0.8 MB of metrics over the run; about 10 ms a step, 300 steps
# between saves: the window in which `mid` deletes its filler.
model=(--model.d_model=128 --model.mlp_hidden_size=256)

fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# wait_for FILE PATTERN [COUNT] [PID]: until FILE has COUNT lines matching PATTERN (60 s at most).
wait_for() {
  for _ in $(seq 1 1200); do
    [ "$(grep -c -- "$2" "$1" 2>/dev/null || true)" -ge "${3:-1}" ] && return 0
    [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && return 1
    sleep 0.05
  done
  return 1
}
same() {   # same A B STEP: the checkpoints of STEP are the same bytes
  for f in model.safetensors train_state.safetensors; do
    cmp -s "$1/step$3/$f" "$2/step$3/$f" || bad "$(basename "$2")'s step$3/$f differs from $(basename "$1")'s"
  done
}
no_tmp() { ! ls -d "$1"/step*.tmp > /dev/null 2>&1 || bad "$1: a partial checkpoint was left: $(ls -d "$1"/step*.tmp)"; }

"$SPES_BIN" plan "$tmp/tiny.yaml" "${model[@]}" --json > "$tmp/plan.json" 2> "$tmp/plan.log" || { cat "$tmp/plan.log"; exit 1; }
each=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checkpoint"]["bytes"])' "$tmp/plan.json")
room=$((each * 3 / 2 + 1500000))   # one checkpoint and the metrics fit, a second does not
echo "a checkpoint takes $each bytes; the filled disks keep $room free"

# The undisturbed runs.
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/plain" > "$tmp/plain.log" 2>&1 ||
  { tail -5 "$tmp/plain.log"; bad "the plain run failed"; }
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/plain600" --stop_at=600 > "$tmp/plain600.log" 2>&1 ||
  { tail -5 "$tmp/plain600.log"; bad "the plain run to step 600 failed"; }

# mid RANKS: step 600's save fails; the filler goes; 900 and 1200 are saved.
mid() {
  local name=mid$1 extra=()
  [ "$1" -gt 1 ] && extra=(--nproc_per_node "$1")
  disk "$name"
  fill "$name" "$room"
  local dir=$tmp/$name/run log=$tmp/$name.log
  "$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$dir" "${extra[@]}" > "$log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_for "$log" "could not save step 600" 1 "$pid" || bad "$name: no failed save of step 600"
  rm -f "$tmp/$name/filler"
  local rc=0
  timeout 120 tail --pid="$pid" -f /dev/null || bad "$name: the run did not end (a rank waiting alone?)"
  wait "$pid" || rc=$?
  [ "$rc" = 0 ] || { tail -5 "$log"; bad "$name: exit $rc after a failed save"; }
  grep -q "error\] could not save step 600: saving checkpoint step 600 in $dir: .*$dir/step600.tmp/.*: No space left on device (a checkpoint takes [0-9.]* MB, and the filesystem of $dir has [0-9.]* [kM]B free). Training on; the next save, at step 900, tries again. Newest checkpoint: step 300" "$log" ||
    { grep "could not save" "$log" || true; bad "$name: the failed save's message"; }
  grep -q "step 700/1200 .* | UNSAVED since step 300 (save of 600 failed)" "$log" || bad "$name: the console did not say what is unsaved"
  grep -q "step 1000/1200 .*UNSAVED" "$log" && bad "$name: still UNSAVED after step 900's save"
  [ -d "$dir/step600" ] && bad "$name: step600 exists"
  for s in 300 900 1200; do [ -d "$dir/step$s" ] || bad "$name: no step$s"; done
  no_tmp "$dir"
  echo "$name: checkpoints $(cd "$dir" && ls -d step* | tr '\n' ' ')"
}
mid 1
same "$tmp/plain" "$tmp/mid1/run" 300
same "$tmp/plain" "$tmp/mid1/run" 1200

# final: the final save (stop_at 600) fails, waits, and is written once the filler goes.
disk final
fill final "$room"
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/final/run" --stop_at=600 --save_retry=60,1 \
  > "$tmp/final.log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for "$tmp/final.log" "could not save step 600: .*Retrying in 1s, for up to 60s more (--save_retry)" 1 "$pid" ||
  bad "final: the final save did not wait to retry"
rm -f "$tmp/final/filler"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || { tail -5 "$tmp/final.log"; bad "final: exit $rc"; }
same "$tmp/plain600" "$tmp/final/run" 600
no_tmp "$tmp/final/run"

# lost: nobody frees space: attempts at 0, 1 and 2 s (a fourth would start after 2.5 s), then exit 1 naming what is lost.
disk lost
fill lost "$room"
rc=0
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/lost/run" --stop_at=600 --save_retry=2.5,1 \
  > "$tmp/lost.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || bad "lost: exit $rc, not 1"
[ "$(grep -c "could not save step 600" "$tmp/lost.log")" = 3 ] || bad "lost: not 3 attempts"
grep -q "^spes: the final checkpoint, step 600, was not saved (out of retries (--save_retry); the last attempt: saving checkpoint step 600 in $tmp/lost/run: .*No space left on device): steps 301-600 are lost; the newest checkpoint is step 300 in $tmp/lost/run" "$tmp/lost.log" ||
  { tail -3 "$tmp/lost.log"; bad "lost: the final error"; }
same "$tmp/plain" "$tmp/lost/run" 300
no_tmp "$tmp/lost/run"

# stop: no checkpoint fits. SIGUSR1's save fails and waits (30 s); SIGTERM ends the wait; the
# stop's final save fails and waits; a second SIGTERM ends that: exit 1, well before 30 s.
disk stop
fill stop $((each / 2 + 1500000))
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/stop/run" > "$tmp/stop.log" 2>&1 &
pid=$!
pids+=("$pid")
start=$SECONDS
wait_for "$tmp/stop.log" "step 100/1200" 1 "$pid" || bad "stop: never reached step 100"
kill -USR1 "$pid"
wait_for "$tmp/stop.log" "Retrying in 30s" 1 "$pid" || bad "stop: the requested save did not wait to retry"
kill -TERM "$pid"
wait_for "$tmp/stop.log" "Retrying in 30s" 2 "$pid" || bad "stop: the stop's save did not wait to retry"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 1 ] || bad "stop: exit $rc, not 1"
[ $((SECONDS - start)) -lt 30 ] || bad "stop: a signal did not end a wait"
grep -q "stop signal: no more retries of the save of step" "$tmp/stop.log" || bad "stop: the first wait was not ended by SIGTERM"
grep -q "^spes: the final checkpoint, step [0-9]*, was not saved (stopped while waiting to retry; .*): the run's training is lost; no checkpoint of it exists in $tmp/stop/run" "$tmp/stop.log" ||
  { tail -3 "$tmp/stop.log"; bad "stop: the final error"; }
no_tmp "$tmp/stop/run"

if command -v mpirun > /dev/null; then
  [ -n "${SPES_ASAN:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # as require_mpirun
  "$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/plain2" --nproc_per_node 2 > "$tmp/plain2.log" 2>&1 ||
    { tail -5 "$tmp/plain2.log"; bad "the plain 2-rank run failed"; }
  mid 2
  same "$tmp/plain2" "$tmp/mid2/run" 1200
else
  echo "(mpirun not found: the 2-rank case not run)"
fi

[ "$fail" = 0 ] || exit 1
echo "train_save_full_disk: OK"
