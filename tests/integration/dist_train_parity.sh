#!/usr/bin/env bash
# Data parallelism inside a node (docs/distributed.md): N ranks train what 1 rank trains.
# A tiny MoE, global batch 12 in micro-batches of 2 (6 per step), 5 steps with warm-up,
# cosine, clipping and weight decay, 1 thread per rank. For N = 2 and 3 and every strategy
# (ddp, SHARD_OPTIM = ZeRO-1, SHARD_GRAD_OP = ZeRO-2, FULL_SHARD, which runs as ZeRO-2):
#   - the loss log equals 1 rank's: step 1's losses bit for bit (every micro-batch holds the
#     same instances as on 1 rank), later steps and grad norms within fp32 reduction order;
#   - weights and AdamW moments within 1e-5 of 1 rank's; one full-model checkpoint, same files;
#   - ZeRO-1 equals DDP bit for bit (same all-reduce, element-wise AdamW on shards), and
#     FULL_SHARD equals SHARD_GRAD_OP bit for bit;
# plus N = 4 (6 micro-batches over 4 ranks: uneven shares), small gradient buckets, the
# optimizer-state offload (same bits), resume at another world size
# (2 -> 1, 1 -> 3, 3 -> 2 with a sharded optimizer state saved and reloaded), and a job whose
# config names distributed_strategy: single with 2 ranks fails with a message.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"


dist_train one 1
for n in 2 3; do
  dist_train "ddp$n" "$n" --distributed_strategy=ddp
  dist_train "z1_$n" "$n" --fsdp.sharding_strategy=SHARD_OPTIM
  dist_train "z2_$n" "$n" --fsdp.sharding_strategy=SHARD_GRAD_OP
  dist_train "z3_$n" "$n" --fsdp.sharding_strategy=FULL_SHARD
  grep -q "dist: $n ranks, strategy ddp" "$tmp/ddp$n.log" || { echo "FAIL: ddp$n did not run $n ranks"; cat "$tmp/ddp$n.log"; exit 1; }
  grep -q "strategy zero1" "$tmp/z1_$n.log" && grep -q "strategy zero2" "$tmp/z2_$n.log" || { echo "FAIL: strategies"; exit 1; }
  grep -q "FULL_SHARD: parameter sharding (ZeRO-3) is not implemented" "$tmp/z3_$n.log" || { echo "FAIL: no FULL_SHARD warning"; exit 1; }
  for s in "ddp$n" "z1_$n" "z2_$n" "z3_$n"; do dist_check one "$s" 5 --tol 1e-5 --exact-steps 1; done
  dist_check "ddp$n" "z1_$n" 5 --tol 0 --exact-steps 5
  dist_check "z2_$n" "z3_$n" 5 --tol 0 --exact-steps 5
  # only rank 0 writes: one metrics line per step
  [ "$(grep -c '"loss"' "$tmp/z2_$n/metrics.jsonl")" = 5 ] || { echo "FAIL: metrics lines"; exit 1; }
done
dist_train ddp4 4 --distributed_strategy=ddp
dist_check one ddp4 5 --tol 1e-5 --exact-steps 1
# Small buckets (2500 values: 15 collectives per step, shards straddling buckets): with 2 ranks
# the sums are the same bits (a + b), with 3 within tolerance.
dist_train z2b_2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --ddp.bucket_cap_mb=0.01
dist_check z2_2 z2b_2 5 --tol 0 --exact-steps 5
dist_train z1b_3 3 --fsdp.sharding_strategy=SHARD_OPTIM --ddp.bucket_cap_mb=0.01
dist_check one z1b_3 5 --tol 1e-5 --exact-steps 1

# Optimizer-state offload (optimizer.cpu_offload): on the cpu backend the update runs through the
# offload path's host copies and must give the same bits, on 1 rank and on ZeRO-2 shards; its
# state saves and resumes without offload at another world size.
dist_train one_off 1 --optimizer.cpu_offload=true
grep -q "optimizer.cpu_offload on the cpu backend" "$tmp/one_off.log" || { echo "FAIL: no offload note"; exit 1; }
grep -q "optimizer state [0-9.]* MB (host memory, offloaded)" "$tmp/one_off.log" || { echo "FAIL: no offload memory line"; exit 1; }
dist_check one one_off 5 --tol 0 --exact-steps 5
dist_train z2off_2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --optimizer.cpu_offload=true
dist_check z2_2 z2off_2 5 --tol 0 --exact-steps 5
dist_train resoff 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --optimizer.cpu_offload=true --stop_at=3
dist_train resoff 1 --resume
dist_check one resoff 5 --tol 1e-5 --exact-steps 1

# Resume at another world size, the optimizer state saved whole and re-sharded.
dist_train res21 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --stop_at=3
dist_train res21 1 --resume
dist_check one res21 5 --tol 1e-5 --exact-steps 1
dist_train res13 1 --stop_at=3
dist_train res13 3 --resume --fsdp.sharding_strategy=SHARD_OPTIM
dist_check one res13 5 --tol 1e-5 --exact-steps 3   # steps 1-3 ran on 1 rank: identical
dist_train res32 3 --fsdp.sharding_strategy=SHARD_GRAD_OP --stop_at=3
dist_train res32 2 --resume --fsdp.sharding_strategy=SHARD_GRAD_OP
dist_check one res32 5 --tol 1e-5 --exact-steps 1
grep -q "resumed from" "$tmp/res32.log" || { echo "FAIL: res32 did not resume"; exit 1; }

# distributed_strategy: single with 2 ranks: an error naming the key, no hang.
if timeout 60 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/single" --nproc_per_node 2 \
     --distributed_strategy=single >"$tmp/single.log" 2>&1; then
  echo "FAIL: distributed_strategy single with 2 ranks succeeded"; exit 1
fi
grep -q "distributed_strategy is single but the job has 2 ranks" "$tmp/single.log" || { echo "FAIL: message"; cat "$tmp/single.log"; exit 1; }
echo "dist_train_parity: OK"
