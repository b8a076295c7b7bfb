# Shared by tests/run_all.sh and tests/run_gpu.sh (sourced): the counters, one cmocka program,
# one test script, and the closing line "N passed, N failed, N skipped".
passed=0 failed=0 skipped=0
failed_names=()
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

# run_cmocka NAME COMMAND...: counted by cmocka's own summary lines; a crash before cmocka
# could count (or a sanitizer's error exit) is one failure.
run_cmocka() {
  local name=$1; shift
  local out="$log_dir/${name//[^A-Za-z0-9_.-]/_}.log" start=$(date +%s)
  "$@" >"$out" 2>&1
  local rc=$? took=$(( $(date +%s) - start )) p f s
  p=$(sed -n 's/.*\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  f=$(sed -n 's/.*\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  s=$(sed -n 's/.*\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
  p=${p:-0} f=${f:-0} s=${s:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -ne 0 ]; then failed_names+=("$name"); echo "FAIL $name (${took}s)"; tail -80 "$out"
  else echo "ok   $name ($p passed, $s skipped, ${took}s)"; fi
}

# run_script SCRIPT: exit 0 passed, 77 skipped (its last line says why), anything else failed.
run_script() {
  local name; name=$(basename "$1" .sh)
  local out="$log_dir/$name.log" start=$(date +%s)
  bash "$1" >"$out" 2>&1
  local rc=$? took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then passed=$((passed + 1)); echo "ok   $name (${took}s)"
  elif [ $rc -eq 77 ]; then skipped=$((skipped + 1)); echo "skip $name: $(tail -1 "$out")"
  else failed=$((failed + 1)); failed_names+=("$name"); echo "FAIL $name (${took}s)"; tail -50 "$out"; fi
}

# finish: the closing line; returns non-zero when anything failed.
finish() {
  [ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}
