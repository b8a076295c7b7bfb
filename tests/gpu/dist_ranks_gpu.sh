#!/usr/bin/env bash
# Data parallelism on the GPU (docs/distributed.md): the NCCL path with several ranks on ONE
# GPU, which NCCL allows from 2.30 on with NCCL_MULTI_RANK_GPU_ENABLE=1 (older NCCL refuses two
# ranks of one communicator on a device: ncclInvalidUsage). The tiny MoE of tests/gpu/lib/gpu.sh
# in fp32, 6 steps; 2 ranks on cuda:0 with DDP (gradient buckets overlapped with the backward,
# all-reduced through NCCL), ZeRO-2 (each part's gradients reduce-scattered through NCCL after
# its backward, parameters all-gathered after the update) and ZeRO-3 (each part also
# all-gathered through NCCL before it runs) against 1 rank on cuda:0: the loss log within 1e-4
# relative and the weights within 1e-4 absolute + relative (the GPU's fp32 reductions run in
# another order than 1 rank's accumulation), DDP against ZeRO-2 the same way, and ZeRO-3 against
# ZeRO-2 bit for bit (the same per-part reductions; the gathered parts are the same bits), also
# in amp_bf16 (the gathered part's compute copy), and ZeRO-3 with its gradient overlap and
# next-part prefetch against without them, bit for bit (the collectives on NCCL's stream
# while the backend's stream computes). Skipped (77) without a GPU, and with an NCCL
# older than 2.30 (the reason printed); the NCCL path with one rank is tests/gpu/test_dist_nccl.c,
# ZeRO-2/3 on one rank tests/gpu/test_sharded_params_gpu.c.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/lib/gpu.sh
require_gpu
require_mpirun
[ "$GPU_DEVICE" = cpu ] && { echo "SKIPPED: NCCL needs a GPU (SPES_GPU_TEST_DEVICE=cpu)"; exit 77; }
nccl=$("$SPES_BIN" version | sed -n 's/^nccl: //p')
[ -n "$nccl" ] || { echo "SKIPPED: this spes reports no NCCL"; exit 77; }
code=$(echo "$nccl" | awk -F. '{ print $1 * 10000 + $2 * 100 + $3 }')
if [ "$code" -lt 23000 ]; then
  echo "SKIPPED: NCCL $nccl < 2.30 refuses two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE needs 2.30)"
  exit 77
fi
echo "NCCL $nccl: two ranks on cuda:0 with NCCL_MULTI_RANK_GPU_ENABLE=1"
export NCCL_MULTI_RANK_GPU_ENABLE=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gpu_tiny_data "$tmp"
gpu_tiny_yaml "$tmp"

train() {   # train NAME NPROC [overrides] (fp32 unless an override sets --precision)
  local name=$1 n=$2
  shift 2
  timeout 120 "$SPES_BIN" train "$tmp/tiny.yaml" --device=cuda:0 --precision=fp32 --save_folder="$tmp/$name" \
    --nproc_per_node "$n" --ddp.bucket_cap_mb=0.01 "$@" >"$tmp/$name.log" 2>&1 ||
    { echo "FAIL: $name ($n ranks $*)"; tail -30 "$tmp/$name.log"; exit 1; }
}
train one 1
train ddp 2 --distributed_strategy=ddp
train zero2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP
train zero3 2 --fsdp.sharding_strategy=FULL_SHARD
train zero2_bf16 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --precision=amp_bf16
train zero3_bf16 2 --fsdp.sharding_strategy=FULL_SHARD --precision=amp_bf16
# ZeRO-3 with each reduction waited for at once and no prefetch: NCCL's stream used blocking
train zero3_seq 2 --fsdp.sharding_strategy=FULL_SHARD --ddp.overlap_grad_reduce=false --fsdp.prefetch=false
for run in ddp zero2 zero3 zero2_bf16 zero3_bf16 zero3_seq; do
  strategy=${run%_bf16}; strategy=${strategy%_seq}
  grep -q "dist: 2 ranks, strategy $strategy" "$tmp/$run.log" || { echo "FAIL: $run did not use 2 ranks"; exit 1; }
done
for run in ddp zero2 zero3; do
  echo "-- $run vs one"
  python3 tests/integration/lib/dist_compare.py "$tmp/one" "$tmp/$run" 6 --tol 1e-4 ||
    { echo "FAIL: $run on 2 ranks differs from 1 rank"; exit 1; }
done
echo "-- zero2 vs ddp"
python3 tests/integration/lib/dist_compare.py "$tmp/ddp" "$tmp/zero2" 6 --tol 1e-4 ||
  { echo "FAIL: zero2 differs from ddp"; exit 1; }
for p in "" _bf16; do
  echo "-- zero3$p vs zero2$p, bit for bit"
  python3 tests/integration/lib/dist_compare.py "$tmp/zero2$p" "$tmp/zero3$p" 6 --tol 0 --exact-steps 6 ||
    { echo "FAIL: zero3$p differs from zero2$p"; exit 1; }
done
echo "-- zero3 overlapped and prefetched vs waited for at once, bit for bit"
python3 tests/integration/lib/dist_compare.py "$tmp/zero3_seq" "$tmp/zero3" 6 --tol 0 --exact-steps 6 ||
  { echo "FAIL: zero3 with overlap and prefetch differs from without"; exit 1; }
grep -q "of them prefetched" "$tmp/zero3.log" && ! grep -q "0 of them prefetched" "$tmp/zero3.log" ||
  { echo "FAIL: zero3 prefetched no part"; exit 1; }
echo "dist_ranks_gpu: OK"
