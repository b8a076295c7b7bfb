#!/usr/bin/env bash
# What `spes train` writes besides its checkpoints cannot end the run on a full or read-only
# disk (base/append_log.h, base/log_sink.h); on small tmpfs mounts (root only: skipped without):
#   metrics   save_folder's disk fills up mid-run: metrics.jsonl and the event file lose their
#             lines (said once, with the path and "No space left on device"), step 600's save fails
#             and training goes on; the filler is deleted, step 900's save works, and the console
#             says how many lines were lost. Both files hold whole lines/records only (no torn
#             one), the run ends byte-identical to one on a roomy disk.
#   console   stderr is a file on a full disk: the run goes on; once there is room the console says
#             how many log lines it lost.
#   readonly  save_folder is made read-only mid-run (a read-only bind mount over it): step 600's
#             save fails naming "Read-only file system", training goes on; the mount goes, step
#             900's save works, byte-identical.
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
# fill NAME: a filler file takes every free byte of the disk.
fill() { cat /dev/zero > "$tmp/$1/filler" 2>/dev/null || true; }

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 400
tiny_config "$tmp" logdisk
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 1200
global_train_batch_size: 16
device_train_microbatch_size: 8
save_interval_unsharded: 300
save_num_unsharded_checkpoints_to_keep: -1
console_log_interval: 100
EOF
model=(--model.d_model=128 --model.mlp_hidden_size=256)   # about 10 ms a step, 300 between saves

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
finish() {   # finish PID NAME LOG: the run ends with exit 0
  local rc=0
  wait "$1" || rc=$?
  [ "$rc" = 0 ] || { tail -5 "$3"; bad "$2: exit $rc"; }
}

"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/plain" > "$tmp/plain.log" 2>&1 ||
  { tail -5 "$tmp/plain.log"; bad "the plain run failed"; }

# metrics: the disk fills after step 400's line; the filler goes after step 600's failed save.
disk metrics
dir=$tmp/metrics/run
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$dir" > "$tmp/metrics.log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for "$tmp/metrics.log" "step 400/1200" "$pid" || bad "metrics: never reached step 400"
fill metrics
wait_for "$tmp/metrics.log" "could not save step 600" "$pid" || bad "metrics: step 600's save did not fail"
rm -f "$tmp/metrics/filler"
finish "$pid" metrics "$tmp/metrics.log"
for f in metrics.jsonl "events.out.tfevents.[^ ]*"; do
  grep -q "warn\] cannot write $dir/$f at step [4-6][0-9][0-9]: No space left on device. Training goes on" "$tmp/metrics.log" ||
    bad "metrics: no warning of the full disk under $f"
  [ "$(grep -c "cannot write $dir/$f" "$tmp/metrics.log")" = 1 ] || bad "metrics: the failure of $f was not said once"
done
grep -q "warn\] $dir/metrics.jsonl is written again; lost while it could not be (No space left on device): [0-9]* lines (steps [4-6][0-9]*-[6-9][0-9]*)" "$tmp/metrics.log" ||
  bad "metrics: the lost lines were not counted"
grep -q "saved $dir/step900" "$tmp/metrics.log" || bad "metrics: step 900 was not saved"
same "$tmp/plain" "$dir" 1200
python3 - "$dir" "$tmp/metrics.log" <<'EOF' || bad "metrics: the files after the full disk"
import glob, json, re, struct, sys
d, log = sys.argv[1], open(sys.argv[2]).read()
steps = [json.loads(l)["step"] for l in open(d + "/metrics.jsonl")]   # whole JSON lines only
lost = int(re.search(r"metrics.jsonl is written again; lost .*: (\d+) lines", log).group(1))
assert len(steps) + lost == 1200 and steps == sorted(set(steps)) and steps[-1] == 1200, (len(steps), lost)
(events,) = glob.glob(d + "/events.out.tfevents.*")
data, at, records = open(events, "rb").read(), 0, 0
while at < len(data):   # TFRecord framing: whole records to the end of the file
    (n,) = struct.unpack_from("<Q", data, at)
    at += 12 + n + 4
    records += 1
assert at == len(data), "a torn record"
# file_version + one a step, less those the event file says it lost: each log loses on its own
# (a full tmpfs still takes a write into a file's last page, so a short record can fit where a
# longer line did not), and each counts exactly what it lost.
m = re.search(r"events\.out\.tfevents\.[^ ]* is written again; lost .*: (\d+) records?", log)
events_lost = int(m.group(1)) if m else 0
assert records == 1 + 1200 - events_lost, (records, events_lost)
print(f"metrics: {len(steps)} lines and {records} records kept, {lost} lines and {events_lost} records lost")
EOF

# console: stderr on a full disk; the filler goes once step 600 is saved (a line every 10 steps:
# tmpfs takes them into the log's last page first).
disk console
disk console_save
touch "$tmp/console/log"
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$tmp/console_save/run" --console_log_interval=10 \
  > "$tmp/console/log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for "$tmp/console/log" "step 100/1200" "$pid" || bad "console: never reached step 100"
fill console
for _ in $(seq 1 1200); do [ -d "$tmp/console_save/run/step600" ] && break; sleep 0.05; done
rm -f "$tmp/console/filler"
finish "$pid" console "$tmp/console/log"
grep -q "warn\] stderr is written again; lost while it could not be (No space left on device): [0-9]* log lines" "$tmp/console/log" ||
  bad "console: the lost log lines were not said"
same "$tmp/plain" "$tmp/console_save/run" 1200

# readonly: a read-only bind mount over save_folder from step 400's line to step 600's failed save.
disk readonly
dir=$tmp/readonly/run
"$SPES_BIN" train "$tmp/tiny.yaml" "${model[@]}" --save_folder="$dir" > "$tmp/readonly.log" 2>&1 &
pid=$!
pids+=("$pid")
wait_for "$tmp/readonly.log" "step 400/1200" "$pid" || bad "readonly: never reached step 400"
if mount --bind "$dir" "$dir" && mounted+=("$dir") && mount -o remount,bind,ro "$dir"; then
  wait_for "$tmp/readonly.log" "could not save step 600" "$pid" || bad "readonly: step 600's save did not fail"
  umount "$dir"
  finish "$pid" readonly "$tmp/readonly.log"
  grep -q "could not save step 600: .*Read-only file system.* Training on; the next save, at step 900, tries again" "$tmp/readonly.log" ||
    bad "readonly: the failed save's message"
  grep -q "saved $dir/step900" "$tmp/readonly.log" || bad "readonly: step 900 was not saved"
  [ -d "$dir/step600" ] && bad "readonly: step600 exists"
  ls -d "$dir"/step*.tmp > /dev/null 2>&1 && bad "readonly: a partial checkpoint was left"
  same "$tmp/plain" "$dir" 1200
  [ "$(wc -l < "$dir/metrics.jsonl")" = 1200 ] || bad "readonly: metrics.jsonl lost lines"
else
  echo "(no read-only bind mount here: the readonly case not run)"
  finish "$pid" readonly "$tmp/readonly.log"
fi

[ "$fail" = 0 ] || exit 1
echo "train_log_full_disk: OK"
