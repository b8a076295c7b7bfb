#!/usr/bin/env bash
# What the server says about a troubled run, checked while it runs: a real `spes server
# --round_timeout 8 --min_peers 2` and 4 `spes train` peers (tiny config, sync every 2 steps),
# watched with `spes status` (the gRPC Status the status page is filled from, server/peer_watch.h):
#  - after the first round peer 2 is frozen (SIGSTOP): while the open round waits on it past the
#    usual round time it shows as late, the others alive;
#  - the round closes without it (partial, counted as such), and it shows as missing;
#  - peer 3 is killed (SIGKILL) and peer 2 continued: peer 2 comes back alive, peer 3 shows as
#    missing once a round has closed without it;
#  - every peer that uploaded reported its metrics (step, loss, tokens/s) with its uploads.
# The same moments are checked in the server's HTTP status (--status_port, token required):
# /status.json's peer states, its partial round and metric points, and at the end the page
# loaded in headless Chromium (tests/integration/lib/status_page_check.sh; skipped without it),
# its screenshot kept in $SPES_BUILD/artifacts/status_page_run.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

fail() { echo "FAIL: $*"; [ -f "$dir/st" ] && cat "$dir/st"; exit 1; }

reliability_data
STEPS=10
echo "status-$RANDOM-token" >"$dir/status_token"
reliability_server --round_timeout 8 --min_peers 2 --status_port 0 --status_token_file "$dir/status_token"
pids+=($server_pid)
reliability_wait_log "status page on http://127.0.0.1:[0-9]*/ (token required)" "$dir/server.log"
status_url=$(sed -n 's|^spes server: status page on \(http://[^ ]*\) .*$|\1|p' "$dir/server.log")
token=$(cat "$dir/status_token")
peer_pids=()
for peer in 0 1 2 3; do
  reliability_peer $peer "$port" $STEPS "$dir/peer$peer" "$dir/peer$peer.log"
  peer_pids+=($last_pid)
  pids+=($last_pid)
done

st() { "$SPES" status 127.0.0.1:$port --timeout 5 >"$dir/st" 2>&1 || fail "spes status: $(cat "$dir/st")"; }
# wait_status REGEX WHAT: polls `spes status` (up to 60 s) until a line matches.
wait_status() {
  for _ in $(seq 300); do
    st
    grep -Eq "$1" "$dir/st" && return 0
    sleep 0.2
  done
  fail "never: $2"
}
peer_state() { awk -v p="$1" '$1 == p && NF >= 2 { print $2 }' "$dir/st"; }
# json_check PYTHON_EXPR WHAT: polls /status.json (up to 30 s) until the expression, over the
# document `d`, is true. Without the token the server must answer 401.
json_check() {
  for _ in $(seq 150); do
    python3 - "$status_url" "$token" "$1" >"$dir/js.err" 2>&1 <<'PY' && return 0
import json, sys, urllib.request, urllib.error
url, token, expr = sys.argv[1:]
try:
    urllib.request.urlopen(url + "status.json", timeout=5)
    sys.exit("status.json answered without the token")
except urllib.error.HTTPError as e:
    assert e.code == 401, e.code
req = urllib.request.Request(url + "status.json", headers={"Authorization": "Bearer " + token})
d = json.load(urllib.request.urlopen(req, timeout=5))
state = {p["peer"]: p["state"] for p in d["peers"]}
sys.exit(0 if eval(expr) else 1)
PY
    sleep 0.2
  done
  cat "$dir/js.err"; fail "status.json never showed: $2"
}

reliability_wait_log "step 2: aggregated 4 peers" "$dir/server.log"
kill -STOP "${peer_pids[2]}"
echo "peer 2 frozen (SIGSTOP) after round 2"
wait_status "^2 +late " "peer 2 late while round 4 waits on it"
grep -q "^open round *step 4: 3 of 4 peers uploaded" "$dir/st" || fail "round 4 open with 3 of 4"
for peer in 0 1 3; do [ "$(peer_state $peer)" = alive ] || fail "peer $peer not alive while peer 2 is late"; done
json_check 'state[2] == "late" and d["open_step"] == 4 and len(d["peers_uploaded"]) == 3' "peer 2 late, round 4 open"
echo "late: peer 2 late, peers 0 1 3 alive, round 4 open with 3 of 4 (spes status and status.json)"

reliability_wait_log "step 4: PARTIAL round: aggregated 3 of 4" "$dir/server.log"
wait_status "^2 +missing " "peer 2 missing after round 4 closed without it"
grep -Eq "^rounds +[0-9]+ completed, [1-9][0-9]* partial" "$dir/st" || fail "no partial round counted"
grep -Eq "^latest aggregate +step 4, 3 peers" "$dir/st" || fail "round 4 not shown with 3 peers"
json_check 'state[2] == "missing" and any(r["step"] == 4 and r["partial"] and r["peers"] == 3 for r in d["rounds"])' \
  "peer 2 missing, round 4 partial with 3 peers"
echo "partial: round 4 closed with 3 peers, peer 2 missing (spes status and status.json)"

kill -9 "${peer_pids[3]}"; wait "${peer_pids[3]}" 2>/dev/null || true
kill -CONT "${peer_pids[2]}"
echo "peer 3 killed (SIGKILL), peer 2 continued"
wait_status "^2 +alive " "peer 2 alive again after its late upload"
wait_status "^3 +missing " "peer 3 missing after a round closed without it"
json_check 'state[3] == "missing" and state[2] == "alive"' "peer 3 missing, peer 2 alive"
echo "killed: peer 3 missing; peer 2 back: alive (spes status and status.json)"

status=0
for i in 0 1 2; do wait "${peer_pids[$i]}" || { echo "peer $i failed:"; tail -20 "$dir/peer$i.log"; status=1; }; done
[ $status -eq 0 ] || { tail -30 "$dir/server.log"; exit 1; }
st
json_check 'all(len(d["peers"][p]["points"]) >= 4 and d["peers"][p]["latest"]["step"] == '$STEPS' for p in (0, 1, 2))' \
  "every finished peer's metric points"
shot="${SPES_BUILD:-build}/artifacts/status_page_run.png"
page_rc=0
bash tests/integration/lib/status_page_check.sh "${status_url}?token=$token" "$shot" peers=4 state:3=missing \
  curve:0 curve:1 curve:2 partial=4 || page_rc=$?
[ $page_rc -eq 0 ] || [ $page_rc -eq 77 ] || fail "the status page in Chromium"
kill "$server_pid"; wait "$server_pid" || true
# Metrics: each peer's newest reported step, loss and tokens/s (peer 3: up to its last upload
# before it was killed, round 4 or 6).
for peer in 0 1 2; do
  grep -Eq "^$peer +[a-z]+ +[0-9.]+ s ago +step $STEPS +$STEPS +[0-9]+\.[0-9]{4} +[0-9]+$" "$dir/st" ||
    fail "peer $peer's metrics at the end"
done
grep -Eq "^3 +missing +[0-9.]+ s ago +step ([46]) +\1 +[0-9]+\.[0-9]{4} +[0-9]+$" "$dir/st" || fail "peer 3's metrics"
cat "$dir/st"
echo "status: late, missing and partial shown while the run went on"
