#!/usr/bin/env bash
# A SPES peer never loses its work when a sync round fails. Real `spes server` and 4 `spes train`
# peers (tiny config, sync every 2 steps, checkpoints only at the end):
#  1. the server is killed (SIGKILL) mid-run and stays down past retry_timeout_s: every peer saves
#     its local state as a checkpoint marked "synced": false and exits non-zero; the server is
#     restarted on its --state_dir, the peers resume with --resume (redoing the pending round) and
#     finish with byte-identical weights (delta runs: first a resume on a damaged error feedback
#     is refused);
#  2. peer 1 is SIGTERMed while it waits for the aggregate of step 2 (peer 3 is not started yet,
#     so the round cannot complete): it stops at once, saves step 2 not synced, exits non-zero;
#     resumed, it redoes round 2 (the server answers ALREADY_EXISTS and hands out the aggregate),
#     and all 4 finish byte-identical to an undisturbed run's.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data
STEPS=12

# start_server <run> [flags]: the 4-peer server of lib/reliability.sh, logging to $dir/<run>/server.log.
start_server() {
  local run=$1; shift
  reliability_server "$@"; pids+=($server_pid)
  ln -sf "$dir/server.log" "$dir/$run/server.log"
  # Peers here retry a lost server for only 3 s: start them once it listens (a slow start, as
  # under ASan on a loaded machine, would otherwise read as a lost server).
  reliability_wait_log "listening on" "$dir/server.log"
}
# start_peers <run> [extra args]: 4 peers saving only at the end, retrying a lost server 3 s.
start_peers() {
  local run=$1; shift
  for peer in 0 1 2 3; do
    reliability_peer $peer "$port" $STEPS "$dir/$run/peer$peer" "$dir/$run/peer$peer.log" $STEPS \
      --spes_config.retry_timeout_s=3 "$@"
    peer_pids[$peer]=$last_pid; pids+=($last_pid)
  done
}
# unsynced_checkpoint <save_folder>: prints the step of its newest checkpoint marked not synced.
unsynced_checkpoint() {
  { grep -l '"synced": false' "$1"/step*/train_state.json 2>/dev/null || true; } |
    sed 's|.*/step\([0-9]*\)/.*|\1|' | sort -n | tail -1
}
peer_pids=()

echo "== undisturbed run"
mkdir -p "$dir/ref"
start_server ref
start_peers ref
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "undisturbed peer $i failed"; tail "$dir/ref/peer$i.log"; exit 1; }; done
kill "$server_pid"; wait "$server_pid" || true

echo "== 1. server killed for longer than retry_timeout_s"
mkdir -p "$dir/kill"
start_server kill --state_dir "$dir/kill/state"
start_peers kill
reliability_wait_log "step 4: aggregated 4 peers" "$dir/kill/server.log"
kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true
echo "server killed after the round of step 4"
for i in 0 1 2 3; do
  rc=0; wait "${peer_pids[$i]}" || rc=$?
  [ $rc -ne 0 ] || { echo "peer $i exited 0 although its sync failed"; tail "$dir/kill/peer$i.log"; exit 1; }
  s=$(unsynced_checkpoint "$dir/kill/peer$i")
  [ -n "$s" ] || { echo "peer $i left no checkpoint marked not synced:"; ls "$dir/kill/peer$i" 2>&1 || true; tail -3 "$dir/kill/peer$i.log"; exit 1; }
  echo "  peer $i: exit $rc, saved step $s not synced"
done
rm "$dir/kill/server.log"; mv "$dir/server.log" "$dir/kill/server.log"
"$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 127.0.0.1 --port "$port" \
  --state_dir "$dir/kill/state" >"$dir/kill/server2.log" 2>&1 &
server_pid=$!; pids+=($server_pid)
if [[ "${RELIABILITY_PEER_ARGS:-}" == *payload_dtype=int* ]]; then
  # Delta runs: a damaged error feedback (every value 1e30, finite) is refused at resume, naming
  # the file, before it can poison an upload and through the aggregate every peer (issue 29).
  s=$(unsynced_checkpoint "$dir/kill/peer0")
  state="$dir/kill/peer0/step$s/spes_sync_state.safetensors"
  cp "$state" "$dir/sync_state.good"
  python3 - "$state" <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
