#!/usr/bin/env bash
# A SPES peer's sync audit copies (SPES_SYNC_LOG_DIR) are a log: a copy that cannot be written is
# lost, not the round. With SPES_SYNC_LOG_DIR under a regular file (every copy fails: "Not a
# directory") 4 peers sync every round, say the failure once each, name the lost copies at the
# end, exit 0, and end byte-identical to peers that keep no copies. (The old code failed the
# round: each peer saved its state not synced and exited 1.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin
reliability_data
STEPS=8

# run NAME: the server and 4 peers, to the end.
run() {
  mkdir -p "$dir/$1"
  reliability_server
  pids+=("$server_pid")
  reliability_wait_log "listening on" "$dir/server.log"
  local peer status=0 peer_pids=()
  for peer in 0 1 2 3; do
    reliability_peer $peer "$port" $STEPS "$dir/$1/peer$peer" "$dir/$1/peer$peer.log" $STEPS
    peer_pids+=("$last_pid")
    pids+=("$last_pid")
  done
  for peer in 0 1 2 3; do
    wait "${peer_pids[$peer]}" || { echo "FAIL: $1: peer $peer failed:"; tail -5 "$dir/$1/peer$peer.log"; status=1; }
  done
  kill "$server_pid"
  wait "$server_pid" || true
  return $status
}

unset SPES_SYNC_LOG_DIR
run plain
touch "$dir/afile"
export SPES_SYNC_LOG_DIR="$dir/afile/sync"
run audit || exit 1
for peer in 0 1 2 3; do
  log=$dir/audit/peer$peer.log
  grep -q "warn\] cannot write the sync audit copies in $SPES_SYNC_LOG_DIR (SPES_SYNC_LOG_DIR) at step 2: .*Not a directory. Training goes on" "$log" ||
    { grep sync "$log" | head -5; echo "FAIL: peer $peer did not say its audit copies fail"; exit 1; }
  [ "$(grep -c "cannot write the sync audit copies" "$log")" = 1 ] || { echo "FAIL: peer $peer said it more than once"; exit 1; }
  grep -q "warn\] the sync audit copies in $SPES_SYNC_LOG_DIR (SPES_SYNC_LOG_DIR) could not be written up to the end of the run (.*Not a directory); lost: [0-9]* files (steps 2-$STEPS)" "$log" ||
    { tail -3 "$log"; echo "FAIL: peer $peer did not count its lost copies"; exit 1; }
  for f in model.safetensors train_state.safetensors; do
    cmp -s "$dir/plain/peer$peer/step$STEPS/$f" "$dir/audit/peer$peer/step$STEPS/$f" ||
      { echo "FAIL: peer $peer's step$STEPS/$f differs from the run without audit copies"; exit 1; }
  done
done
echo "sync_audit_log_fail: OK"
