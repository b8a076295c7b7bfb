#!/usr/bin/env bash
# Runs every test: the cmocka unit programs the build defines ($BUILD/tests.list, written by
# `make build`: one name a line, each a program in $BUILD/tests/), then every script in
# tests/integration/ (exit 0 = pass, 77 = skipped, anything else = fail). A program in
# $BUILD/tests/ that the list does not name (left by a moved or deleted test) is stale: named, not run.
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

if [ ! -f "$BUILD/tests.list" ]; then
  echo "run_all: $BUILD/tests.list is missing: build first (make build BUILD=$BUILD)" >&2
  exit 2
fi
mapfile -t unit_tests <"$BUILD/tests.list"
for t in "$BUILD"/tests/test_*; do
  [ -f "$t" ] && [[ $t != *.d ]] || continue
  name=$(basename "$t")
  [[ " ${unit_tests[*]} " == *" $name "* ]] || echo "stale $name: not a test this build defines ($BUILD/tests.list); not run"
done
for name in "${unit_tests[@]}"; do
  t="$BUILD/tests/$name"
  if [ -x "$t" ]; then
    run_cmocka "$name" "$t"
  else
    fail_test "$name" "$t was not built"
  fi
done
for t in tests/integration/*.sh; do
  [ -f "$t" ] && run_script "$t"
done
finish
