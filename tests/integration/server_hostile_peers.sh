#!/usr/bin/env bash
# A real `spes server` against hostile or buggy CLIENTS (tests/integration/lib/hostile_sync_peer.py;
# the other direction is sync_peer_hostile_server.sh). On a quiet server: fat Hellos at once (the
# server's peak memory bounded), broken upload streams, calls abandoned mid-way (threads and fds
# back), a peer's stalled upload attempts (each cancelled as the next begins), messages stopped one
# byte short (gRPC's receive memory bounded). Then 4 honest tiny `spes train` peers run 6 steps
# while the hostile client sends every integer field at its extremes, waits and downloads of steps
# far in the past and future, and a call flood: the honest run must complete with every peer
# holding the server's aggregates, and the server must still be up.
# Last, on a server whose gRPC receive quota is at its least (--max_receive_buffer 32 MiB), the
# hostile client keeps the quota full while the 4 honest peers run 6 steps: gRPC resets streams
# it picks, honest ones too (RESOURCE_EXHAUSTED "Received RST_STREAM with error code 11"), and
# the peers must retry them (src/sync/call_retry.h) and complete, holding the server's aggregates.
# SPES_HOSTILE_PEER_CASES="fields flood" runs only those cases (no honest run unless named: run).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv
/usr/bin/python3 -c "import grpc, google.protobuf" 2>/dev/null ||
  { echo "SKIPPED: python3-grpcio / python3-protobuf missing (scripts/install-deps.sh)"; exit 77; }
command -v protoc-c >/dev/null || { echo "SKIPPED: protoc-c missing"; exit 77; }
protoc-c --proto_path=proto --descriptor_set_out="$dir/federated.desc" proto/federated.proto
reliability_data
fail() { echo "FAIL: $*"; exit 1; }
cases=${SPES_HOSTILE_PEER_CASES:-"hello_fat chunks abandon supersede stall_message run fields far_steps flood quota_reset"}
want() { [[ " $cases " == *" $1 "* ]]; }

mkdir -p "$dir/run"
# Long polls capped at 3 s and idle calls cut after 5 s, so that abandoned calls end quickly.
reliability_server --state_dir "$dir/run/state" --max_wait_seconds 3 --idle_timeout_seconds 5
reliability_wait_log "listening on" "$dir/server.log"
hostile() { /usr/bin/python3 tests/integration/lib/hostile_sync_peer.py "$dir/federated.desc" "127.0.0.1:$port" "$server_pid" "$@"; }

for c in hello_fat chunks abandon supersede stall_message; do
  if want $c; then hostile $c || fail "$c (server log: $(tail -3 "$dir/server.log"))"; fi
done

if want run; then
  # The hostile client keeps at it while the honest run goes on (none of its calls may take an
  # honest peer's place: its uploads are refused at their first message, its peer ids out of range
  # or its requests refused before they could claim a peer's id).
  (
    set +e
    for c in fields far_steps flood; do
      if want $c; then hostile $c || echo "hostile case $c failed"; fi
    done
    while [ ! -f "$dir/run/done" ]; do out=$(hostile far_steps 2>&1) || echo "hostile case far_steps failed: $out"; done
  ) >"$dir/hostile.log" 2>&1 &
  hostile_pid=$!
  pids+=("$hostile_pid")
  reliability_run_peers "$dir/run" 6 2
  touch "$dir/run/done"
  wait "$hostile_pid" || true
  cat "$dir/hostile.log"
  ! grep "^FAIL\|^hostile case" "$dir/hostile.log" || fail "the hostile client's checks failed during the honest run"
  kill -0 "$server_pid" || fail "the server died: $(tail -5 "$dir/server.log")"
  cp "$dir/server.log" "$dir/run/server.log"
  server_matches_peers "$dir/run" 4 6   # the kept aggregates (--keep_steps 2)
  peers_match_aggregate "$dir/run" 4 2 4 6
  echo "ok: run: 4 honest peers completed 3 rounds while the hostile client misbehaved"
fi

if want quota_reset; then
  kill "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  mkdir -p "$dir/quota"
  # The least quota the server takes: two of its largest requests (a 16 MiB Hello).
  reliability_server --state_dir "$dir/quota/state" --max_receive_buffer $((32 << 20)) --max_wait_seconds 3 \
    --idle_timeout_seconds 5
  reliability_wait_log "listening on" "$dir/server.log"
  SPES_HOSTILE_UNTIL="$dir/quota/done" hostile quota_hold >"$dir/quota/hostile.log" 2>&1 &
  hostile_pid=$!
  pids+=("$hostile_pid")
  reliability_run_peers "$dir/quota" 10 2
  touch "$dir/quota/done"
  wait "$hostile_pid" || fail "quota_hold: $(cat "$dir/quota/hostile.log")"
  cat "$dir/quota/hostile.log"
  kill -0 "$server_pid" || fail "the server died: $(tail -5 "$dir/server.log")"
  cp "$dir/server.log" "$dir/quota/server.log"
  server_matches_peers "$dir/quota" 8 10
  peers_match_aggregate "$dir/quota" 4 2 4 6 8 10
  retried=$(cat "$dir"/quota/peer*.log | grep -c "reset by the server's receive quota" || true)
  echo "ok: quota_reset: 4 honest peers completed 5 rounds under a full receive quota ($retried of their calls reset and retried)"
fi
