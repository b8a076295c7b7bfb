# shellcheck shell=bash
# Shared by tests/run_all.sh and tests/run_gpu.sh (sourced): the counters, one cmocka program,
# one test script, and the closing line "N passed, N failed, N skipped".
# For a time-boxed run (scripts/gpu_check.sh on a lent GPU machine), optionally:
#   SPES_TEST_ONLY=REGEX      run only the tests whose names match (extended regex)
#   SPES_TEST_DEADLINE=EPOCH  start no test after this time and kill one still running then;
#                             both count as skipped ("out of time": the budget ended, not the
#                             test; a test's own time limits still fail it)
#   SPES_TEST_LOG_DIR=DIR     keep each test's log there (default: a temporary folder, removed)
passed=0 failed=0 skipped=0 matched=0
failed_names=()
if [ -n "${SPES_TEST_LOG_DIR:-}" ]; then
  log_dir=$SPES_TEST_LOG_DIR
  mkdir -p "$log_dir"
else
  log_dir=$(mktemp -d)
  trap 'rm -rf "$log_dir"' EXIT
fi

# absolute_path PATH: PATH made absolute against the current folder.
absolute_path() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

selected() { [ -z "${SPES_TEST_ONLY:-}" ] || [[ "$1" =~ $SPES_TEST_ONLY ]]; }

# skip_test NAME REASON: counts a test that cannot run here as skipped (when selected).
skip_test() {
  selected "$1" || return 0
  matched=$((matched + 1)) skipped=$((skipped + 1))
  echo "skip $1: $2"
}

# fail_test NAME REASON: counts a test that could not be run at all as failed (when selected).
fail_test() {
  selected "$1" || return 0
  matched=$((matched + 1)) failed=$((failed + 1))
  failed_names+=("$1")
  echo "FAIL $1: $2"
}

# kill_session SIGNAL PID: every process of the session PID leads (setsid), wherever it moved
# inside it: a test's own `timeout` puts its command in a process group of its own, which a
# signal to the test's group would miss. (setsid forks when it cannot lead: its child, then.)
kill_session() {
  local child
  pkill "-$1" -s "$2" 2>/dev/null
  for child in $(pgrep -P "$2" 2>/dev/null); do pkill "-$1" -s "$child" 2>/dev/null; done
  return 0
}

# run_logged NAME LOG COMMAND...: runs COMMAND into LOG, under the deadline if one is set, and
# sets rc and took (seconds); returns 1 when NAME is not selected, or when no time was left to
# start it or to finish it (then counted as skipped, with the reason).
run_logged() {
  local name=$1 out=$2 start left pid watchdog
  shift 2
  start=$(date +%s)
  selected "$name" || return 1
  matched=$((matched + 1))
  if [ -z "${SPES_TEST_DEADLINE:-}" ]; then
    "$@" >"$out" 2>&1
    rc=$?
  else
    left=$(( SPES_TEST_DEADLINE - start ))
    if [ "$left" -le 0 ]; then skipped=$((skipped + 1)); echo "skip $name: out of time"; return 1; fi
    setsid -w "$@" >"$out" 2>&1 &
    pid=$!
    ( sleep "$left"; kill_session TERM "$pid" ) >/dev/null 2>&1 &
    watchdog=$!
    wait "$pid"
    rc=$?
    pkill -P "$watchdog" 2>/dev/null   # its sleep
    kill "$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
    if [ "$(date +%s)" -ge "$SPES_TEST_DEADLINE" ] && [ $rc -ne 0 ]; then
      sleep 2
      kill_session KILL "$pid"   # what outlived the TERM
      echo "killed at the deadline" >>"$out"
      skipped=$((skipped + 1)); echo "skip $name: out of time (killed at the deadline after $(( $(date +%s) - start ))s)"
      return 1
    fi
  fi
  took=$(( $(date +%s) - start ))
}

# run_cmocka NAME COMMAND...: counted by cmocka's own summary lines; a crash before cmocka
# could count (or a sanitizer's error exit) is one failure.
run_cmocka() {
  local name=$1; shift
  local out="$log_dir/${name//[^A-Za-z0-9_.-]/_}.log" rc took p f s
  run_logged "$name" "$out" "$@" || return 0
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
  local out="$log_dir/$name.log" rc took
  run_logged "$name" "$out" bash "$1" || return 0
  if [ $rc -eq 0 ]; then passed=$((passed + 1)); echo "ok   $name (${took}s)"
  elif [ $rc -eq 77 ]; then skipped=$((skipped + 1)); echo "skip $name: $(tail -1 "$out")"
  else failed=$((failed + 1)); failed_names+=("$name"); echo "FAIL $name (${took}s)"; tail -50 "$out"; fi
}

# finish: the closing line; returns non-zero when anything failed, or when SPES_TEST_ONLY
# selected no test at all (a typo, a renamed test).
finish() {
  [ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
  local none=false
  if [ -n "${SPES_TEST_ONLY:-}" ] && [ "$matched" -eq 0 ]; then
    none=true
    echo "no test's name matches SPES_TEST_ONLY='$SPES_TEST_ONLY'"
  fi
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ] && ! $none
}
