#!/usr/bin/env bash
# SPES with ranks inside each node: a parameter server and 2 peers of 2 ranks each (peer 0
# ZeRO-3, peer 1 ZeRO-2), 2 experts per peer, 6 steps syncing every 2. Rank 0 of each peer
# talks to the server; the aggregate reaches rank 1 by broadcast (under ZeRO-3 the full
# parameters are gathered for the sync and sharded again after). Checked against the same run
# with 1 rank per peer (same global batch): the same loss logs (step 1 bit for bit) and weights
# within fp32 reduction-order tolerance; after every sync both peers hold byte-identical
# weights. A rank 1 that missed the aggregate would train from other weights and diverge.
# Then the same with overlapped sync (peer 0 DDP, peer 1 ZeRO-3), each round applied one step
# after its upload (SPES_OVERLAP_APPLY_AFTER=1: a step that is not a sync step, where rank 0
# alone changes its weights and must broadcast them), against 1 rank per peer doing the same.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
. tests/integration/lib/reliability.sh
reliability_begin
require_mpirun

reliability_data

# run NAME NPROC0 STRATEGY0 NPROC1 STRATEGY1 [flags for both peers]: a server and 2 peers;
# peer p's save folder $dir/NAME/peer<p>. Checkpoints every 2 steps unless flags say otherwise.
run() {
  local name=$1 n0=$2 s0=$3 n1=$4 s1=$5
  shift 5
  mkdir -p "$dir/$name"
  port=$(( 20000 + RANDOM % 20000 ))
  "$SPES" server --total_peers 2 --num_train_experts_per_node 2 --host 127.0.0.1 --port "$port" \
    >"$dir/$name/server.log" 2>&1 &
  server_pid=$!
  local pids=() p n strategy
  for p in 0 1; do
    n=$n0; strategy=$s0
    if [ $p = 1 ]; then n=$n1; strategy=$s1; fi
    # small buckets: frozen experts sit between trainable tensors (a layout that is not contiguous)
    "$SPES" train configs/tiny_shakespeare.yaml --nproc_per_node "$n" $strategy \
      --data.paths="[$dir/file_list.txt]" --data.seed=$((6198 + 1000 * p)) \
      --using_spes=true --spes_config.num_peers=2 --spes_config.peer_id=$p \
      --spes_config.num_train_experts_per_node=2 --spes_config.sync_steps=2 \
      --spes_config.server_addr=127.0.0.1:$port --spes_config.using_decayed_aux_loss=true \
      --max_duration=6 --scheduler.t_warmup=2 --global_train_batch_size=4 --device_train_microbatch_size=2 \
      --save_folder="$dir/$name/peer$p" --save_interval_unsharded=2 --save_num_unsharded_checkpoints_to_keep=-1 \
      --eval_interval=1000 --try_load_latest_save=false --threads=1 $strategy --ddp.bucket_cap_mb=0.05 "$@" \
      >"$dir/$name/peer$p.log" 2>&1 &
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
  local steps="2 4 6"
  [ "${SPES_OVERLAP_APPLY_AFTER:-}" ] && steps=6   # overlapped: the peers agree after the last (blocking) round
  for step in $steps; do
    cmp -s "$dir/$name/peer0/step$step/model.safetensors" "$dir/$name/peer1/step$step/model.safetensors" ||
      { echo "$name step $step: the peers' weights differ after the sync"; exit 1; }
  done
  grep -q "sync step 6" "$dir/$name/peer0.log" || { echo "$name: peer 0 never reported sync step 6"; exit 1; }
}

# compare A B: each peer of run B (2 ranks) against run A (1 rank)
compare() {
  for p in 0 1; do
    echo "-- peer $p: $2 vs $1"
    python3 tests/integration/lib/dist_compare.py "$dir/$1/peer$p" "$dir/$2/peer$p" 6 --tol 1e-5 --exact-steps 1 ||
      { echo "FAIL: peer $p of $2 differs from $1"; exit 1; }
  done
}
ddp=--distributed_strategy=ddp z2=--fsdp.sharding_strategy=SHARD_GRAD_OP z3=--fsdp.sharding_strategy=FULL_SHARD
run single 1 "$ddp" 1 "$ddp"
run ranks 2 "$z3" 2 "$z2"
grep -q "dist: 2 ranks, strategy zero3" "$dir/ranks/peer0.log" && grep -q "dist: 2 ranks, strategy zero2" "$dir/ranks/peer1.log" ||
  { echo "FAIL: the peers did not run 2 ranks each"; exit 1; }
[ "$(grep -c "connected to" "$dir/ranks/peer0.log")" = 1 ] || { echo "FAIL: more than one rank of peer 0 connected to the server"; exit 1; }
compare single ranks

export SPES_OVERLAP_APPLY_AFTER=1
overlap="--spes_config.sync_overlap=true --save_interval_unsharded=3"
run single_ov 1 "$ddp" 1 "$ddp" $overlap
run ranks_ov 2 "$ddp" 2 "$z3" $overlap
for p in 0 1; do
  grep -q "applied at step 3" "$dir/ranks_ov/peer$p.log" && grep -q "applied at step 5" "$dir/ranks_ov/peer$p.log" ||
    { echo "FAIL: peer $p did not apply its overlapped rounds at steps 3 and 5"; grep "sync step" "$dir/ranks_ov/peer$p.log"; exit 1; }
done
compare single_ov ranks_ov
echo "dist_spes_e2e: OK"
