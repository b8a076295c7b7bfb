#!/usr/bin/env bash
# `spes status` against a hostile server (issue 29, tests/integration/lib/hostile_status_server.py):
# total_peers 2^31-1 made it print gigabytes, a negative byte counter printed
# "-9223372036854.8 MB", and `--timeout 3` against a server that accepts and never answers waited
# 30 s. Each is now refused with the field named, within the timeout, printing a few lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x "${SPES_BIN:-}" ] || { echo "spes binary not built: ${SPES_BIN:-<unset>}"; exit 1; }
/usr/bin/python3 -c "import grpc, google.protobuf" 2>/dev/null ||
  { echo "SKIPPED: python3-grpcio / python3-protobuf missing (scripts/install-deps.sh)"; exit 77; }
command -v protoc-c >/dev/null || { echo "SKIPPED: protoc-c missing"; exit 77; }
tmp=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
protoc-c --proto_path=proto --descriptor_set_out="$tmp/federated.desc" proto/federated.proto || fail "protoc-c"

# hostile MODE: starts the fake server, sets port.
hostile() {
  [ -n "$server_pid" ] && { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; }
  rm -f "$tmp/server.out"   # the redirection below happens in the child: the previous server's port could be read
  /usr/bin/python3 tests/integration/lib/hostile_status_server.py "$tmp/federated.desc" "$1" >"$tmp/server.out" 2>&1 &
  server_pid=$!
  port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$tmp/server.out" 2>/dev/null || true)
    [ -n "$port" ] && return 0
    sleep 0.1
  done
  fail "the hostile server ($1) did not start: $(cat "$tmp/server.out")"
}

for mode in huge_peers negative_bytes; do
  hostile $mode
  timeout 30 "$SPES_BIN" status "127.0.0.1:$port" --timeout 3 >"$tmp/$mode.out" 2>&1
  rc=$?
  size=$(stat -c %s "$tmp/$mode.out")
  [ "$size" -lt 4096 ] || fail "$mode: spes status printed $size bytes"
  [ $rc -eq 1 ] || fail "$mode: exit $rc, want 1: $(head -c 500 "$tmp/$mode.out")"
  want=$([ $mode = huge_peers ] && echo "total_peers 2147483647" || echo "bytes_sent -9223372036854775808")
  grep -q "$want" "$tmp/$mode.out" || fail "$mode: the bad field is not named: $(cat "$tmp/$mode.out")"
  echo "ok   $mode: refused, naming it ($(tail -1 "$tmp/$mode.out"))"
done

hostile silent
start=$(date +%s.%N)
timeout 30 "$SPES_BIN" status "127.0.0.1:$port" --timeout 3 >"$tmp/silent.out" 2>&1
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
[ $rc -ne 0 ] || fail "silent server: exit 0"
[ "$(echo "$took < 8" | bc)" = 1 ] || fail "silent server: --timeout 3 took ${took}s"
echo "ok   silent server: gave up after ${took}s (--timeout 3), exit $rc"
