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
#    merge step), recomputed with numpy from the peers' audit logs (tests/ref/check_sync_e2e.py);
#  - the same run with optimizer.overlap_next_forward on both peers (each step's AdamW on a
#    second stream under the next forward, held 20 ms at each layer's update so that a missing
#    wait shows) leaves the same bytes in every checkpoint: the rounds read and replace the
#    weights only once the queued update is done.
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

# run_peers OUT [FLAGS...]: peers 0 and 1 on the GPU, 6 steps, a checkpoint every 2, into OUT/peer<p>
run_peers() {
  local out=$1 peer i status=0 pids=()
  shift
  for peer in 0 1; do
    reliability_peer $peer "$port" 6 "$out/peer$peer" "$out/peer$peer.log" 2 \
      --spes_config.num_peers=2 --spes_config.num_train_experts_per_node=2 --device="$GPU_DEVICE" --precision=amp_bf16 "$@"
    pids+=("$last_pid")
  done
  for i in 0 1; do wait "${pids[$i]}" || { echo "peer $i failed:"; tail -20 "$out/peer$i.log"; status=1; }; done
  [ $status -eq 0 ] || { echo "server log:"; tail -20 "$dir/server.log"; exit 1; }
  for peer in 0 1; do
    grep -q "device: $GPU_DEVICE" "$out/peer$peer.log" || { echo "peer $peer did not run on $GPU_DEVICE:"; head -20 "$out/peer$peer.log"; exit 1; }
  done
}

mkdir -p "$dir/sync"
export SPES_SYNC_LOG_DIR="$dir/sync"
run_peers "$dir"

peers_match_aggregate "$dir" 2 2 4 6
grep -q "sync step 6" "$dir/peer0.log" || { echo "peer 0 never reported sync step 6"; exit 1; }
# Mean / ownership / merge maths from the audit logs (2 peers, 2 experts each, merge every 4, alpha 0.5, top-2).
"$SPES_VENV_PY" tests/ref/check_sync_e2e.py "$dir/sync" 2 2 4 0.5 100 2 2 4 6

# The same run with each step's AdamW under the next forward: the same bytes at every checkpoint.
kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true
unset SPES_SYNC_LOG_DIR
reliability_server --total_peers 2 --num_train_experts_per_node 2 \
  --merge_interval 4 --merge_alpha_start 0.5 --merge_decay_steps 100 --merge_topk 2
mkdir -p "$dir/overlap"
export SPES_CUDA_AUX_DELAY_US=20000
run_peers "$dir/overlap" --optimizer.overlap_next_forward=true
unset SPES_CUDA_AUX_DELAY_US
grep -q "AdamW runs under the next step's forward" "$dir/overlap/peer0.log" || { echo "overlap not on"; head -30 "$dir/overlap/peer0.log"; exit 1; }
for peer in 0 1; do
  for step in 2 4 6; do
    for f in model.safetensors train_state.safetensors; do
      cmp "$dir/peer$peer/step$step/$f" "$dir/overlap/peer$peer/step$step/$f" ||
        { echo "peer $peer step $step: $f differs with optimizer.overlap_next_forward"; exit 1; }
    done
  done
done
echo "SPES on the GPU with optimizer.overlap_next_forward: every checkpoint the same bytes"
