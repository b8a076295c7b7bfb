#!/usr/bin/env bash
# Runs every test: the cmocka unit programs in $BUILD/tests/, then every script in
# tests/integration/ (exit 0 = pass, 77 = skipped, anything else = fail).
# Ends with the line "N passed, N failed, N skipped".
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 1
source tests/runner.sh
BUILD=$(absolute_path "$BUILD")
export SPES_BIN="$BUILD/spes"
export SPES_BUILD="$BUILD"
export SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
export SPES_VENV_PY="$PWD/.venv/bin/python"
# Under ASan (make test-asan sets SPES_ASAN=1): third-party leaks listed in tests/lsan.supp.
if [ -n "${SPES_ASAN:-}" ] && [ -z "${LSAN_OPTIONS:-}" ]; then export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"; fi

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] && run_cmocka "$(basename "$t")" "$t"
done
for t in tests/integration/*.sh; do
  [ -f "$t" ] && run_script "$t"
done
finish
