#!/usr/bin/env bash
# Overlapped sync under failures (spes_config.sync_overlap: true): a `spes server --state_dir`
# and 4 peers, 12 steps, sync every 2 (rounds 2, 4, 8, 10 overlapped; 6 and 12 are checkpoint
# steps, blocking). The server is SIGKILLed twice (while rounds 4 and 10 are uploaded) and restarted on its state dir; peer 2 is SIGKILLed after saving step 6 and
# resumed with --resume. Checked: every peer finishes, peer 2 resumed from step 6, rounds
# overlapped, and the 4 final checkpoints (after the blocking last round) are byte-identical.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data

STEPS=12
port=$(( 20000 + RANDOM % 20000 ))
start_server() {   # <log>
  "$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 127.0.0.1 --port "$port" \
    --merge_interval 4 --merge_alpha_start 0.5 --merge_decay_steps 100 --merge_topk 2 --state_dir "$dir/state" \
    >"$1" 2>&1 &
  server_pid=$!
}
start_peer() {     # <peer> <log> [--resume]
  reliability_peer $1 "$port" $STEPS "$dir/peer$1" "$2" 6 --spes_config.sync_overlap=true ${3:-}
  peer_pids[$1]=$last_pid
  pids+=($last_pid)
}

start_server "$dir/server.0.log"
peer_pids=()
for peer in 0 1 2 3; do start_peer $peer "$dir/peer$peer.log"; done
kill_server() {    # <pattern>: SIGKILL the server once its log shows pattern, start it again
  reliability_wait_log "$1" "$dir/server.$n.log"
  kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true
  echo "killed the server (SIGKILL) after: $1"
  n=$((n + 1))
  start_server "$dir/server.$n.log"
}
n=0
kill_server "step 4: upload from peer"
reliability_wait_log "saved .*peer2/step6 " "$dir/peer2.log"
kill -9 "${peer_pids[2]}"; wait "${peer_pids[2]}" 2>/dev/null || true
echo "peer 2 killed (SIGKILL) after saving step 6"
start_peer 2 "$dir/peer2.resume.log" --resume
kill_server "step 10: upload from peer"
status=0
for i in 0 1 2 3; do
  wait "${peer_pids[$i]}" || { echo "peer $i failed:"; tail -20 "$dir/peer$i.log" "$dir/peer$i.resume.log" 2>/dev/null; status=1; }
done
[ $status -eq 0 ] || { tail -20 "$dir/server.$n.log"; exit 1; }
grep -q "resumed from state dir" "$dir/server.1.log" || { echo "restarted server did not resume its state"; exit 1; }
grep -q "resumed from .*step6: step 6," "$dir/peer2.resume.log" ||
  { echo "peer 2 did not resume from step 6"; grep -i resum "$dir/peer2.resume.log" | head -5; exit 1; }
overlapped=$(cat "$dir"/peer*.log | grep -c "overlapped: applied at step" || true)
[ "$overlapped" -ge 8 ] || { echo "only $overlapped overlapped rounds were applied"; exit 1; }
for peer in 1 2 3; do
  cmp -s "$dir/peer0/step$STEPS/model.safetensors" "$dir/peer$peer/step$STEPS/model.safetensors" ||
    { echo "peer $peer's final weights differ from peer 0's"; exit 1; }
done
echo "overlap: server restarted $n times, peer 2 resumed; $overlapped overlapped rounds applied; 4 peers end byte-identical"
