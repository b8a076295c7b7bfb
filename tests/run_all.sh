#!/usr/bin/env bash
# Runs every test: the cmocka unit programs in $BUILD/tests/, then every script in
# tests/integration/ (exit 0 = pass, 77 = skipped, anything else = fail).
# Ends with the line "N passed, N failed, N skipped".
set -u
BUILD=${1:-build}
cd "$(dirname "$0")/.."
export SPES_BIN="$PWD/$BUILD/spes"
export SPES_BUILD="$PWD/$BUILD"
export SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
export SPES_VENV_PY="$PWD/.venv/bin/python"
# Under ASan (make test-asan sets SPES_ASAN=1): third-party leaks listed in tests/lsan.supp.
if [ -n "${SPES_ASAN:-}" ] && [ -z "${LSAN_OPTIONS:-}" ]; then export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"; fi
passed=0 failed=0 skipped=0
failed_names=()
log_dir=$(mktemp -d)

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  out="$log_dir/$name.log"
  "$t" >"$out" 2>&1
  rc=$?
  p=$(sed -n 's/.*\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  f=$(sed -n 's/.*\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  s=$(sed -n 's/.*\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  p=${p:-0} f=${f:-0} s=${s:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed before cmocka could count
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -ne 0 ]; then failed_names+=("$name"); echo "FAIL $name"; cat "$out"; else echo "ok   $name ($p passed, $s skipped)"; fi
done

for t in tests/integration/*.sh; do
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

rm -rf "$log_dir"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
