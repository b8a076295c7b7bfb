#!/usr/bin/env bash
# Peer crash and rejoin: a real `spes server --round_timeout 2 --min_peers 2` and 4 `spes train`
# peers (tiny config, sync and checkpoint every 2 steps). Peer 1 is killed with SIGKILL after
# the round of step 6; the others go on with partial rounds (blocked at most the round timeout
# each). Peer 1 is restarted with --resume: it reloads its last checkpoint, learns the newest
# aggregate from the server's Status, loads it and trains on; uploads for rounds that closed
# without it are answered ABORTED and it takes the newest aggregate again until it is back in
# step. Checked: every peer finishes, rounds with all 4 peers happen again after the rejoin,
# and the final weights of all 4 peers are byte-identical.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data

STEPS=16
reliability_server --round_timeout 2 --min_peers 2
pids+=($server_pid)
start_peer() {   # <peer> <log> [--resume]: checkpoints every sync
  reliability_peer $1 "$port" $STEPS "$dir/peer$1" "$2" 2 ${3:-}
  peer_pids[$1]=$last_pid
  pids+=($last_pid)
}
peer_pids=()
for peer in 0 1 2 3; do start_peer $peer "$dir/peer$peer.log"; done
reliability_wait_log "step 6: aggregated 4 peers" "$dir/server.log"
kill -9 "${peer_pids[1]}"; wait "${peer_pids[1]}" 2>/dev/null || true
echo "peer 1 killed (SIGKILL) after the round of step 6"
reliability_wait_log "step 8: PARTIAL" "$dir/server.log"
start_peer 1 "$dir/peer1.rejoin.log" --resume
echo "peer 1 restarted with --resume"

status=0
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "peer $i failed:"; tail -20 "$dir/peer$i.log" "$dir/peer$i.rejoin.log" 2>/dev/null; status=1; }; done
kill "$server_pid"; wait "$server_pid" || true
[ $status -eq 0 ] || { tail -30 "$dir/server.log"; exit 1; }

grep -q "rejoined with the server's newest aggregate" "$dir/peer1.rejoin.log" ||
  { echo "peer 1 did not rejoin from the server's newest aggregate"; tail -20 "$dir/peer1.rejoin.log"; exit 1; }
grep -h "resumed\|rejoined" "$dir/peer1.rejoin.log" | sed 's/^\[[^]]*\] /  /' | head -3
grep "PARTIAL round" "$dir/server.log" | sed 's/.*server: /  /'
grep -q "step $STEPS: aggregated 4 peers" "$dir/server.log" || { echo "peer 1 never got back in step"; tail -20 "$dir/server.log"; exit 1; }
for peer in 1 2 3; do
  cmp -s "$dir/peer0/step$STEPS/model.safetensors" "$dir/peer$peer/step$STEPS/model.safetensors" ||
    { echo "peer $peer's final weights differ from peer 0's"; exit 1; }
done
echo "peer rejoin: 4 peers finished byte-identical after peer 1 was killed and resumed"
