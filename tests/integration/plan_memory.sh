#!/usr/bin/env bash
# `spes plan`'s peak memory per rank against the backend's allocation high-water mark of real
# 2-rank runs (docs/plan.md): the tiny MoE of lib/dist_tiny.sh (5 steps, a checkpoint at the end)
# under ddp, ZeRO-1, ZeRO-2 and ZeRO-3 (with and without prefetch), a SPES peer (frozen experts:
# ZeRO-3's frozen store, ZeRO-1/2's all-gather bucket), activation_checkpointing modes and
# optimizer.cpu_offload. The trainer logs rank 0's measured peak ("memory: backend peak N bytes on
# this rank, planned M"); `spes plan --gpus 2 --json` with the same overrides must be within 5% of
# N (single-rank runs: tests/unit/test_train_plan.c). A run whose plan cannot fit is refused at
# start with the plan's table.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
tmp=$(mktemp -d)
server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"
# The SPES peers' server (2 peers of 2 experts): the peers only say Hello (sync_steps 100 > 5 steps).
port=$(( 20000 + RANDOM % 20000 ))
"$SPES_BIN" server --total_peers 2 --num_train_experts_per_node 2 --host 127.0.0.1 --port "$port" >"$tmp/server.log" 2>&1 &
server_pid=$!
spes_peer() { echo --using_spes=true --spes_config.num_peers=2 --spes_config.peer_id="$1" --spes_config.sync_steps=100 \
  --spes_config.server_addr=127.0.0.1:$port; }

check() {   # check NAME [overrides...]: train on 2 ranks, compare rank 0's peak with the plan's
  local name=$1
  shift
  dist_train "$name" 2 "$@"
  local measured planned
  measured=$(sed -n 's/.*memory: backend peak \([0-9]*\) bytes on this rank.*/\1/p' "$tmp/$name.log" | head -1)
  [ -n "$measured" ] || { echo "FAIL: $name logged no measured peak"; tail -20 "$tmp/$name.log"; exit 1; }
  planned=$("$SPES_BIN" plan "$tmp/tiny.yaml" --gpus 2 --json "$@" 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["memory"]["peak"])')
  python3 - "$name" "$planned" "$measured" <<'PY'
import sys
name, planned, measured = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ratio = planned / measured
print(f"{name:28s} planned {planned:10d}  measured {measured:10d}  ({ratio:.4f})")
if not 0.95 <= ratio <= 1.05:
    sys.exit(f"FAIL: {name}: the planned peak is {ratio:.4f} of the measured one")
PY
}

check ddp --distributed_strategy=ddp
check zero1 --fsdp.sharding_strategy=SHARD_OPTIM
check zero2 --fsdp.sharding_strategy=SHARD_GRAD_OP
check zero3 --fsdp.sharding_strategy=FULL_SHARD
check zero3_noprefetch --fsdp.sharding_strategy=FULL_SHARD --fsdp.prefetch=false --ddp.overlap_grad_reduce=false
check zero3_spes_whole_layer --fsdp.sharding_strategy=FULL_SHARD $(spes_peer 1) --activation_checkpointing=whole_layer
check zero1_spes_fine_grained --fsdp.sharding_strategy=SHARD_OPTIM $(spes_peer 0) --activation_checkpointing=fine_grained
check zero2_spes_offload --fsdp.sharding_strategy=SHARD_GRAD_OP $(spes_peer 1) --optimizer.cpu_offload=true
check ddp_offload_whole_layer --distributed_strategy=ddp --optimizer.cpu_offload=true --activation_checkpointing=whole_layer
