#!/usr/bin/env bash
# `spes status ADDR` against a real `spes server`: usage errors, an unreachable server ends
# within its --timeout with a message, a server with a token refuses a status call without
# it, the run is described before any peer (4 peers, spes, no aggregate), and while 3 of 4
# peers have uploaded the first round it names the open step, the uploaded peers and the one
# awaited, and lists each peer (alive, its last upload, the step and loss it reported; the
# missing one unseen); after the rounds complete it shows the aggregate, the traffic and every
# peer alive at step 4.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin
[ -x "$SPES" ] || { echo "spes binary not built: $SPES"; exit 1; }
cleanup_extra() { kill $(jobs -p) 2>/dev/null; }
fail() { echo "FAIL: $*"; exit 1; }

"$SPES" status --help >"$dir/help" || fail "--help exits non-zero"
grep -q -- "--auth_token_file" "$dir/help" || fail "--help does not list --auth_token_file"
"$SPES" status >/dev/null 2>&1; [ $? -eq 2 ] || fail "no address: exit code not 2"
start=$(date +%s)
"$SPES" status 127.0.0.1:1 --timeout 1 >"$dir/unreach" 2>&1; rc=$?
[ $rc -eq 1 ] || fail "unreachable server: exit code $rc, not 1"
[ $(( $(date +%s) - start )) -le 10 ] || fail "unreachable server: took longer than 10 s"
grep -q "127.0.0.1:1" "$dir/unreach" || fail "unreachable server not named: $(cat "$dir/unreach")"

. tests/integration/lib/reliability.sh
reliability_data
echo "status-test-token" >"$dir/token"
reliability_server --auth_token_file "$dir/token"
reliability_wait_log "listening on" "$dir/server.log" || exit 1

"$SPES" status 127.0.0.1:$port --timeout 5 >"$dir/noauth" 2>&1
[ $? -eq 1 ] || fail "status without the token succeeded"
grep -qi "unauthenticated\|token" "$dir/noauth" || fail "missing token not explained: $(cat "$dir/noauth")"

st() { "$SPES" status 127.0.0.1:$port --auth_token_file "$dir/token" --timeout 5 >"$dir/$1" 2>&1 || fail "status ($1): $(cat "$dir/$1")"; }
st before
grep -q "^peers *4, mode spes" "$dir/before" || fail "run not described: $(cat "$dir/before")"
grep -q "^latest aggregate *none yet" "$dir/before" || fail "aggregate before any round: $(cat "$dir/before")"
grep -q "^open round *none" "$dir/before" || fail "open round before any upload: $(cat "$dir/before")"

# Peers 0, 1, 3 (4 steps, sync every 2) upload step 2; peer 2 is not started yet: the round
# stays open.
RELIABILITY_PEER_ARGS="--spes_config.auth_token_file=$dir/token"
pids=()
for peer in 0 1 3; do
  reliability_peer $peer "$port" 4 "$dir/peer$peer" "$dir/peer$peer.log"
  pids+=("$last_pid")
done
for _ in $(seq 300); do
  st open
  grep -q "3 of 4 peers uploaded" "$dir/open" && break
  sleep 0.2
done
grep -q "^open round *step 2: 3 of 4 peers uploaded" "$dir/open" || fail "open round: $(cat "$dir/open")"
grep -q "^  uploaded *0 1 3$" "$dir/open" || fail "uploaded peers: $(cat "$dir/open")"
grep -q "^  awaited *2$" "$dir/open" || fail "awaited peer: $(cat "$dir/open")"
# The peers table: the three that uploaded step 2 reported their steps 1-2 with it (loss, tokens/s);
# peer 2 never called.
for peer in 0 1 3; do
  grep -Eq "^$peer +(alive|late) +[0-9.]+ s ago +step 2 +2 +[0-9]+\.[0-9]{4} +[0-9]+$" "$dir/open" ||
    fail "peer $peer's line: $(cat "$dir/open")"
done
grep -Eq "^2 +unseen +never +none +- +- +-$" "$dir/open" || fail "peer 2's line: $(cat "$dir/open")"

reliability_peer 2 "$port" 4 "$dir/peer2" "$dir/peer2.log"
pids+=("$last_pid")
for p in "${pids[@]}"; do wait "$p" || fail "a peer failed: $(tail -5 "$dir"/peer*.log)"; done
st after
grep -q "^rounds *2 completed, 0 partial" "$dir/after" || fail "rounds after: $(cat "$dir/after")"
grep -q "^latest aggregate *step 4, 4 peers" "$dir/after" || fail "aggregate after: $(cat "$dir/after")"
grep -q "^open round *none" "$dir/after" || fail "open round after: $(cat "$dir/after")"
awk '/^received \(uploads\)/ { exit !($3 > 0) }' "$dir/after" || fail "no bytes received: $(cat "$dir/after")"
for peer in 0 1 2 3; do
  grep -Eq "^$peer +alive +[0-9.]+ s ago +step 4 +4 " "$dir/after" || fail "peer $peer after: $(cat "$dir/after")"
done
cat "$dir/after"
echo "spes status: ok"
