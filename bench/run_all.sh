#!/usr/bin/env bash
# `make bench` driver: bash bench/run_all.sh <build-dir>
#
# Runs the benchmark sections in the order of SECTIONS. Each section prints its detail lines
# and then exactly ONE final line "<section>: key=value ...", or "<section>: skipped (<why>)"
# when a binary or the Python virtualenv it needs is missing, or "<section>: failed (<why>)".
# The script exits non-zero when any section failed (skips are not failures).
#
# To add a section: write a function section_<name> below that prints its detail, then its
# final line through `final` / `skip` / `fail`, and add its name to SECTIONS. A section that
# lives in its own script (which prints its own final line) is one line:
#   # dist_memory: per-rank memory of each data-parallel strategy next to its theory for N = 1, 2, 4,
# and cpu tokens/s of 2 ranks x 1 thread against 1 rank x 2 threads (docs/distributed.md).
section_dist_memory() { script_section dist_memory bench/dist_memory.sh "$BUILD_DIR"; }

section_tokenize() { script_section tokenize bench/tokenize.sh "$BUILD_DIR" "$VENV_PY"; }
# Sections run one after another, never in parallel (the machine has 2 cores).
# BENCH_ONLY="bench_small aggregate" runs a subset.
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
case $BUILD in /*) BUILD_DIR=$BUILD ;; *) BUILD_DIR="$PWD/$BUILD" ;; esac
VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
SECTIONS=(bench_small tokenize aggregate spes_memory server_memory eval generate)
# BENCH_ONLY="bench_small aggregate" runs just those sections. dist_memory (~8 min: 30 overlap
# on/off runs) is a study of its own, not in `make bench`: `make bench-dist-memory`, i.e.
# BENCH_ONLY=dist_memory.
if [ -n "${BENCH_ONLY:-}" ]; then read -ra SECTIONS <<< "$BENCH_ONLY"; fi

LOG_DIR=$(mktemp -d)
trap 'rm -rf "$LOG_DIR"' EXIT
failed_sections=()

# Final-line helpers: every section ends with exactly one of these.
final() { echo "$*"; }
skip() { echo "$1: skipped ($2)"; }
fail() { echo "$1: failed ($2)"; failed_sections+=("$1"); }

# script_section NAME SCRIPT ARGS...: runs a bench script that prints its detail and its own
# final line (or its own "skipped" line); a non-zero exit adds "NAME: failed (...)".
script_section() {
  local name=$1 script=$2
  shift 2
  if ! bash "$script" "$@"; then fail "$name" "$script exited non-zero"; fi
}

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

# have_venv: the test virtualenv with torch + transformers is usable.
have_venv() {
  [ -x "$VENV_PY" ] && "$VENV_PY" -c 'import torch, transformers' 2>/dev/null
}

# run_logged NAME CMD...: runs CMD, shows its output live and keeps it in $LOG_DIR/NAME.log.
run_logged() {
  local name=$1
  shift
  "$@" 2>&1 | tee "$LOG_DIR/$name.log"
  return "${PIPESTATUS[0]}"
}

# bench-small: one training step (forward, backward, AdamW) of the bench-small model,
# ours (bench/train_step.c) against HF OlmoeForCausalLM in PyTorch eager CPU
# (bench/train_step_torch.py), both fp32 on 2 threads.
section_bench_small() {
  local name=bench-small ours="$BUILD_DIR/bench/train_step"
  if [ ! -x "$ours" ]; then skip $name "no $ours; build it with make build BUILD=$BUILD"; return; fi
  echo "== $name: ours ($ours)"
  if ! run_logged ours "$ours"; then fail $name "$ours exited non-zero"; return; fi
  local pytorch=NA
  if have_venv; then
    echo "== $name: pytorch (bench/train_step_torch.py)"
    if ! run_logged torch "$VENV_PY" bench/train_step_torch.py; then fail $name "train_step_torch.py exited non-zero"; return; fi
    pytorch=$(value pytorch_tok_s "$LOG_DIR/torch.log")
  else
    echo "== $name: pytorch skipped: no virtualenv with torch at $VENV_PY (run tests/setup_venv.sh)"
  fi
  local ours_tok_s
  ours_tok_s=$(value ours_tok_s "$LOG_DIR/ours.log")
  final "$name: ours_tok_s=$ours_tok_s pytorch_tok_s=$pytorch ratio=$(ratio "$ours_tok_s" "$pytorch")" \
    "gflops=$(value gflops "$LOG_DIR/ours.log") sgemm_gflops=$(value sgemm_gflops "$LOG_DIR/ours.log")" \
    "mfu=$(value mfu "$LOG_DIR/ours.log") peak_rss_mb=$(value peak_rss_mb "$LOG_DIR/ours.log")"
}

# tokenize: tokenizer throughput, ours (bench/tokenize.c) against HF tokenizers encode_batch
# (bench/tokenize_hf.py) on Tiny Shakespeare x ~20 MB and a Unicode-heavy text, 1 and 2
# processes; bench/tokenize.sh prints the table and the final line itself.
section_tokenize() {
  if ! run_logged tokenize bash bench/tokenize.sh "$BUILD_DIR" "$VENV_PY"; then
    fail tokenize "bench/tokenize.sh exited non-zero"
  fi
}

# aggregate: parameter-server aggregation throughput for 4 peers on bench-small with E=16
# (453 MB F32, spes mode, 4 experts per peer) next to memcpy in the same run, and the bytes per
# sync round of spes vs fedavg (bench/aggregate.c prints both lines).
section_aggregate() {
  local name=aggregate bin="$BUILD_DIR/bench/aggregate"
  if [ ! -x "$bin" ]; then skip $name "no $bin; build it with make build BUILD=$BUILD"; return; fi
  if ! run_logged aggregate "$bin" >/dev/null; then fail $name "$bin exited non-zero"; return; fi
  grep -v '^aggregate:' "$LOG_DIR/aggregate.log"
  final "$(grep '^aggregate:' "$LOG_DIR/aggregate.log" | tail -1)"
}

# spes-memory: per-peer peak RSS of one training step with 4 of 16 experts trainable (a SPES
# peer) against every tensor trainable, each in its own child process, next to the ratio the
# parameter table predicts (bench/spes_memory.c prints the final line).
section_spes_memory() {
  local name=spes-memory bin="$BUILD_DIR/bench/spes_memory"
  if [ ! -x "$bin" ]; then skip $name "no $bin; build it with make build BUILD=$BUILD"; return; fi
  if ! run_logged spes_memory "$bin" >/dev/null; then fail $name "$bin exited non-zero"; return; fi
  grep -v '^spes-memory:' "$LOG_DIR/spes_memory.log"
  final "$(grep '^spes-memory:' "$LOG_DIR/spes_memory.log" | tail -1)"
}

# server-memory: the parameter server's peak RSS above idle, in models, for P = 2, 4, 8, 16
# peers (a real server in a child process, P client threads uploading and downloading 6 rounds
# of a ~64 MB spes model in step; median of rounds 2..6 and the highest), next to the bound 2 + keep_steps (bench/server_memory.c prints the
# final line).
section_server_memory() {
  local name=server-memory bin="$BUILD_DIR/bench/server_memory"
  if [ ! -x "$bin" ]; then skip $name "no $bin; build it with make build BUILD=$BUILD"; return; fi
  if ! run_logged server_memory "$bin" >/dev/null 2>&1; then fail $name "$bin exited non-zero"; return; fi
  grep '^P=' "$LOG_DIR/server_memory.log"
  final "$(grep '^server-memory:' "$LOG_DIR/server_memory.log" | tail -1)"
}

# eval / generate: inference on bench-small, ours (bench/eval_generate.c: the eval forward
# over 8 x 256 tokens; greedy decoding of 64 tokens after a 32-token prompt with the KV cache
# and without it) against HF OlmoeForCausalLM in PyTorch (bench/eval_generate_torch.py:
# forward with labels; model.generate greedy with HF's cache), 2 threads each. Both sections
# read one run of each program (made by whichever section comes first).
EVAL_GENERATE_STATUS=""
run_eval_generate() {
  [ -n "$EVAL_GENERATE_STATUS" ] && return
  local ours="$BUILD_DIR/bench/eval_generate"
  if [ ! -x "$ours" ]; then EVAL_GENERATE_STATUS="skip:no $ours; build it with make build BUILD=$BUILD"; return; fi
  echo "== eval/generate: ours ($ours)"
  if ! run_logged eval_generate "$ours"; then EVAL_GENERATE_STATUS="fail:$ours exited non-zero"; return; fi
  if have_venv; then
    echo "== eval/generate: pytorch (bench/eval_generate_torch.py)"
    if ! run_logged eval_generate_torch "$VENV_PY" bench/eval_generate_torch.py; then
      EVAL_GENERATE_STATUS="fail:eval_generate_torch.py exited non-zero"; return
    fi
  else
    echo "== eval/generate: pytorch skipped: no virtualenv with torch at $VENV_PY (run tests/setup_venv.sh)"
  fi
  EVAL_GENERATE_STATUS=ok
}

# eval_generate_final NAME: skip/fail lines when the run did not happen, else 0.
eval_generate_final() {
  case $EVAL_GENERATE_STATUS in
    skip:*) skip "$1" "${EVAL_GENERATE_STATUS#skip:}"; return 1 ;;
    fail:*) fail "$1" "${EVAL_GENERATE_STATUS#fail:}"; return 1 ;;
  esac
}

section_eval() {
  run_eval_generate
  eval_generate_final eval || return
  local ours pytorch
  ours=$(value ours_eval_tok_s "$LOG_DIR/eval_generate.log")
  pytorch=$(value pytorch_eval_tok_s "$LOG_DIR/eval_generate_torch.log")
  final "eval: ours_tok_s=$ours pytorch_tok_s=$pytorch ratio=$(ratio "$ours" "$pytorch")"
}

section_generate() {
  run_eval_generate
  eval_generate_final generate || return
  final "generate: ours_tok_s=$(value ours_gen_tok_s "$LOG_DIR/eval_generate.log")" \
    "nocache_tok_s=$(value nocache_gen_tok_s "$LOG_DIR/eval_generate.log")" \
    "pytorch_tok_s=$(value pytorch_gen_tok_s "$LOG_DIR/eval_generate_torch.log")"
}

for section in "${SECTIONS[@]}"; do
  "section_$section"
done
if [ ${#failed_sections[@]} -gt 0 ]; then
  echo "bench: failed sections: ${failed_sections[*]}"
  exit 1
fi
