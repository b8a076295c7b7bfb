#!/usr/bin/env bash
# Starts the SPES parameter server (the reference's run_parameter_server.sh, same variables).
#   TOTAL_PEERS=4 NUM_TRAIN_EXPERTS_PER_NODE=2 PORT=50051 scripts/run_parameter_server.sh [extra spes server flags]
# Extra flags pass through, e.g. --state_dir DIR, --mode fedavg, --keep_steps 4.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPES=${SPES_BIN:-$ROOT/build/spes}
TOTAL_PEERS=${TOTAL_PEERS:-4}
NUM_TRAIN_EXPERTS_PER_NODE=${NUM_TRAIN_EXPERTS_PER_NODE:-2}
HOST=${HOST:-0.0.0.0}
PORT=${PORT:-50051}
MODE=${MODE:-spes}
MERGE_INTERVAL=${MERGE_INTERVAL:-500}
MERGE_ALPHA_START=${MERGE_ALPHA_START:-0.01}
MERGE_DECAY_STEPS=${MERGE_DECAY_STEPS:-10000}
MERGE_TOPK=${MERGE_TOPK:-4}
OUTER_LR=${OUTER_LR:-1}              # outer optimizer (docs/sync.md); 1 and 0: off, the plain mean
OUTER_MOMENTUM=${OUTER_MOMENTUM:-0}
[ -x "$SPES" ] || { echo "run_parameter_server: $SPES not found; run 'make' first (or set SPES_BIN)" >&2; exit 1; }

cat <<INFO
SPES parameter server
  peers            $TOTAL_PEERS ($NUM_TRAIN_EXPERTS_PER_NODE experts each, mode $MODE)
  listening on     $HOST:$PORT
  expert merging   every $MERGE_INTERVAL steps, alpha $MERGE_ALPHA_START decaying to 0 at step $MERGE_DECAY_STEPS, top-$MERGE_TOPK
  outer optimizer  lr $OUTER_LR, momentum $OUTER_MOMENTUM
INFO
exec "$SPES" server --total_peers "$TOTAL_PEERS" --num_train_experts_per_node "$NUM_TRAIN_EXPERTS_PER_NODE" \
  --host "$HOST" --port "$PORT" --mode "$MODE" --merge_interval "$MERGE_INTERVAL" \
  --merge_alpha_start "$MERGE_ALPHA_START" --merge_decay_steps "$MERGE_DECAY_STEPS" --merge_topk "$MERGE_TOPK" \
  --outer_lr "$OUTER_LR" --outer_momentum "$OUTER_MOMENTUM" "$@"
