#!/usr/bin/env bash
# Gradient buckets overlapped with the backward (ddp.overlap_grad_reduce, docs/distributed.md).
# The tiny MoE of dist_train_parity.sh, 5 steps, small buckets (15 per step) so that buckets
# really start while the backward runs. For 2 and 3 ranks and DDP / ZeRO-1:
#   - overlap on (the default) starts buckets during the backward (the log says how many) and
#     overlap off starts none there;
#   - both give the same bits (loss log, weights, moments): the same MPI calls on the same data;
#   - both agree with 1 rank within fp32 reduction order, step 1's losses bit for bit.
# And a job where a rank computes no micro-batch (global batch 4 = 2 micro-batches over 3
# ranks: rank 0 has none) starts its buckets in the same order as the others, so it neither
# hangs nor mismatches collectives: it equals 1 rank within tolerance (and the start says it;
# the MFU is the node's, not idle rank 0's 0). A config warning is printed once, not per rank. ZeRO-2 and ZeRO-3 have
# no buckets (each part's gradients are reduce-scattered right after its backward; with the
# flag, while the part below runs its backward into a second buffer): the same bits with the
# flag on and off and as each other; ZeRO-3 the same bits with its next-part prefetch
# (fsdp.prefetch) on and off; a rank without micro-batches replays a pass of reductions (and,
# under ZeRO-3, part gathers: model_hook_replay).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"

started() {   # started NAME: buckets the hooks started in the first step, from rank 0's log
  sed -n 's/.*dist: step 1: \([0-9]*\) of \([0-9]*\) gradient buckets started during the backward.*/\1 \2/p' "$tmp/$1.log"
}

small="--ddp.bucket_cap_mb=0.01"
dist_train one 1
for n in 2 3; do
  for s in NO_SHARD SHARD_OPTIM; do
    on="on_${s}_$n" off="off_${s}_$n"
    dist_train "$on" "$n" --fsdp.sharding_strategy=$s $small
    dist_train "$off" "$n" --fsdp.sharding_strategy=$s $small --ddp.overlap_grad_reduce=false
    read -r early total <<<"$(started "$on")"
    echo "$on: $early of $total buckets started during the backward"
    [ -n "$total" ] && [ "$total" -ge 10 ] && [ "$early" -ge 2 ] || { echo "FAIL: $on did not overlap"; cat "$tmp/$on.log"; exit 1; }
    grep -q "overlapped with the backward" "$tmp/$on.log" || { echo "FAIL: $on start line"; exit 1; }
    [ "$(started "$off")" = "0 $total" ] || { echo "FAIL: $off started buckets during the backward"; cat "$tmp/$off.log"; exit 1; }
    grep -q "reduced after the backward" "$tmp/$off.log" || { echo "FAIL: $off start line"; exit 1; }
    dist_check "$off" "$on" 5 --tol 0 --exact-steps 5
    dist_check one "$on" 5 --tol 1e-5 --exact-steps 1
  done
  for z in 2 3; do
    s=$([ $z = 2 ] && echo SHARD_GRAD_OP || echo FULL_SHARD)
    dist_train "z${z}_$n" "$n" --fsdp.sharding_strategy=$s $small
    dist_train "z${z}off_$n" "$n" --fsdp.sharding_strategy=$s $small --ddp.overlap_grad_reduce=false --fsdp.prefetch=false
    grep -q "strategy zero$z; .*reduce-scattered right after its backward (no buckets), overlapped with the next part" \
      "$tmp/z${z}_$n.log" && grep -q "part gradient buffers (2, overlap)" "$tmp/z${z}_$n.log" ||
      { echo "FAIL: z${z}_$n start lines"; exit 1; }
    grep -q "(no buckets), waited for before the backward goes on" "$tmp/z${z}off_$n.log" ||
      { echo "FAIL: z${z}off_$n start line"; exit 1; }
    dist_check "z${z}_$n" "z${z}off_$n" 5 --tol 0 --exact-steps 5
  done
  grep -q "part buffers (2, prefetch)" "$tmp/z3_$n.log" && ! grep -q "(2, prefetch)" "$tmp/z3off_$n.log" &&
    grep -q "dist: step 1: [0-9]* part gathers on this rank, 0 of them prefetched" "$tmp/z3off_$n.log" ||
    { echo "FAIL: z3_$n prefetch lines"; exit 1; }
  read -r gathers prefetched <<<"$(sed -n 's/.*dist: step 1: \([0-9]*\) part gathers on this rank, \([0-9]*\) of them prefetched.*/\1 \2/p' "$tmp/z3_$n.log" | head -1)"
  echo "z3_$n: $gathers part gathers in step 1, $prefetched prefetched"
  [ -n "$prefetched" ] && [ "$prefetched" -ge 4 ] || { echo "FAIL: z3_$n prefetched $prefetched part gathers"; exit 1; }
  # the prefetch alone, without the gradient overlap
  dist_train "z3pf_$n" "$n" --fsdp.sharding_strategy=FULL_SHARD $small --ddp.overlap_grad_reduce=false
  dist_check "z3_$n" "z3pf_$n" 5 --tol 0 --exact-steps 5
  dist_check "z2_$n" "z3_$n" 5 --tol 0 --exact-steps 5
  dist_check one "z2_$n" 5 --tol 1e-5 --exact-steps 1
done

# A rank without micro-batches: global batch 4 in micro-batches of 2 over 3 ranks.
dist_train one_b4 1 --global_train_batch_size=4
dist_train idle_3 3 --global_train_batch_size=4 --fsdp.sharding_strategy=SHARD_GRAD_OP $small
dist_check one_b4 idle_3 5 --tol 1e-5 --exact-steps 1
dist_train idle_3_z3 3 --global_train_batch_size=4 --fsdp.sharding_strategy=FULL_SHARD $small
dist_check idle_3 idle_3_z3 5 --tol 0 --exact-steps 5
dist_train idle_3_ddp 3 --global_train_batch_size=4 --distributed_strategy=ddp $small $small
dist_check one_b4 idle_3_ddp 5 --tol 1e-5 --exact-steps 1
# A config warning (here: a key given twice on the command line) is rank 0's to say, once.
warned=$(grep -c "command line --ddp.bucket_cap_mb: given more than once" "$tmp/idle_3_ddp.log" || true)
[ "$warned" = 1 ] || { echo "FAIL: the config warning printed $warned times by 3 ranks"; cat "$tmp/idle_3_ddp.log"; exit 1; }
# The idle rank is said at the start (micro-batches that divide over the ranks say nothing),
# and the MFU rank 0 logs is the node's: it was rank 0's own, 0 while it computed nothing.
grep -q "warn\] dist: the step's 2 micro-batches .* do not divide over 3 ranks: 2 compute 1, 1 computes none (idle)" \
  "$tmp/idle_3.log" || { echo "FAIL: no uneven-shares warning"; cat "$tmp/idle_3.log"; exit 1; }
! grep -q "do not divide" "$tmp/on_NO_SHARD_3.log" "$tmp/on_NO_SHARD_2.log" || { echo "FAIL: warned of even shares"; exit 1; }
python3 - "$tmp/idle_3/metrics.jsonl" <<'PY' || { echo "FAIL: MFU of the idle-rank-0 run"; exit 1; }
import json, sys
mfu = [json.loads(l)["perf"]["mfu"] for l in open(sys.argv[1]) if '"perf"' in l]
assert len(mfu) == 5 and all(x > 0 for x in mfu), mfu
PY
echo "dist_overlap: OK"