lo, hi = json.loads(raw[8:8 + n])["error_feedback"]["data_offsets"]
at = 8 + n + lo
raw[at:8 + n + hi] = struct.pack("<f", 1e30) * ((hi - lo) // 4)
open(path, "wb").write(raw)
PY
  rc=0
  reliability_peer 0 "$port" $STEPS "$dir/kill/peer0" "$dir/kill/peer0.damaged.log" $STEPS \
    --spes_config.retry_timeout_s=30 --resume
  # Taken, it would upload and wait for a round the other peers never join: 60 s is a failure.
  for _ in $(seq 1 600); do kill -0 "$last_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$last_pid" 2>/dev/null && { kill -9 "$last_pid"; echo "peer 0 resumed on a damaged error feedback";
                                       tail "$dir/kill/peer0.damaged.log"; exit 1; }
  wait "$last_pid" || rc=$?
  [ $rc -ne 0 ] || { echo "peer 0 resumed on a damaged error feedback"; tail "$dir/kill/peer0.damaged.log"; exit 1; }
  grep -q "spes_sync_state.safetensors: the .* error feedback of tensor .* is 1e+30 at flat index 0.*damaged" \
    "$dir/kill/peer0.damaged.log" || { echo "no clear refusal of the damaged error feedback:"; tail -3 "$dir/kill/peer0.damaged.log"; exit 1; }
  echo "  a damaged error feedback is refused at resume (exit $rc)"
  cp "$dir/sync_state.good" "$state"
fi
for peer in 0 1 2 3; do
  reliability_peer $peer "$port" $STEPS "$dir/kill/peer$peer" "$dir/kill/peer$peer.resume.log" $STEPS \
    --spes_config.retry_timeout_s=30 --resume
  peer_pids[$peer]=$last_pid; pids+=($last_pid)
done
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "resumed peer $i failed"; tail -20 "$dir/kill/peer$i.resume.log"; exit 1; }; done
kill "$server_pid"; wait "$server_pid" || true
grep -q "not synced; redoing the sync of step" "$dir/kill/peer0.resume.log" ||
  { echo "peer 0 did not redo its pending round"; tail "$dir/kill/peer0.resume.log"; exit 1; }
for peer in 0 1 2 3; do
  [ -z "$(unsynced_checkpoint "$dir/kill/peer$peer")" ] || { echo "peer $peer still has a not-synced checkpoint"; exit 1; }
  cmp -s "$dir/ref/peer$peer/step$STEPS/model.safetensors" "$dir/kill/peer$peer/step$STEPS/model.safetensors" ||
    { echo "peer $peer's final weights differ from the undisturbed run's"; exit 1; }
done
echo "  resumed: 4 peers finished byte-identical to the undisturbed run"

echo "== 2. SIGTERM while a sync is in flight"
mkdir -p "$dir/term"
start_server term
# Peer 3 starts late, so the first round (step 2) cannot complete while peer 1 waits in it.
for peer in 0 1 2; do
  reliability_peer $peer "$port" $STEPS "$dir/term/peer$peer" "$dir/term/peer$peer.log" $STEPS
  peer_pids[$peer]=$last_pid; pids+=($last_pid)
done
reliability_wait_log "step 2: upload from peer 1 accepted" "$dir/term/server.log"
sleep 0.3
t0=$(date +%s.%N)
kill -TERM "${peer_pids[1]}"
for _ in $(seq 1 100); do kill -0 "${peer_pids[1]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${peer_pids[1]}" 2>/dev/null && { echo "peer 1 still blocked in its sync 10 s after SIGTERM"; exit 1; }
rc=0; wait "${peer_pids[1]}" || rc=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
[ $rc -ne 0 ] || { echo "peer 1 exited 0 after an interrupted sync"; exit 1; }
s=$(unsynced_checkpoint "$dir/term/peer1")
[ "$s" = 2 ] || { echo "peer 1: want step 2 saved not synced, got '$s'"; tail "$dir/term/peer1.log"; exit 1; }
grep -q "stopped by a signal during the sync of step 2" "$dir/term/peer1.log" || { tail "$dir/term/peer1.log"; exit 1; }
echo "  peer 1: SIGTERM mid-sync -> exit $rc after ${took}s, step 2 saved not synced"
reliability_peer 3 "$port" $STEPS "$dir/term/peer3" "$dir/term/peer3.log" $STEPS
peer_pids[3]=$last_pid; pids+=($last_pid)
reliability_peer 1 "$port" $STEPS "$dir/term/peer1" "$dir/term/peer1.resume.log" $STEPS --resume
peer_pids[1]=$last_pid; pids+=($last_pid)
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "peer $i failed"; tail -20 "$dir/term/peer$i"*.log; exit 1; }; done
kill "$server_pid"; wait "$server_pid" || true
grep -q "the sync of step 2 is done" "$dir/term/peer1.resume.log" || { tail "$dir/term/peer1.resume.log"; exit 1; }
for peer in 0 1 2 3; do
  cmp -s "$dir/ref/peer$peer/step$STEPS/model.safetensors" "$dir/term/peer$peer/step$STEPS/model.safetensors" ||
    { echo "peer $peer's final weights differ from the undisturbed run's"; exit 1; }
done
echo "  resumed: 4 peers finished byte-identical to the undisturbed run"
