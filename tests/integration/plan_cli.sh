#!/usr/bin/env bash
# `spes plan` on the reference configs (../shared/reference/configs) and `spes train`'s memory
# check at start: the table has a row per strategy and the activation sizes by checkpointing
# mode; a 48 GB GPU fits the 1B SPES peer; with 4 GB nothing fits and the plan lists what to
# change; --json parses; bad flags are refused naming them; and a run whose plan exceeds the free
# memory (the 1B on the cpu backend at 64 x 2048) stops before allocating its model, with the
# plan's table and the micro-batch that would fit.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
ref=../shared/reference/configs
[ -f "$ref/spes_moe_1b_4nodes_node_0.yaml" ] || { echo "SKIPPED: no $ref"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $1"; cat "$tmp/out" 2>/dev/null | tail -30; exit 1; }

"$SPES_BIN" plan "$ref/spes_moe_1b_4nodes_node_0.yaml" --device_memory 48GB >"$tmp/out" 2>/dev/null || fail "plan 1B"
for row in "single x1 \*" "ddp x2" "zero1 x2" "zero2 x2" "zero3 x2"; do
  grep -q "^  $row " "$tmp/out" || fail "no row '$row'"
done
grep -q "activations (GiB) by activation_checkpointing: none" "$tmp/out" || fail "no activations line"
grep -q "fits 48GB (44.70 GiB): YES" "$tmp/out" || fail "the 1B peer should fit 48 GB"
grep -q "^  int8 " "$tmp/out" && grep -q "^  int4 " "$tmp/out" || fail "no sync rows"
"$SPES_BIN" plan "$ref/spes_moe_1b_4nodes_node_0.yaml" --device_memory 4GB >"$tmp/out" 2>/dev/null || fail "plan 4GB"
grep -q "fits 4GB (3.73 GiB): NO" "$tmp/out" && grep -q "what to change" "$tmp/out" && grep -q "FULL_SHARD over" "$tmp/out" ||
  fail "4 GB: expected NO and what to change"
"$SPES_BIN" plan "$ref/spes_moe_3b_9b_4nodes_norm_router.yaml" --gpus 8 --device_memory 80GiB --json >"$tmp/out" 2>/dev/null ||
  fail "plan 3B --json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["target"]["ranks"] == 8 and d["memory"]["peak"] > 0 and set(d["strategies"]) == {"single", "ddp", "zero1", "zero2", "zero3"}' "$tmp/out" ||
  fail "3B json"

# Bad flags, named.
expect_error() {   # expect_error TEXT ARGS...
  local text=$1
  shift
  if "$SPES_BIN" plan "$ref/spes_moe_1b_4nodes_node_0.yaml" "$@" >"$tmp/out" 2>&1; then fail "accepted $*"; fi
  grep -q -- "$text" "$tmp/out" || fail "'$*': no '$text' in the error"
}
expect_error "--device_memory: unknown unit 'XB'" --device_memory 48XB
expect_error "--gpus: '0' is not an integer" --gpus 0
expect_error "--mfu: 2 is not a fraction" --mfu 2
expect_error "model.n_layerz" --model.n_layerz=3

# spes train refuses a run whose plan cannot fit, before the model exists.
if "$SPES_BIN" train "$ref/spes_moe_1b_4nodes_node_0.yaml" --device=cpu --precision=fp32 \
  --device_train_microbatch_size=64 --global_train_batch_size=64 --data.paths="[$tmp/none.npy]" \
  --save_folder="$tmp/save" >"$tmp/out" 2>&1; then
  fail "spes train ran a plan that cannot fit"
fi
grep -q "the run does not fit" "$tmp/out" && grep -q "out of memory before the first step" "$tmp/out" &&
  grep -q "device_train_microbatch_size [0-9]* fits" "$tmp/out" && grep -q "^  single x1 \*" "$tmp/out" ||
  fail "spes train: expected the refusal with the plan's table"
! grep -q "memory per rank (cpu)" "$tmp/out" || fail "spes train allocated the model before refusing"
echo "spes plan and the start-up check: ok"
