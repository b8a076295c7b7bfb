#!/usr/bin/env bash
# Starts one SPES peer (the reference's run_single_node.sh): node i trains with data seed
# 6198 + 1000*i and owns experts [i*m, (i+1)*m) of every layer.
#   scripts/run_single_node.sh <node_id> [--resume] [extra --key=value overrides]
# Environment: CONFIG (default configs/spes_tiny_4nodes.yaml), SERVER_ADDR (host:port of the
# parameter server, default the config's), LOAD_PATH (initial weights, e.g. an upcycled HF
# dir; fresh starts only), THREADS (CPU threads per rank; default all cores), NPROC_PER_NODE
# (ranks of data parallelism on this node, `spes train --nproc_per_node`; default 1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPES=${SPES_BIN:-$ROOT/build/spes}
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 <node_id> [--resume] [--key=value ...]" >&2
  exit 2
fi
NODE_ID=$1
shift
RESUME=false
if [ "${1:-}" = "--resume" ]; then RESUME=true; shift; fi
CONFIG=${CONFIG:-$ROOT/configs/spes_tiny_4nodes.yaml}
DATA_SEED=$((6198 + 1000 * NODE_ID))
[ -x "$SPES" ] || { echo "run_single_node: $SPES not found; run 'make' first (or set SPES_BIN)" >&2; exit 1; }

args=("$CONFIG" "--spes_config.peer_id=$NODE_ID" "--data.seed=$DATA_SEED")
[ -n "${SERVER_ADDR:-}" ] && args+=("--spes_config.server_addr=$SERVER_ADDR")
[ -n "${THREADS:-}" ] && args+=("--threads=$THREADS")
[ "${NPROC_PER_NODE:-1}" != 1 ] && args+=("--nproc_per_node" "$NPROC_PER_NODE")
if [ "$RESUME" = true ]; then
  args+=("--resume")
else
  args+=("--try_load_latest_save=false")
  [ -n "${LOAD_PATH:-}" ] && args+=("--load_path=$LOAD_PATH")
fi
echo "SPES node $NODE_ID: config $CONFIG, data seed $DATA_SEED, resume $RESUME"
exec "$SPES" train "${args[@]}" "$@"
