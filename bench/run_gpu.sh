#!/usr/bin/env bash
# `make bench-gpu` driver: bash bench/run_gpu.sh <build-dir>
#
# One training step of the SPES 1B MoE (micro-batch 8 x 2048, bf16) on the GPU: ours
# (bench/gpu_train_step.c: as a SPES peer with 4 of 16 experts trainable and with every tensor
# trainable, a cuBLAS bf16 8192^3 GEMM timed in the same run, peak GPU memory) against Hugging
# Face OlmoeForCausalLM in PyTorch on the same GPU (bench/gpu_train_step_torch.py).
# Prints both programs' detail, then exactly one final line:
#   bench-gpu: ours_tok_s=<x> pytorch_tok_s=<x> pytorch_eager_tok_s=<x> pytorch_compiled_tok_s=<x> ratio=<x> mfu=<x> gemm_ceiling_frac=<x> peak_mem_gb=<x> peak_mem_gb_all_trainable=<x>
#   [ours_tok_s_overlap=<x> overlap_ratio=<x>: with BENCH_GPU_ARGS=--overlap-adamw, AdamW under the next forward]
# or "bench-gpu: skipped (<why>)" when there is no GPU backend (this spes was built without
# CUDA, or no GPU is visible), or "bench-gpu: failed (<why>)" (exit 1).
#   ours_tok_s, mfu (model FLOP/s / 989 TFLOP/s, H100 SXM bf16 dense), gemm_ceiling_frac
#     (model FLOP/s / the measured GEMM): the all-trainable run, the same work as PyTorch's;
#   pytorch_tok_s: the faster of PyTorch eager and torch.compile (BENCH_GPU_TORCH_MODES);
#   ratio = ours_tok_s / pytorch_tok_s;
#   peak_mem_gb: the SPES peer (4 of 16 experts trainable), peak_mem_gb_all_trainable: every
#     tensor trainable; GB = 1e9 bytes of backend allocations (ours) / torch.cuda
#     max_memory_allocated (PyTorch, detail lines only).
# NA marks a value that could not be measured (e.g. a variant that does not fit in memory,
# said in the detail; no test virtualenv for the PyTorch side).
# BENCH_GPU_ARGS / BENCH_GPU_TORCH_ARGS add flags to either program (e.g. "--batch 4");
# BENCH_GPU_TORCH_MODES: "off on" (default: eager and compiled), or one of them.
# BENCH_GPU_VARIANT="NAME=VALUE ...[; NAME=VALUE ...]": ours once more in the same run for each
#   ';'-separated set of environment variables (a change behind a switch, e.g.
#   SPES_CUDA_EXPERT_STREAMS=4, measured against the default on the same card): a detail line
#   each with its tokens/s and the ratio to the default; the final line stays the default's.
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 1
case $BUILD in /*) BUILD_DIR=$BUILD ;; *) BUILD_DIR="$PWD/$BUILD" ;; esac
VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
VENV_PY=$(command -v "$VENV_PY" || echo "$VENV_PY")   # a bare name (python3) from PATH
OURS="$BUILD_DIR/bench/gpu_train_step"
NAME=bench-gpu
LOG_DIR=$(mktemp -d)
trap 'rm -rf "$LOG_DIR"' EXIT

# value KEY FILE: the value of the last "KEY=value" token in FILE, NA when absent.
value() {
  local v
  v=$(grep -oE "(^|[[:space:]])$1=[^[:space:]]+" "$2" 2>/dev/null | tail -1 | sed 's/.*=//')
  echo "${v:-NA}"
}
# ratio A B: A/B with 2 decimals, NA unless both are positive numbers.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "NA" }'
}

if [ ! -x "$OURS" ]; then
  echo "$NAME: skipped (no $OURS; build it with make build BUILD=$BUILD)"
  exit 0
fi

echo "== $NAME: ours ($OURS ${BENCH_GPU_ARGS:-})"
# shellcheck disable=SC2086  # BENCH_GPU_ARGS is a list of flags
"$OURS" ${BENCH_GPU_ARGS:-} 2>&1 | tee "$LOG_DIR/ours.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 77 ]; then
  why=$(sed -n 's/^gpu_train_step: skipped (\(.*\))$/\1/p' "$LOG_DIR/ours.log" | tail -1)
  echo "$NAME: skipped (${why:-no CUDA backend})"
  exit 0
fi
if [ "$rc" -ne 0 ]; then
  echo "$NAME: failed ($OURS exited with status $rc)"
  exit 1
fi

# PyTorch eager and compiled (torch.compile), each its own process in this run; the ratio is
# against the faster. BENCH_GPU_TORCH_MODES picks them ("off on" by default; compiling the 1B
# model takes minutes, so a short GPU lease may run "off" alone and say so).
TORCH_MODES=${BENCH_GPU_TORCH_MODES:-off on}
pytorch=NA
declare -A torch_tok_s=([off]=NA [on]=NA)
if [ -x "$VENV_PY" ] && "$VENV_PY" -c 'import torch, transformers' 2>/dev/null; then
  for mode in $TORCH_MODES; do
    case $mode in off | on) ;; *) echo "$NAME: failed (BENCH_GPU_TORCH_MODES: '$mode' is not off or on)"; exit 1 ;; esac
    log="$LOG_DIR/torch_$mode.log"
    echo "== $NAME: pytorch, torch.compile $mode (bench/gpu_train_step_torch.py --compile $mode ${BENCH_GPU_TORCH_ARGS:-})"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    "$VENV_PY" bench/gpu_train_step_torch.py --compile "$mode" ${BENCH_GPU_TORCH_ARGS:-} 2>&1 | tee "$log"
    trc=${PIPESTATUS[0]}
    echo "== $NAME: pytorch, torch.compile $mode: $(($(date +%s) - t0)) s including start-up and compilation"
    if [ "$trc" -ne 0 ]; then
      echo "$NAME: failed (bench/gpu_train_step_torch.py --compile $mode exited with status $trc)"
      exit 1
    fi
    if grep -q '^pytorch: skipped' "$log"; then
      echo "== $NAME: pytorch side $(grep '^pytorch: skipped' "$log" | tail -1 | sed 's/^pytorch: //')"
    else
      torch_tok_s[$mode]=$(value pytorch_tok_s "$log")
    fi
  done
  # the faster of the two that ran
  pytorch=$(awk -v a="${torch_tok_s[off]}" -v b="${torch_tok_s[on]}" 'BEGIN {
    m = "NA"; if (a + 0 > 0) m = a; if (b + 0 > 0 && (m == "NA" || b + 0 > m + 0)) m = b; print m }')
else
  echo "== $NAME: pytorch skipped: no virtualenv with torch + transformers at $VENV_PY (run tests/setup_venv.sh)"
fi

ours=$(value ours_tok_s "$LOG_DIR/ours.log")
# Each variant (';'-separated) once more, in the order given, against the default's figures.
IFS=';' read -ra variants <<<"${BENCH_GPU_VARIANT:-}"
for v in "${variants[@]}"; do
  v=$(echo "$v" | xargs)   # trim the spaces around a ';'
  [ -n "$v" ] || continue
  echo "== $NAME: ours with $v"
  # shellcheck disable=SC2086  # a list of NAME=VALUE words, and BENCH_GPU_ARGS a list of flags
  env $v "$OURS" ${BENCH_GPU_ARGS:-} > "$LOG_DIR/variant.log" 2>&1
  vrc=$?
  tail -25 "$LOG_DIR/variant.log"
  variant=$(value ours_tok_s "$LOG_DIR/variant.log")
  [ "$vrc" -eq 0 ] || variant=NA
  echo "== $NAME: variant $v: ours_tok_s=$variant peer_tok_s=$(value peer_tok_s "$LOG_DIR/variant.log")" \
    "(status $vrc) against the default's ours_tok_s=$ours peer_tok_s=$(value peer_tok_s "$LOG_DIR/ours.log"):" \
    "$(ratio "$variant" "$ours")x"
done
echo "$NAME: ours_tok_s=$ours pytorch_tok_s=$pytorch pytorch_eager_tok_s=${torch_tok_s[off]}" \
  "pytorch_compiled_tok_s=${torch_tok_s[on]} ratio=$(ratio "$ours" "$pytorch")" \
  "mfu=$(value mfu "$LOG_DIR/ours.log") gemm_ceiling_frac=$(value gemm_ceiling_frac "$LOG_DIR/ours.log")" \
  "peak_mem_gb=$(value peak_mem_gb "$LOG_DIR/ours.log")" \
  "peak_mem_gb_all_trainable=$(value peak_mem_gb_all_trainable "$LOG_DIR/ours.log")" \
  "$(overlap=$(value ours_tok_s_overlap "$LOG_DIR/ours.log")
     [ "$overlap" = NA ] || echo "ours_tok_s_overlap=$overlap overlap_ratio=$(ratio "$overlap" "$pytorch")")"
