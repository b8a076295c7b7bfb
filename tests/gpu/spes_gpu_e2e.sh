#!/usr/bin/env bash
# SPES end to end on one GPU: a parameter server and 2 `spes train` peers on 127.0.0.1 that
# share the GPU (amp_bf16), each owning 2 of the 4 experts per layer of the byte-level
# tinyshakespeare MoE, 3 sync rounds (steps 2, 4, 6; expert merging on step 4). The helpers
# of tests/integration/spes_train_e2e.sh (tests/integration/lib/reliability.sh) start them;
# their 4-peer/1-expert layout is overridden by later flags (the last value wins). Checked:
#  - both peers ran on the GPU;
#  - after every sync both peers hold byte-identical weights (their checkpoints of that step),
#    equal to the aggregate they downloaded;
#  - shared tensors are the mean of the uploads, experts their owners' uploads (merged on the
#    merge step), recomputed with numpy from the peers' audit logs (tests/ref/check_sync_e2e.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/lib/gpu.sh
require_gpu
SPES=$SPES_BIN
DATA=${SPES_TEST_DATA:-../shared/data}
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt (set SPES_TEST_DATA)"; exit 77; }
require_venv numpy safetensors

dir=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

. tests/integration/lib/reliability.sh
reliability_data
reliability_server --total_peers 2 --num_train_experts_per_node 2 \
  --merge_interval 4 --merge_alpha_start 0.5 --merge_decay_steps 100 --merge_topk 2

mkdir -p "$dir/sync"
export SPES_SYNC_LOG_DIR="$dir/sync"
pids=()
for peer in 0 1; do
  # 6 steps, a checkpoint every 2
  reliability_peer $peer "$port" 6 "$dir/peer$peer" "$dir/peer$peer.log" 2 \
    --spes_config.num_peers=2 --spes_config.num_train_experts_per_node=2 --device="$GPU_DEVICE" --precision=amp_bf16
  pids+=("$last_pid")
done
status=0
for i in 0 1; do wait "${pids[$i]}" || { echo "peer $i failed:"; tail -20 "$dir/peer$i.log"; status=1; }; done
[ $status -eq 0 ] || { echo "server log:"; tail -20 "$dir/server.log"; exit 1; }
for peer in 0 1; do
  grep -q "device: $GPU_DEVICE" "$dir/peer$peer.log" || { echo "peer $peer did not run on $GPU_DEVICE:"; head -20 "$dir/peer$peer.log"; exit 1; }
done

peers_match_aggregate "$dir" 2 2 4 6
grep -q "sync step 6" "$dir/peer0.log" || { echo "peer 0 never reported sync step 6"; exit 1; }
# Mean / ownership / merge maths from the audit logs (2 peers, 2 experts each, merge every 4, alpha 0.5, top-2).
"$SPES_VENV_PY" tests/ref/check_sync_e2e.py "$dir/sync" 2 2 4 0.5 100 2 2 4 6
