#!/usr/bin/env bash
# Durable server: a real `spes server --state_dir` and 4 `spes train` peers (tiny config, 6
# sync rounds). The server is killed with SIGKILL at several points of the run (during the
# uploads of a round, right after a round completes while peers download it, with part of a
# round uploaded) and restarted with the same --state_dir each time; the peers retry and the
# run finishes. 64 KiB chunks make every upload and download a stream of ~20-40 messages, so a
# kill lands inside transfers too. The final weights of every peer must be byte-identical (cmp) to those of an
# undisturbed run with the same seeds. RELIABILITY_SERVER_FLAGS adds server flags to both runs
# (reliability_server_restart_outer.sh: the outer optimizer, whose state must survive too).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data

STEPS=12
start_server() {   # <run> <port> <log>
  "$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 127.0.0.1 --port "$2" \
    --merge_interval 4 --merge_alpha_start 0.5 --merge_decay_steps 100 --merge_topk 2 --chunk_size 65536 \
    --state_dir "$dir/$1/state" ${RELIABILITY_SERVER_FLAGS:-} >"$3" 2>&1 &
  server_pid=$!
}
start_peers() {    # <run> <port>
  peer_pids=()
  for peer in 0 1 2 3; do
    reliability_peer $peer "$2" $STEPS "$dir/$1/peer$peer" "$dir/$1/peer$peer.log"
    peer_pids+=($last_pid)
  done
}
wait_peers() {     # <run>
  local status=0
  for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "$1: peer $i failed:"; tail -20 "$dir/$1/peer$i.log"; status=1; }; done
  return $status
}

# 1. Undisturbed run.
mkdir -p "$dir/calm"
port=$(( 20000 + RANDOM % 20000 ))
start_server calm "$port" "$dir/calm/server.log"
start_peers calm "$port"
wait_peers calm || { tail -20 "$dir/calm/server.log"; exit 1; }
kill "$server_pid"; wait "$server_pid" || true; server_pid=""

# 2. The same run, the server killed with SIGKILL when its log first shows each pattern.
mkdir -p "$dir/kill"
port=$(( 20000 + RANDOM % 20000 ))
start_server kill "$port" "$dir/kill/server.0.log"
start_peers kill "$port"
kill_points=("step 4: upload from peer" "step 6: aggregated" "step 8: upload from peer [0-9]* accepted" "step 10: aggregated")
n=0
for pattern in "${kill_points[@]}"; do
  log="$dir/kill/server.$n.log"
  reliability_wait_log "$pattern" "$log"
  kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true
  echo "killed the server (SIGKILL) after: $(grep -E 'upload from|aggregated' "$log" | tail -1 | sed 's/.*server: //')"
  n=$((n + 1))
  start_server kill "$port" "$dir/kill/server.$n.log"
done
wait_peers kill || { tail -20 "$dir/kill/server.$n.log"; exit 1; }
kill "$server_pid"; wait "$server_pid" || true; server_pid=""
grep -q "resumed from state dir" "$dir/kill/server.1.log" || { echo "restarted server did not resume its state"; exit 1; }
grep -h "resumed from state dir" "$dir"/kill/server.*.log | sed 's/.*server: /  /'
if [[ "${RELIABILITY_SERVER_FLAGS:-}" == *--outer_lr* ]]; then
  ls "$dir"/kill/state/outer_s*.bin >/dev/null 2>&1 || { echo "no outer optimizer state in the state dir"; exit 1; }
fi

for peer in 0 1 2 3; do
  a="$dir/calm/peer$peer/step$STEPS/model.safetensors" b="$dir/kill/peer$peer/step$STEPS/model.safetensors"
  [ -f "$a" ] && [ -f "$b" ] || { echo "peer $peer: no final checkpoint"; exit 1; }
  cmp -s "$a" "$b" || { echo "peer $peer: final weights differ from the undisturbed run"; exit 1; }
done
cmp -s "$dir/kill/peer0/step$STEPS/model.safetensors" "$dir/kill/peer3/step$STEPS/model.safetensors" ||
  { echo "peers 0 and 3 disagree"; exit 1; }
echo "server restarted $n times; final weights of 4 peers byte-identical to the undisturbed run"
