#!/usr/bin/env bash
# Runs the GPU tests ($BUILD/tests-gpu/test_*, cmocka) and the end-to-end GPU scripts
# (tests/gpu/*.sh), then, when compute-sanitizer exists
# and a GPU is visible, each of them again under `compute-sanitizer --tool memcheck` (an
# out-of-bounds or misaligned access in any kernel fails it). Without a GPU every test reports
# itself skipped. Ends with the line "N passed, N failed, N skipped" (as tests/run_all.sh).
#   SPES_GPU_MEMCHECK=0   skip the sanitizer pass
# (tests/runner.sh: SPES_TEST_ONLY, SPES_TEST_DEADLINE, SPES_TEST_LOG_DIR select, time-box and keep.)
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 1
source tests/runner.sh
BUILD=$(absolute_path "$BUILD")   # a bundle's build/ lies outside the repository

tests=()
for t in "$BUILD"/tests-gpu/test_*; do [ -x "$t" ] && tests+=("$t"); done
if [ ${#tests[@]} -eq 0 ]; then
  echo "no GPU tests in $BUILD/tests-gpu (build with nvcc: make test-gpu)"
fi
gpus=$("$BUILD"/tests-gpu/gpu_count 2>/dev/null || echo 0)
echo "GPUs visible: $gpus"

for t in "${tests[@]}"; do run_cmocka "$(basename "$t")" "$t"; done

# End-to-end GPU scripts (tests/gpu/*.sh): exit 0 pass, 77 skipped (no GPU), else fail.
export SPES_BIN="$BUILD/spes" SPES_BUILD="$BUILD"
export SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data} SPES_VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
for t in tests/gpu/*.sh; do
  [ -f "$t" ] && run_script "$t"
done

sanitizer=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; } || true)
if [ "${SPES_GPU_MEMCHECK:-1}" = 0 ]; then
  echo "memcheck pass: skipped (SPES_GPU_MEMCHECK=0)"
elif [ -z "$sanitizer" ]; then
  skip_test "memcheck pass" "compute-sanitizer not found"
elif [ "$gpus" -eq 0 ]; then
  skip_test "memcheck pass" "no GPU visible"
else
  # Memory errors only: the tests make CUDA calls fail on purpose (an impossible allocation),
  # which the sanitizer would otherwise report as errors too. SPES_GPU_MEMCHECK_PASS tells the
  # programs (the attention speed print skips itself).
  flags=(--tool memcheck --error-exitcode 1 --print-limit 20)
  if "$sanitizer" --help 2>&1 | grep -q -- --report-api-errors; then flags+=(--report-api-errors no); fi
  for t in "${tests[@]}"; do
    SPES_GPU_MEMCHECK_PASS=1 run_cmocka "memcheck $(basename "$t")" "$sanitizer" "${flags[@]}" "$t"
  done
fi

finish
