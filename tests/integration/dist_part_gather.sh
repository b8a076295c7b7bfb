#!/usr/bin/env bash
# ZeRO-3's part gather and ZeRO-2/3's sharded gradients (src/parallel/) across ranks: the unit test
# tests/unit/test_dist_part_gather.c (which runs as one rank on its own) under mpirun with 2
# and 3 ranks, where the ZeRO-2 shards cut through the parts' tensors: every part gathered
# from the shards and the frozen store equals the full parameters bit for bit, and a training
# pass on gathered parts (model's own parameters NaN) equals the plain pass bit for bit.
# Each rank's gradient shard after a ZeRO-2 pass is N times the plain gradient, bit for bit. A
# NaN in one rank's gradient shard gives every rank a NaN norm (none skips the all-reduce).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_mpirun
BIN="${SPES_BUILD:-$PWD/build}/tests/test_dist_part_gather"
if [ ! -x "$BIN" ]; then
  echo "SKIPPED: $BIN not found (build first)"
  exit 77
fi
# As `spes --nproc_per_node` does (src/parallel/launch.c): CI runs as root in a container.
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 2 3; do
  if ! OMP_NUM_THREADS=1 timeout 300 mpirun -np "$n" --oversubscribe --bind-to none \
      --mca btl_vader_single_copy_mechanism none "$BIN" > "$tmp/$n.log" 2>&1; then
    echo "FAIL: part gather with $n ranks"; cat "$tmp/$n.log"; exit 1
  fi
  passed=$(grep -c "PASSED" "$tmp/$n.log" || true)
  [ "$passed" = "$n" ] || { echo "FAIL: expected $n passing ranks, got $passed"; cat "$tmp/$n.log"; exit 1; }
  echo "ok: part gather with $n ranks"
done
echo PASS
