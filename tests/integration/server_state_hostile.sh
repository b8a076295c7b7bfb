#!/usr/bin/env bash
# A server's state dir damaged or hand-edited between two runs, run by the real binaries: a real
# `spes server --state_dir` and 4 tiny `spes train` peers make a state dir (3 rounds), then each
# case damages a copy and starts `spes server` on it. A damaged dir must be refused naming the
# file and what is wrong (exit 1, never "listening on"), and nothing in it deleted; an intact one
# must resume. (Unit cases of the same: test_damaged_state_dir_refused in test_sync_rounds.c.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin
ro_mount=""
cleanup_extra() { [ -z "$ro_mount" ] || umount "$ro_mount" 2>/dev/null || true; }
fail() { echo "FAIL: $*"; exit 1; }

reliability_data

# start_server LOG STATE [flags]: `spes server` on a free port (--port 0); sets $server_pid and
# $port once it listens, or returns 1 when it exited first.
start_server() {
  local log=$1 state=$2
  shift 2
  "$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 127.0.0.1 --port 0 --state_dir "$state" "$@" \
    >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\) .*/\1/p' "$log" 2>/dev/null | head -1 || true)
    [ -n "$port" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || { wait "$server_pid" || true; server_pid=""; return 1; }
    sleep 0.02
  done
  fail "server on $state neither listened nor exited: $(tail -3 "$log")"
}
stop_server() { kill "$server_pid"; wait "$server_pid" || true; server_pid=""; }

# A state dir of 3 completed rounds (steps 2, 4, 6; aggregates 4 and 6 kept).
mkdir -p "$dir/run"
start_server "$dir/run/server.log" "$dir/run/state" || fail "first server: $(cat "$dir/run/server.log")"
reliability_run_peers "$dir/run" 6 2
stop_server
good="$dir/run/state"
[ -f "$good/aggregate_s6.safetensors" ] && [ -f "$good/rounds.json" ] || fail "no state written: $(ls "$good")"

# copy: a fresh copy of the good state dir in $dir/s.
copy() { rm -rf "$dir/s"; cp -a "$good" "$dir/s"; }
# refused WHAT PATTERN [flags]: the server on $dir/s exits 1, its error matching PATTERN, and the
# state dir's aggregates are all still there.
refused() {
  local what=$1 pattern=$2
  shift 2
  local before
  before=$(ls "$dir/s" | grep -c '^aggregate_' || true)
  if start_server "$dir/refused.log" "$dir/s" "$@"; then
    stop_server
    fail "$what: the server started: $(grep -v 'listening' "$dir/refused.log" | tail -3)"
  fi
  grep -q -- "$pattern" "$dir/refused.log" || fail "$what: refused without naming '$pattern': $(cat "$dir/refused.log")"
  [ "$(ls "$dir/s" | grep -c '^aggregate_' || true)" = "$before" ] || fail "$what: aggregates were deleted: $(ls "$dir/s")"
  echo "ok: $what: $(grep '^spes: ' "$dir/refused.log" | cut -c1-160)"
}

# Intact: resumes at step 6.
copy
start_server "$dir/ok.log" "$dir/s" || fail "intact state dir refused: $(cat "$dir/ok.log")"
stop_server
grep -q "resumed from state dir .*(last step 6), 2 aggregates kept" "$dir/ok.log" || fail "no resume line: $(cat "$dir/ok.log")"

# The flags that shape every aggregate are recorded in spec.json: a restart with other values is
# refused naming both (they used to change silently); operational flags may change.
copy
refused "expert rotation changed" \
  "written by a run with --expert_rotation_steps 0; this server runs --expert_rotation_steps 2 (.*another --state_dir)" \
  --expert_rotation_steps 2
refused "expert merging changed" \
  "with --merge_interval 0 --merge_alpha_start 0; this server runs --merge_interval 2 --merge_alpha_start 0.5 (" \
  --merge_interval 2 --merge_alpha_start 0.5
start_server "$dir/ok.log" "$dir/s" --keep_steps 3 --round_timeout 30 --min_peers 2 --max_wait_seconds 5 ||
  fail "operational flags changed at a restart refused: $(cat "$dir/ok.log")"
stop_server
grep -q '"expert_rotation_steps": 0' "$dir/s/spec.json" || fail "spec.json records no rotation: $(cat "$dir/s/spec.json")"

copy; truncate -s 100 "$dir/s/rounds.json"
refused "rounds.json truncated" "rounds.json: line"
copy; truncate -s 1000 "$dir/s/aggregate_s6.safetensors"
refused "newest aggregate truncated" "aggregate_s6.safetensors does not match rounds.json"
copy; rm "$dir/s/aggregate_s6.safetensors"
refused "newest aggregate missing" "aggregate_s6.safetensors) is missing"
copy; sed -i 's/"last_completed_step": 6/"last_completed_step": 4/' "$dir/s/rounds.json"
refused "rounds.json edited (its check)" "rounds.json: its check does not match"

# rounds.json lost: the aggregates have no uploads beside them, so they are no crash leftover of a
# first round; the server used to delete them all and restart the rounds at step -1.
copy; rm "$dir/s/rounds.json"
refused "rounds.json missing" "aggregate_s4.safetensors but no rounds.json"

# rounds.json rewritten with a matching check but contents no server writes: the server used to
# delete the recorded aggregate of step 6 (past the edited last step 4), or serve negative counters
# that made `spes status` refuse the server.
rewrite_book() {   # rewrite_book LAST COMPLETED PARTIAL STEP... (each kept step's size and crc from the good file)
  "$SPES_VENV_PY" - "$dir/s/rounds.json" "$good/rounds.json" "$@" <<'PY'
import json, sys
def crc32c(b):
    crc = 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
out, good, last, comp, part = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
by_step = {e["step"]: e for e in json.load(open(good))["aggregates"]}
kept = [by_step[int(s)] for s in sys.argv[6:]]
text = "rounds.json v2 %d %d %d %d" % (last, comp, part, len(kept))
for e in kept:
    text += " %d:%d:%08x:0:0:00000000" % (e["step"], e["bytes"], e["crc32c"])
book = {"version": 2, "last_completed_step": last, "rounds_completed": comp, "rounds_partial": part,
        "aggregates": kept, "check": crc32c(text.encode())}
json.dump(book, open(out, "w"), indent=1)
PY
}
if [ -x "${SPES_VENV_PY:-}" ]; then
  copy; rewrite_book 6 3 0 6 4
  start_server "$dir/ok.log" "$dir/s" || fail "a rewritten but consistent rounds.json refused: $(cat "$dir/ok.log")"
  stop_server
  copy; rewrite_book 4 3 0 6 4
  refused "rounds.json: a kept aggregate past the last step" "aggregates entry 0 (step 6) is past last_completed_step 4"
  copy; rewrite_book 6 -5 0 6 4
  refused "rounds.json: negative round count" "a round count is negative"
  copy; rewrite_book 6 3 0 6 6
  refused "rounds.json: one step kept twice" "both name step 6"
else
  echo "(no test virtualenv: rounds.json rewrites skipped)"
fi

# Read-only state dir (as root: a read-only tmpfs; root ignores file modes).
if [ "$(id -u)" = 0 ] && mkdir -p "$dir/ro" && mount -t tmpfs -o size=16m tmpfs "$dir/ro" 2>/dev/null; then
  ro_mount="$dir/ro"
  cp -a "$good" "$dir/ro/state"
  mount -o remount,ro "$dir/ro"
  rm -rf "$dir/s"; ln -s "$dir/ro/state" "$dir/s"
  refused "read-only state dir" "cannot open $dir/s/lock: Read-only file system"
  umount "$dir/ro"; ro_mount=""; rm -f "$dir/s"
fi
# Peers resumed against the restarted server while peer 3 never comes back (no --round_timeout):
# they wait, and each says so with the peer it waits for, instead of waiting without a line.
copy
start_server "$dir/wait.log" "$dir/s" || fail "intact state dir refused: $(cat "$dir/wait.log")"
cp -a "$dir/run" "$dir/wait"
waiters=()
for peer in 0 1 2; do
  reliability_peer $peer "$port" 8 "$dir/wait/peer$peer" "$dir/wait/peer$peer.resumed.log" 2 --resume
  waiters+=("$last_pid")
  pids+=("$last_pid")
done
for peer in 0 1 2; do
  reliability_wait_log "sync step 8: still waiting for the aggregate after 1[0-9] s; the server has the uploads of 3 of 4 peers, waiting for peer 3" \
    "$dir/wait/peer$peer.resumed.log" || fail "peer $peer waited without saying why"
done
kill -TERM "${waiters[@]}"
for p in "${waiters[@]}"; do wait "$p" || true; done
stop_server
grep -q '"synced": false' "$dir/wait/peer0/step8/train_state.json" || fail "peer 0 stopped while waiting saved no unsynced step 8"
echo "ok: peers waiting on a missing peer say so: $(grep -m1 'still waiting' "$dir/wait/peer0.resumed.log" | cut -c1-160)"
# An int8 run whose server lost its state dir: the peers resume from checkpoints saved against the
# aggregate of step 6, which the new server never made. They used to wait for ever for it as their
# delta base; now they send step 8 whole and the run goes on.
mkdir -p "$dir/int8"
start_server "$dir/int8/server.log" "$dir/int8/state" || fail "int8 server: $(cat "$dir/int8/server.log")"
RELIABILITY_PEER_ARGS=--spes_config.payload_dtype=int8 reliability_run_peers "$dir/int8" 6 2
stop_server
rm -rf "$dir/int8/state"
start_server "$dir/int8/server.lost.log" "$dir/int8/state" || fail "int8 server: $(cat "$dir/int8/server.lost.log")"
resumed=()
for peer in 0 1 2 3; do
  RELIABILITY_PEER_ARGS=--spes_config.payload_dtype=int8 \
    reliability_peer $peer "$port" 8 "$dir/int8/peer$peer" "$dir/int8/peer$peer.resumed.log" 2 --resume
  resumed+=("$last_pid")
  pids+=("$last_pid")
done
for _ in $(seq 3000); do   # 30 s
  alive=0
  for p in "${resumed[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.01
done
[ $alive = 0 ] || fail "int8 peers resumed against a server that lost its state hang: $(tail -2 "$dir/int8/peer0.resumed.log")"
for peer in 0 1 2 3; do
  wait "${resumed[$peer]}" || fail "int8 peer $peer failed: $(tail -3 "$dir/int8/peer$peer.resumed.log")"
done
stop_server
grep -q "the server has no aggregate of step 6, the int8 base" "$dir/int8/peer0.resumed.log" ||
  fail "no line on the missing int8 base: $(cat "$dir/int8/peer0.resumed.log")"
grep -q "step 8: aggregated 4 peers" "$dir/int8/server.lost.log" || fail "the int8 round of step 8 never completed"
echo "ok: int8 peers resumed against a server that lost its state sent step 8 whole"
echo "server state hostile: ok"
