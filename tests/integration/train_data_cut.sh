#!/usr/bin/env bash
# A data file cut shorter under a running job (`cp` or a re-tokenize over it in place,
# `truncate`): the step that cannot read its batch stops the run with an error naming the file
# (it was a SIGBUS that killed the process at once), and the state of the last step is saved first,
# so nothing trained is lost: with the file mended, --resume ends byte-identical to a run never
# disturbed. On one rank and on 2 ranks (every rank stops at the same step and the save is whole);
# and an evaluation whose data is cut stops the run the same way, its step saved.
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
cp "$tmp/tokens.npy" "$tmp/tokens.whole"
tiny_config "$tmp" cut
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
same_end() {   # same_end A B: the final checkpoints are the same bytes
  for f in model.safetensors train_state.safetensors; do
    cmp -s "$1/step1500/$f" "$2/step1500/$f" || bad "$(basename "$2")'s step1500/$f differs from $(basename "$1")'s"
  done
}

# run NAME RANKS: trains; after step 300 the data file is cut to its first 4 KiB (64 of 400
# instances); the run must stop with the error, having saved; then the file is mended and the run
# resumed to its end.
run() {
  local name=$1 ranks=$2 dir=$tmp/$1
  local args=("$tmp/tiny.yaml" --save_folder="$dir")
  [ "$ranks" -gt 1 ] && args+=(--nproc_per_node "$ranks")
  "$SPES_BIN" train "${args[@]}" > "$tmp/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 1200); do [ "$(steps_done "$dir")" -ge 300 ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  truncate -s 4096 "$tmp/tokens.npy"
  local rc=0
  wait "$pid" || rc=$?
  [ "$rc" = 1 ] || bad "$name: exit $rc after the data file was cut, want 1: $(tail -3 "$tmp/$name.log")"
  grep -q "data file $tmp/tokens.npy: the file is shorter than the 25600 bytes it had when it was opened" "$tmp/$name.log" ||
    bad "$name: the error does not name the cut file: $(grep -i "error\|spes:" "$tmp/$name.log" | tail -2)"
  local saved
  saved=$(sed -n 's/.*saved step \([0-9]*\) before stopping on this error.*/\1/p' "$tmp/$name.log" | head -1)
  [ -n "$saved" ] && [ -d "$dir/step$saved" ] || bad "$name: no step saved before stopping: $(ls "$dir")"
  [ -n "$saved" ] && [ "$saved" -ge 300 ] && [ "$saved" -lt 1500 ] || bad "$name: saved step '$saved', want one in [300, 1500)"
  grep -q "Bus error\|SIGBUS" "$tmp/$name.log" && bad "$name: a SIGBUS"
  echo "$name: stopped at step $((saved + 1)) on the cut file, step $saved saved"
  cp "$tmp/tokens.whole" "$tmp/tokens.npy"   # mended (in place: no run has it open now)
  "$SPES_BIN" train "${args[@]}" --resume > "$tmp/$name.resume.log" 2>&1 ||
    bad "$name: the resume failed: $(tail -3 "$tmp/$name.resume.log")"
}

"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/plain" > "$tmp/plain.log" 2>&1 || { tail -5 "$tmp/plain.log"; bad "the plain run failed"; }
run one 1
same_end "$tmp/plain" "$tmp/one"

# An evaluation whose data is cut: the run stops at that evaluation with the error, the step saved.
cp "$tmp/tokens.whole" "$tmp/val.npy"
cp "$tmp/tiny.yaml" "$tmp/eval.yaml"
printf 'eval_interval: 100\nevaluators:\n  - label: val\n    data: {paths: [%s]}\n' "$tmp/val.npy" >> "$tmp/eval.yaml"
"$SPES_BIN" train "$tmp/eval.yaml" --save_folder="$tmp/eval" > "$tmp/eval.log" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 1 1200); do [ "$(steps_done "$tmp/eval")" -ge 250 ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
truncate -s 4096 "$tmp/val.npy"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 1 ] || bad "eval: exit $rc after the evaluation's data was cut, want 1: $(tail -3 "$tmp/eval.log")"
grep -q "data file $tmp/val.npy: the file is shorter than" "$tmp/eval.log" || bad "eval: the error does not name the cut file"
saved=$(sed -n 's/.*saved step \([0-9]*\) before stopping on this error.*/\1/p' "$tmp/eval.log" | head -1)
[ -n "$saved" ] && [ -d "$tmp/eval/step$saved" ] && [ $((saved % 100)) = 0 ] ||
  bad "eval: no evaluation step saved before stopping (saved '$saved'): $(ls "$tmp/eval")"
echo "eval: stopped at the evaluation of step $saved on the cut file, the step saved"

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
echo "train_data_cut: OK"
