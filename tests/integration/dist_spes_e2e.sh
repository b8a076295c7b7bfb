#!/usr/bin/env bash
# SPES with ranks inside each node: a parameter server and 2 peers of 2 ranks each (peer 0
# DDP, peer 1 ZeRO-2), 2 experts per peer, 6 steps syncing every 2. Rank 0 of each peer talks
# to the server; the aggregate reaches rank 1 by broadcast. Checked against the same run with
# 1 rank per peer (same global batch): the same loss logs (step 1 bit for bit) and weights
# within fp32 reduction-order tolerance; after every sync both peers hold byte-identical
# weights. A rank 1 that missed the aggregate would train from other weights and diverge.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
SPES=$SPES_BIN
DATA=${SPES_TEST_DATA:-../shared/data}
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt"; exit 77; }
require_mpirun
dir=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
. tests/integration/lib/reliability.sh
reliability_data

# run NAME NPROC0 NPROC1: a server and 2 peers; peer p's save folder $dir/NAME/peer<p>.
run() {
  local name=$1 n0=$2 n1=$3
  mkdir -p "$dir/$name"
  port=$(( 20000 + RANDOM % 20000 ))
  "$SPES" server --total_peers 2 --num_train_experts_per_node 2 --host 127.0.0.1 --port "$port" \
    >"$dir/$name/server.log" 2>&1 &
  server_pid=$!
  local pids=() p n strategy
  for p in 0 1; do
    n=$n0; strategy=--distributed_strategy=ddp
    # peer 1: ZeRO-2 in small buckets, frozen experts between trainable tensors (not contiguous)
    if [ $p = 1 ]; then n=$n1; strategy="--fsdp.sharding_strategy=SHARD_GRAD_OP --ddp.bucket_cap_mb=0.05"; fi
    "$SPES" train configs/tiny_shakespeare.yaml --nproc_per_node "$n" $strategy \
      --data.paths="[$dir/file_list.txt]" --data.seed=$((6198 + 1000 * p)) \
      --using_spes=true --spes_config.num_peers=2 --spes_config.peer_id=$p \
      --spes_config.num_train_experts_per_node=2 --spes_config.sync_steps=2 \
      --spes_config.server_addr=127.0.0.1:$port --spes_config.using_decayed_aux_loss=true \
      --max_duration=6 --scheduler.t_warmup=2 --global_train_batch_size=4 --device_train_microbatch_size=2 \
      --save_folder="$dir/$name/peer$p" --save_interval_unsharded=2 --save_num_unsharded_checkpoints_to_keep=-1 \
      --eval_interval=1000 --try_load_latest_save=false --threads=1 >"$dir/$name/peer$p.log" 2>&1 &
    pids+=($!)
  done
  local status=0
  for p in 0 1; do
    if ! timeout 300 tail --pid="${pids[$p]}" -f /dev/null; then echo "peer $p of $name timed out"; status=1; fi
    wait "${pids[$p]}" || { echo "peer $p of $name failed:"; tail -20 "$dir/$name/peer$p.log"; status=1; }
  done
  kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true
  server_pid=""
  [ $status -eq 0 ] || { tail -20 "$dir/$name/server.log"; exit 1; }
  for step in 2 4 6; do
    cmp -s "$dir/$name/peer0/step$step/model.safetensors" "$dir/$name/peer1/step$step/model.safetensors" ||
      { echo "$name step $step: the peers' weights differ after the sync"; exit 1; }
  done
  grep -q "sync step 6" "$dir/$name/peer0.log" || { echo "$name: peer 0 never reported sync step 6"; exit 1; }
}

run single 1 1
run ranks 2 2
grep -q "dist: 2 ranks, strategy ddp" "$dir/ranks/peer0.log" && grep -q "dist: 2 ranks, strategy zero2" "$dir/ranks/peer1.log" ||
  { echo "FAIL: the peers did not run 2 ranks each"; exit 1; }
[ "$(grep -c "connected to" "$dir/ranks/peer0.log")" = 1 ] || { echo "FAIL: more than one rank of peer 0 connected to the server"; exit 1; }
for p in 0 1; do
  echo "-- peer $p: 2 ranks vs 1 rank"
  python3 tests/integration/lib/dist_compare.py "$dir/single/peer$p" "$dir/ranks/peer$p" 6 --tol 1e-5 --exact-steps 1 ||
    { echo "FAIL: peer $p with 2 ranks differs from 1 rank"; exit 1; }
done
echo "dist_spes_e2e: OK"
