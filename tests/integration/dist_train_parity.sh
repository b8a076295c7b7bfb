#!/usr/bin/env bash
# Data parallelism inside a node (docs/distributed.md): N ranks train what 1 rank trains.
# A tiny MoE, global batch 12 in micro-batches of 2 (6 per step), 5 steps with warm-up,
# cosine, clipping and weight decay, 1 thread per rank. For N = 2 and 3 and every strategy
# (ddp, SHARD_OPTIM = ZeRO-1, SHARD_GRAD_OP = ZeRO-2, FULL_SHARD = ZeRO-3):
#   - the loss log equals 1 rank's: step 1's losses bit for bit (every micro-batch holds the
#     same instances as on 1 rank), later steps and grad norms within fp32 reduction order;
#   - weights and AdamW moments within 1e-5 of 1 rank's; one full-model checkpoint, same files;
#   - ZeRO-1 equals DDP bit for bit (same all-reduce, element-wise AdamW on shards); ZeRO-3
#     equals ZeRO-2 bit for bit (the same per-part reduce-scatters of each micro-batch; only
#     where the parameters live differs); ZeRO-2 equals DDP within tolerance (it sums each
#     micro-batch's gradients over ranks, then over micro-batches); ZeRO-2's rank holds less
#     gradient memory than ZeRO-1's and ZeRO-3's less parameter memory (the memory lines);
# plus N = 4 (6 micro-batches over 4 ranks: uneven shares; under ZeRO-3 the ranks with one
# micro-batch replay a pass of gathers), small gradient buckets, the optimizer-state offload
# (same bits), resume at another world size (2 -> 1, 1 -> 3, 3 -> 2 with a sharded optimizer
# state saved and reloaded, also from and to ZeRO-3), evaluations under ZeRO-3 (the full
# parameters gathered between steps: the same figures as ZeRO-2's), and a job whose config
# names distributed_strategy: single with 2 ranks fails with a message.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"
param_mb() {   # param_mb NAME: the parameter MB per rank of rank 0's memory line
  sed -n 's/.*memory per rank (cpu): parameters \([0-9.]*\) MB.*/\1/p' "$tmp/$1.log" | head -1
}
grad_mb() {   # grad_mb NAME: the gradient MB per rank of rank 0's memory line
  sed -n 's/.*memory per rank (cpu): .*gradients \([0-9.]*\) MB.*/\1/p' "$tmp/$1.log" | head -1
}


dist_train one 1
for n in 2 3; do
  dist_train "ddp$n" "$n" --distributed_strategy=ddp
  dist_train "z1_$n" "$n" --fsdp.sharding_strategy=SHARD_OPTIM
  dist_train "z2_$n" "$n" --fsdp.sharding_strategy=SHARD_GRAD_OP
  dist_train "z3_$n" "$n" --fsdp.sharding_strategy=FULL_SHARD
  grep -q "dist: $n ranks, strategy ddp" "$tmp/ddp$n.log" || { echo "FAIL: ddp$n did not run $n ranks"; cat "$tmp/ddp$n.log"; exit 1; }
  grep -q "strategy zero1" "$tmp/z1_$n.log" && grep -q "strategy zero2" "$tmp/z2_$n.log" &&
    grep -q "strategy zero3" "$tmp/z3_$n.log" || { echo "FAIL: strategies"; exit 1; }
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
# ZeRO-3 with 4 ranks (ranks 0 and 2 have one micro-batch of 6, the others two) and small buckets
dist_train z2b_4 4 --fsdp.sharding_strategy=SHARD_GRAD_OP --ddp.bucket_cap_mb=0.01
dist_train z3b_4 4 --fsdp.sharding_strategy=FULL_SHARD --ddp.bucket_cap_mb=0.01
dist_check z2b_4 z3b_4 5 --tol 0 --exact-steps 5
dist_check one z3b_4 5 --tol 1e-5 --exact-steps 1
# One micro-batch per rank (6 rows each): ZeRO-2's per-micro-batch sums are ZeRO-1's sums (the
# same bits; the norm, summed from shards, may differ in its last double bit).
dist_train z1mb_2 2 --fsdp.sharding_strategy=SHARD_OPTIM --device_train_microbatch_size=6
dist_train z2mb_2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --device_train_microbatch_size=6
dist_check z1mb_2 z2mb_2 5 --tol 0 --exact-steps 5 --norm-tol 1e-15
# ZeRO-3 with activation checkpointing: whole_layer recomputes a layer's forward from the part
# gathered at PRE_BACKWARD
dist_train z2wl_3 3 --fsdp.sharding_strategy=SHARD_GRAD_OP --activation_checkpointing=whole_layer
dist_train z3wl_3 3 --fsdp.sharding_strategy=FULL_SHARD --activation_checkpointing=whole_layer
dist_check z2wl_3 z3wl_3 5 --tol 0 --exact-steps 5
dist_check z3_3 z3wl_3 5 --tol 0 --exact-steps 5   # recomputing changes no bit

