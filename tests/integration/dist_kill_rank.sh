#!/usr/bin/env bash
# A rank that dies ends the whole job with an error inside a bounded time (no hang in a
# collective), and the job resumes from its last checkpoint. 2 ranks train a long run, saving
# every 5 steps; rank 1 is killed with SIGKILL mid-run; the launcher must exit non-zero within
# 60 s naming the dead rank, and `--resume` with 2 ranks continues from the newest checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
tmp=$(mktemp -d)
job=""
trap '[ -n "$job" ] && kill -9 $job 2>/dev/null; rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"

"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run" --nproc_per_node 2 --max_duration=100000 \
  --save_interval_unsharded=5 --save_num_unsharded_checkpoints_to_keep=2 >"$tmp/run.log" 2>&1 &
job=$!   # spes execs mpirun: this pid is mpirun, the ranks are its children
for _ in $(seq 1 600); do
  grep -q "saved $tmp/run/step10 " "$tmp/run.log" && break
  kill -0 $job 2>/dev/null || { echo "FAIL: the job ended early"; cat "$tmp/run.log"; exit 1; }
  sleep 0.1
done
grep -q "saved $tmp/run/step10 " "$tmp/run.log" || { echo "FAIL: no step10 checkpoint after 60 s"; tail "$tmp/run.log"; exit 1; }
ranks=$(pgrep -P $job -f "spes train" || true)
[ "$(echo "$ranks" | wc -w)" = 2 ] || { echo "FAIL: expected 2 rank processes under mpirun, got '$ranks'"; ps -ef --forest | tail -20; exit 1; }
victim=$(echo "$ranks" | tail -1)
start=$(date +%s)
kill -9 "$victim"
rc=0
for _ in $(seq 1 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then echo "FAIL: the job still runs 60 s after a rank died"; exit 1; fi
wait $job || rc=$?
job=""
took=$(( $(date +%s) - start ))
echo "job ended with status $rc, $took s after the kill"
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 after a rank died"; exit 1; }
grep -Eiq "exited on signal 9|killed" "$tmp/run.log" || { echo "FAIL: no message naming the dead rank"; tail -30 "$tmp/run.log"; exit 1; }
grep -Ei "signal 9|killed" "$tmp/run.log" | head -3
# nothing of the job is left behind
sleep 1
if pgrep -f "save_folder=$tmp/run" >/dev/null; then echo "FAIL: rank processes left running"; exit 1; fi

# Resume from the newest complete checkpoint, with 2 ranks again, for 5 more steps.
last=$(cd "$tmp/run" && ls -d step* | grep -v "\.tmp$" | sed "s/^step//" | sort -n | tail -1)
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run" --nproc_per_node 2 --max_duration=100000 \
  --stop_at=$((last + 5)) --resume >"$tmp/resume.log" 2>&1 || { echo "FAIL: resume"; tail -30 "$tmp/resume.log"; exit 1; }
grep -q "resumed from $tmp/run/step$last" "$tmp/resume.log" || { echo "FAIL: did not resume from step$last"; tail "$tmp/resume.log"; exit 1; }
[ -d "$tmp/run/step$((last + 5))" ] || { echo "FAIL: no step$((last + 5)) after the resume"; exit 1; }
echo "dist_kill_rank: OK (resumed at step $last)"
