# The fixture status server for integration tests (sourced): `test_status_http serve` from the
# unit tests serves the fixture run (tests/unit/status_fixture.h) on an ephemeral port.
#   start_fixture_server DIR [serve options...]   sets fixture_pid and fixture_port
# Exits 77 when the test program is not built; the caller kills $fixture_pid on exit.
start_fixture_server() {
  local dir=$1; shift
  local bin=${SPES_BUILD:-$PWD/build}/tests/test_status_http
  [ -x "$bin" ] || { echo "SKIPPED: $bin not built (make build)"; exit 77; }
  # The files go first: the redirect truncates them in the child, possibly after the loop below
  # has read a previous server's port from them.
  rm -f "$dir/serve.out" "$dir/serve.err"
  "$bin" serve "$@" >"$dir/serve.out" 2>"$dir/serve.err" &
  fixture_pid=$!
  fixture_port=""
  for _ in $(seq 100); do
    fixture_port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$dir/serve.out" 2>/dev/null || true)
    [ -n "$fixture_port" ] && return 0
    kill -0 "$fixture_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: the fixture status server did not start:"; cat "$dir/serve.err"; exit 1
}