# Gradient and parameter memory per rank: ZeRO-2/3's gradient shards and ZeRO-3's parameter
# shards (1/N of the trainable values) plus working buffers of the largest part. With 8 layers
# a part is small against the model, and 4 ranks hold less than the full gradient buffer of
# ZeRO-1 and the full parameters of ZeRO-2.
dist_train mem_z1 4 --fsdp.sharding_strategy=SHARD_OPTIM --model.n_layers=8 --max_duration=3
dist_train mem_z2 4 --fsdp.sharding_strategy=SHARD_GRAD_OP --model.n_layers=8 --max_duration=3
dist_train mem_z3 4 --fsdp.sharding_strategy=FULL_SHARD --model.n_layers=8 --max_duration=3
p2=$(param_mb mem_z2) p3=$(param_mb mem_z3) g1=$(grad_mb mem_z1) g2=$(grad_mb mem_z2) g3=$(grad_mb mem_z3)
echo "per rank, 8 layers, 4 ranks: parameters zero2 $p2 MB, zero3 $p3 MB; gradients zero1 $g1 MB, zero2 $g2 MB, zero3 $g3 MB"
python3 -c "import sys; sys.exit(0 if float('$p3') < 0.6 * float('$p2') else 1)" || { echo "FAIL: zero3 holds no less parameter memory"; exit 1; }
python3 -c "import sys; sys.exit(0 if float('$g2') < 0.6 * float('$g1') else 1)" || { echo "FAIL: zero2 holds no less gradient memory"; exit 1; }
[ "$g2" = "$g3" ] || { echo "FAIL: zero2 and zero3 gradients differ in size"; exit 1; }

# Evaluations between steps: under ZeRO-3 every rank gathers the full parameters, rank 0
# evaluates; the figures are ZeRO-2's and 1 rank's within tolerance.
cp "$tmp/tiny.yaml" "$tmp/tiny_eval.yaml"
printf 'evaluators:\n  - label: val\n    type: lm\n    data:\n      paths: [%s]\neval_interval: 2\ndevice_eval_batch_size: 8\n' \
  "$tmp/tokens.npy" >> "$tmp/tiny_eval.yaml"
eval_run() {   # eval_run NAME NPROC [overrides]
  local name=$1 n=$2; shift 2
  timeout 300 "$SPES_BIN" train "$tmp/tiny_eval.yaml" --save_folder="$tmp/$name" --nproc_per_node "$n" "$@" \
    >"$tmp/$name.log" 2>&1 || { echo "FAIL: $name"; tail -30 "$tmp/$name.log"; exit 1; }
  grep '"eval"' "$tmp/$name/metrics.jsonl" | sed 's/,"seconds":[^,}]*//'
}
e1=$(eval_run eval1 1) e2=$(eval_run eval_z2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP)
e3=$(eval_run eval_z3 2 --fsdp.sharding_strategy=FULL_SHARD)
[ "$(echo "$e3" | wc -l)" = 3 ] || { echo "FAIL: zero3 wrote $(echo "$e3" | wc -l) eval lines, expected 3 (steps 2, 4, 5)"; echo "$e3"; exit 1; }
for ref in "$e1" "$e2"; do
  python3 - "$ref" "$e3" <<'PY' || { echo "FAIL: zero3's evaluations differ from 1 rank's or zero2's"; exit 1; }
import json, sys
a, b = ([json.loads(l)["ce"] for l in x.splitlines()] for x in sys.argv[1:3])
assert len(a) == len(b) == 3 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (a, b)
PY
done

# Optimizer-state offload (optimizer.cpu_offload): on the cpu backend the update runs through the
# offload path's host copies and must give the same bits, on 1 rank and on ZeRO-2 shards; its
# state saves and resumes without offload at another world size.
dist_train one_off 1 --optimizer.cpu_offload=true
grep -q "optimizer.cpu_offload on the cpu backend" "$tmp/one_off.log" || { echo "FAIL: no offload note"; exit 1; }
grep -q "optimizer state [0-9.]* MB (host memory, offloaded)" "$tmp/one_off.log" || { echo "FAIL: no offload memory line"; exit 1; }
dist_check one one_off 5 --tol 0 --exact-steps 5
dist_train z2off_2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --optimizer.cpu_offload=true
dist_check z2_2 z2off_2 5 --tol 0 --exact-steps 5
dist_train z3off_2 2 --fsdp.sharding_strategy=FULL_SHARD --optimizer.cpu_offload=true
dist_check z3_2 z3off_2 5 --tol 0 --exact-steps 5
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
# ZeRO-3 saves the same full checkpoint: 2 ranks of ZeRO-3 -> 1 rank, 1 rank -> 3 of ZeRO-3
dist_train res3_21 2 --fsdp.sharding_strategy=FULL_SHARD --stop_at=3
dist_train res3_21 1 --resume
dist_check one res3_21 5 --tol 1e-5 --exact-steps 1
dist_train res3_13 1 --stop_at=3
dist_train res3_13 3 --resume --fsdp.sharding_strategy=FULL_SHARD
dist_check one res3_13 5 --tol 1e-5 --exact-steps 3
grep -q "resumed from" "$tmp/res3_13.log" || { echo "FAIL: res3_13 did not resume"; exit 1; }

# distributed_strategy: single with 2 ranks: an error naming the key, no hang.
if timeout 60 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/single" --nproc_per_node 2 \
     --distributed_strategy=single >"$tmp/single.log" 2>&1; then
  echo "FAIL: distributed_strategy single with 2 ranks succeeded"; exit 1
fi
grep -q "distributed_strategy is single but the job has 2 ranks" "$tmp/single.log" || { echo "FAIL: message"; cat "$tmp/single.log"; exit 1; }
echo "dist_train_parity: OK"
