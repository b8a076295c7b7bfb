#!/usr/bin/env bash
# SIGUSR1 saves a checkpoint after the current step and training goes on (a scheduler's warning
# before its time limit, or a checkpoint on demand); it used to end the process without a save.
# Twice in one run (the handler stays), on one rank and on 2 ranks through mpirun (which passes
# the signal to every rank). The saves change nothing: the run ends byte-identical to one never
# signalled, and a resume from a save made on request ends the same too.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=1

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 400
tiny_config "$tmp" usr1
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 1500
global_train_batch_size: 8
device_train_microbatch_size: 4
save_interval_unsharded: 100000
console_log_interval: 100
EOF

fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
steps_done() { [ -s "$1/metrics.jsonl" ] && grep -c '"step"' "$1/metrics.jsonl" || echo 0; }
saved_steps() { (cd "$1" && ls -d step* 2>/dev/null | sed 's/step//' | sort -n | tr '\n' ' '); }

# run NAME RANKS: trains in the background, sends SIGUSR1 twice (after ~200 and ~700 steps).
run() {
  local name=$1 ranks=$2 dir=$tmp/$1
  local args=("$tmp/tiny.yaml" --save_folder="$dir")
  [ "$ranks" -gt 1 ] && args+=(--nproc_per_node "$ranks")
  "$SPES_BIN" train "${args[@]}" > "$tmp/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for at in 200 700; do
    for _ in $(seq 1 600); do [ "$(steps_done "$dir")" -ge "$at" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -USR1 "$pid" 2>/dev/null || bad "$name: the run ended before step $at"
  done
  wait "$pid" || { bad "$name: exit status $? after SIGUSR1"; tail -5 "$tmp/$name.log"; }
  local saves
  saves=$(saved_steps "$dir")
  echo "$name: checkpoints at steps $saves"
  set -- $saves
  [ $# = 3 ] && [ "$3" = 1500 ] && [ "$1" -ge 200 ] && [ "$1" -lt "$2" ] && [ "$2" -lt 1500 ] ||
    bad "$name: expected two saves on request and the final one, got: $saves"
  [ "$(grep -c "saved step [0-9]* as asked (SIGUSR1); training on" "$tmp/$name.log")" = 2 ] || bad "$name: the saves were not logged"
  grep -q "stopping after this step" "$tmp/$name.log" && bad "$name: SIGUSR1 read as a stop"
  return 0
}

# The same run, never signalled.
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/plain" > "$tmp/plain.log" 2>&1 || { tail -5 "$tmp/plain.log"; bad "the plain run failed"; }
same_end() {   # same_end A B: the final checkpoints are the same bytes
  for f in model.safetensors train_state.safetensors; do
    cmp -s "$1/step1500/$f" "$2/step1500/$f" || bad "$(basename "$2")'s step1500/$f differs from $(basename "$1")'s"
  done
}

run one 1
same_end "$tmp/plain" "$tmp/one"
# A resume from the first save made on request ends the same.
first=$(saved_steps "$tmp/one" | cut -d' ' -f1)
mkdir -p "$tmp/resumed" && cp -a "$tmp/one/step$first" "$tmp/resumed/"
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/resumed" --resume > "$tmp/resumed.log" 2>&1 || { tail -5 "$tmp/resumed.log"; bad "the resume from step $first failed"; }
same_end "$tmp/plain" "$tmp/resumed"

if command -v mpirun > /dev/null; then
  [ -n "${SPES_ASAN:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # as require_mpirun
  "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/plain2" --nproc_per_node 2 > "$tmp/plain2.log" 2>&1 ||
    { tail -5 "$tmp/plain2.log"; bad "the plain 2-rank run failed"; }
  run two 2
  same_end "$tmp/plain2" "$tmp/two"
else
  echo "(mpirun not found: the 2-rank case not run)"
fi

[ "$fail" = 0 ] || exit 1
echo "train_save_on_signal: OK"
