#!/usr/bin/env bash
# Runs the GPU tests ($BUILD/tests-gpu/test_*, cmocka) and the end-to-end GPU scripts
# (tests/gpu/*.sh), then, when compute-sanitizer exists
# and a GPU is visible, each of them again under `compute-sanitizer --tool memcheck` (an
# out-of-bounds or misaligned access in any kernel fails it). Without a GPU every test reports
# itself skipped. Ends with the line "N passed, N failed, N skipped" (as tests/run_all.sh).
#   SPES_GPU_MEMCHECK=0   skip the sanitizer pass
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
passed=0 failed=0 skipped=0
failed_names=()
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

# run_one NAME COMMAND...: one cmocka program, counted by its own summary lines.
run_one() {
  local name=$1; shift
  local out="$log_dir/${name//[^A-Za-z0-9_.-]/_}.log"
  local start=$(date +%s)
  "$@" >"$out" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - start ))
  local p f s
  p=$(sed -n 's/.*\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  f=$(sed -n 's/.*\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  s=$(sed -n 's/.*\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  p=${p:-0} f=${f:-0} s=${s:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed, or the sanitizer found errors
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -ne 0 ]; then failed_names+=("$name"); echo "FAIL $name (${took}s)"; tail -80 "$out"
  else echo "ok   $name ($p passed, $s skipped, ${took}s)"; fi
}

tests=()
for t in "$BUILD"/tests-gpu/test_*; do [ -x "$t" ] && tests+=("$t"); done
if [ ${#tests[@]} -eq 0 ]; then
  echo "no GPU tests in $BUILD/tests-gpu (build with nvcc: make test-gpu)"
fi
gpus=$("$BUILD"/tests-gpu/gpu_count 2>/dev/null || echo 0)
echo "GPUs visible: $gpus"

for t in "${tests[@]}"; do run_one "$(basename "$t")" "$t"; done

# End-to-end GPU scripts (tests/gpu/*.sh): exit 0 pass, 77 skipped (no GPU), else fail.
export SPES_BIN="$PWD/$BUILD/spes" SPES_BUILD="$PWD/$BUILD"
export SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data} SPES_VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
for t in tests/gpu/*.sh; do
  [ -f "$t" ] || continue
  name=$(basename "$t" .sh)
  out="$log_dir/$name.log"
  start=$(date +%s)
  bash "$t" >"$out" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then passed=$((passed + 1)); echo "ok   $name (${took}s)"
  elif [ $rc -eq 77 ]; then skipped=$((skipped + 1)); echo "skip $name: $(tail -1 "$out")"
  else failed=$((failed + 1)); failed_names+=("$name"); echo "FAIL $name (${took}s)"; tail -50 "$out"; fi
done

sanitizer=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; } || true)
if [ "${SPES_GPU_MEMCHECK:-1}" = 0 ]; then
  echo "memcheck pass: skipped (SPES_GPU_MEMCHECK=0)"
elif [ -z "$sanitizer" ]; then
  echo "memcheck pass: skipped (compute-sanitizer not found)"
elif [ "$gpus" -eq 0 ]; then
  echo "memcheck pass: skipped (no GPU visible)"
else
  for t in "${tests[@]}"; do
    run_one "memcheck $(basename "$t")" "$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 20 "$t"
  done
fi

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
