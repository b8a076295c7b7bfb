#!/usr/bin/env bash
# bench/gpu_train_step's code paths on the cpu backend at the tiny preset (the bench itself
# runs on a GPU: make bench-gpu): the default run (GEMM ceiling, SPES peer and all-trainable,
# each in a forked child, then the machine-readable lines run_gpu.sh reads), and
# --profile-step (all-trainable in the process itself, plus the step the profile stage of
# scripts/gpu_check.sh hands to ncu, between cudaProfilerStart and cudaProfilerStop), and
# --overlap-adamw (the steps again with AdamW under the next forward: src/train/overlap_step.h,
# whose bits test_train_overlap_step checks).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
bench=$(dirname "$SPES_BIN")/bench/gpu_train_step
[ -x "$bench" ] || { echo "SKIPPED: $bench not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--device cpu --preset tiny --batch 2 --seq 32 --warmup 1 --steps 2 --experts-per-peer 1 --gemm-n 64)

"$bench" "${args[@]}" >"$tmp/default" 2>&1 || { cat "$tmp/default"; echo "default run failed"; exit 1; }
for line in "^peer: .* tok/s" "^all-trainable: .* tok/s" "^ours_tok_s=[0-9]" "^peer_tok_s=[0-9]" "^gemm_tflops=[0-9]" \
            "^copy_gbs=[0-9]" "^all-trainable: AdamW.s floor at the measured copy rate .* measured [0-9.]+x it"; do
  grep -Eq "$line" "$tmp/default" || { cat "$tmp/default"; echo "default run: no line matching $line"; exit 1; }
done
! grep -q "profile-step" "$tmp/default" || { cat "$tmp/default"; echo "default run profiled a step"; exit 1; }

"$bench" "${args[@]}" --profile-step >"$tmp/profile" 2>&1 || { cat "$tmp/profile"; echo "--profile-step failed"; exit 1; }
grep -Eq "^profile-step: one more step, between cudaProfilerStart and Stop: [0-9.]+ ms" "$tmp/profile" ||
  { cat "$tmp/profile"; echo "--profile-step: no profiled step"; exit 1; }
grep -Eq "^all-trainable: .* tok/s" "$tmp/profile" || { cat "$tmp/profile"; echo "--profile-step: no result"; exit 1; }
if grep -Eq "^peer:|^ours_tok_s=" "$tmp/profile"; then
  cat "$tmp/profile"; echo "--profile-step ran more than the all-trainable step"; exit 1
fi
"$bench" "${args[@]}" --overlap-adamw >"$tmp/overlap" 2>&1 || { cat "$tmp/overlap"; echo "--overlap-adamw failed"; exit 1; }
for line in "^peer: AdamW under the next forward \(--overlap-adamw\): mean [0-9.]+ ms a step" \
            "^all-trainable: AdamW under the next forward" "^ours_tok_s_overlap=[0-9]"; do
  grep -Eq "$line" "$tmp/overlap" || { cat "$tmp/overlap"; echo "--overlap-adamw: no line matching $line"; exit 1; }
done
! grep -q "overlap" "$tmp/default" || { cat "$tmp/default"; echo "default run overlapped"; exit 1; }
if "$bench" --profile-step --steps 0 >"$tmp/bad" 2>&1; then echo "--steps 0 accepted"; exit 1; fi
echo "gpu_train_step on the cpu: default run, --profile-step and --overlap-adamw"
