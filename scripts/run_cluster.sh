#!/usr/bin/env bash
# One command for every node of a scheduler job (SLURM, torchrun-style launchers): reads
# RANK (this node's peer id), MASTER_ADDR (the host of rank 0) and NPROC_PER_NODE (ranks of
# data parallelism on this node, as the reference's torchrun --nproc_per_node; THREADS: CPU
# threads per rank). Rank 0 also starts the parameter server, waits until it listens, and stops
# it when its own training ends.
#   RANK=0 MASTER_ADDR=node0 scripts/run_cluster.sh [--key=value overrides]
# Environment as scripts/run_single_node.sh and scripts/run_parameter_server.sh (TOTAL_PEERS,
# NUM_TRAIN_EXPERTS_PER_NODE, PORT, MERGE_*). The server runs the outer optimizer the peers' CONFIG
# says (spes_config.outer_lr / outer_momentum), or the --spes_config.outer_* overrides given here.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANK=${RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PORT=${PORT:-50051}
export NPROC_PER_NODE=${NPROC_PER_NODE:-1}
export CONFIG=${CONFIG:-$ROOT/configs/spes_tiny_4nodes.yaml}   # the peers' (run_single_node.sh) and the server's
# Outer-optimizer overrides of the peers go to the server too, in either form spes train takes
# (--key=value, or --key value).
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  arg=${args[i]} next=${args[i + 1]:-}
  case $arg in
    --spes_config.outer_lr=*) export OUTER_LR=${arg#*=} ;;
    --spes_config.outer_momentum=*) export OUTER_MOMENTUM=${arg#*=} ;;
    --spes_config.outer_lr) export OUTER_LR=$next ;;
    --spes_config.outer_momentum) export OUTER_MOMENTUM=$next ;;
  esac
done

# The server address peers dial: MASTER_ADDR resolved once here (getent), else as given.
if [ "$MASTER_ADDR" = "localhost" ] || [ "$MASTER_ADDR" = "127.0.0.1" ]; then
  server_ip=127.0.0.1
else
  server_ip=$(getent hosts "$MASTER_ADDR" | awk '{print $1; exit}')
  server_ip=${server_ip:-$MASTER_ADDR}
fi
export SERVER_ADDR="$server_ip:$PORT"

server_pid=""
stop_server() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi; }
trap stop_server EXIT
if [ "$RANK" -eq 0 ]; then
  PORT=$PORT "$ROOT/scripts/run_parameter_server.sh" >"${SERVER_LOG:-spes_server.log}" 2>&1 &
  server_pid=$!
  # Wait for the port instead of a fixed sleep (at most 60 s).
  for _ in $(seq 600); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
    kill -0 "$server_pid" 2>/dev/null || { echo "run_cluster: the server exited; see ${SERVER_LOG:-spes_server.log}" >&2; exit 1; }
    sleep 0.1
  done
  echo "run_cluster: rank 0 started the parameter server (pid $server_pid) on port $PORT"
fi
echo "run_cluster: rank $RANK -> server $SERVER_ADDR, $NPROC_PER_NODE rank(s) x ${THREADS:-all} threads"
"$ROOT/scripts/run_single_node.sh" "$RANK" --resume "$@"
