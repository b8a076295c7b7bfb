#!/usr/bin/env bash
# Starts the SPES parameter server (the reference's run_parameter_server.sh, same variables).
#   TOTAL_PEERS=4 NUM_TRAIN_EXPERTS_PER_NODE=2 PORT=50051 scripts/run_parameter_server.sh [extra spes server flags]
# Extra flags pass through, e.g. --state_dir DIR, --mode fedavg, --keep_steps 4.
# Outer optimizer (docs/sync.md): CONFIG (the peers' config) gives spes_config.outer_lr and
# outer_momentum (`spes server --config`); OUTER_LR / OUTER_MOMENTUM, when set, override it. Neither:
# lr 1, momentum 0 (off, the plain mean). Peers whose config expects other values are refused.
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
outer=()
[ -n "${CONFIG:-}" ] && outer+=(--config "$CONFIG")
[ -n "${OUTER_LR:-}" ] && outer+=(--outer_lr "$OUTER_LR")
[ -n "${OUTER_MOMENTUM:-}" ] && outer+=(--outer_momentum "$OUTER_MOMENTUM")
outer_text="from ${CONFIG:-no config (lr 1, momentum 0: off)}"
[ -n "${OUTER_LR:-}${OUTER_MOMENTUM:-}" ] && outer_text="$outer_text; given: lr ${OUTER_LR:-as above}, momentum ${OUTER_MOMENTUM:-as above}"
[ -x "$SPES" ] || { echo "run_parameter_server: $SPES not found; run 'make' first (or set SPES_BIN)" >&2; exit 1; }

cat <<INFO
SPES parameter server
  peers            $TOTAL_PEERS ($NUM_TRAIN_EXPERTS_PER_NODE experts each, mode $MODE)
  listening on     $HOST:$PORT
  expert merging   every $MERGE_INTERVAL steps, alpha $MERGE_ALPHA_START decaying to 0 at step $MERGE_DECAY_STEPS, top-$MERGE_TOPK
  outer optimizer  $outer_text
INFO
exec "$SPES" server --total_peers "$TOTAL_PEERS" --num_train_experts_per_node "$NUM_TRAIN_EXPERTS_PER_NODE" \
  --host "$HOST" --port "$PORT" --mode "$MODE" --merge_interval "$MERGE_INTERVAL" \
  --merge_alpha_start "$MERGE_ALPHA_START" --merge_decay_steps "$MERGE_DECAY_STEPS" --merge_topk "$MERGE_TOPK" \
  ${outer[@]+"${outer[@]}"} "$@"
