#!/usr/bin/env bash
# Ownership failover: a real `spes server --round_timeout 2 --min_peers 2` and 4 `spes train`
# peers (tiny config, sync every 2 steps). Peer 3 is killed with SIGKILL after the round of
# step 4 and its node is gone (no checkpoint used). A fresh process started with
# `spes_config.take_over_peer_id=3` (another save folder, another data seed) loads the server's
# newest aggregate — the latest copy of peer 3's experts — trains them, catches up through
# ABORTED late rounds, and the run ends with all 4 owners in the rounds again. Checked: the
# replacement logged the take-over, rounds with 4 peers happen after it, and the final weights
# of peers 0-2 and the replacement are byte-identical.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data

STEPS=16
reliability_server --round_timeout 2 --min_peers 2
pids+=($server_pid)
peer_pids=()
for peer in 0 1 2 3; do
  reliability_peer $peer "$port" $STEPS "$dir/peer$peer" "$dir/peer$peer.log"
  peer_pids[$peer]=$last_pid
  pids+=($last_pid)
done
reliability_wait_log "step 4: aggregated 4 peers" "$dir/server.log"
kill -9 "${peer_pids[3]}"; wait "${peer_pids[3]}" 2>/dev/null || true
echo "peer 3 killed (SIGKILL) after the round of step 4; its node is gone"
reliability_wait_log "step 6: PARTIAL" "$dir/server.log"
reliability_peer 3 "$port" $STEPS "$dir/replacement" "$dir/replacement.log" $STEPS \
  --spes_config.take_over_peer_id=3 --data.seed=424242
peer_pids[3]=$last_pid
pids+=($last_pid)
echo "replacement started with spes_config.take_over_peer_id=3"

status=0
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "peer $i failed:"; tail -20 "$dir/peer$i.log"; status=1; }; done
kill "$server_pid"; wait "$server_pid" || true
[ $status -eq 0 ] || { tail -20 "$dir/replacement.log"; tail -30 "$dir/server.log"; exit 1; }

grep -q "took over peer 3's experts from the server's aggregate" "$dir/replacement.log" ||
  { echo "the replacement did not start from the server's copy"; tail -20 "$dir/replacement.log"; exit 1; }
grep -h "took over" "$dir/replacement.log" | sed 's/^\[[^]]*\] /  /'
echo "  ABORTED late rounds while catching up: $(grep -c 'closed without it' "$dir/replacement.log" || true)"
grep -q "step $STEPS: aggregated 4 peers" "$dir/server.log" || { echo "the replacement never joined a full round"; tail -20 "$dir/server.log"; exit 1; }
for peer in 1 2; do
  cmp -s "$dir/peer0/step$STEPS/model.safetensors" "$dir/peer$peer/step$STEPS/model.safetensors" ||
    { echo "peer $peer's final weights differ from peer 0's"; exit 1; }
done
cmp -s "$dir/peer0/step$STEPS/model.safetensors" "$dir/replacement/step$STEPS/model.safetensors" ||
  { echo "the replacement's final weights differ from peer 0's"; exit 1; }
echo "take over: the replacement trained peer 3's experts from the server's copy; 4 peers end byte-identical"
