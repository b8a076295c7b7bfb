#!/usr/bin/env bash
# The status server (src/status/status_http.c) as a separate process serving the fixture run
# (`test_status_http serve`): /status.json fetched with curl and checked with Python, / and HEAD,
# 404; with a token file 401 without the token, 200 with it as a Bearer header or ?token=, and
# malformed requests in a loop logged at most 20 times a minute; then
# the hostile requests of tests/integration/lib/http_hostile.py (8 KiB and 100 KB URLs, bad
# methods, bodies, garbage, slow half-sent requests, 200 connections at once), answered or
# refused, the server still serving afterwards and still alive; and a slowloris (70 connections
# trickling headers) does not lock a client with the token out.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v curl >/dev/null || { echo "SKIPPED: curl not installed"; exit 77; }
. tests/integration/lib/status_fixture_server.sh
dir=$(mktemp -d)
fixture_pid=""
cleanup() { [ -n "$fixture_pid" ] && kill "$fixture_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/serve.err" ] && tail -5 "$dir/serve.err"; exit 1; }

# ---- open server ----
start_fixture_server "$dir" --timeout_s 2
url="http://127.0.0.1:$fixture_port"
code=$(curl -s -o "$dir/status.json" -w '%{http_code} %{content_type}' "$url/status.json")
[ "$code" = "200 application/json" ] || fail "GET /status.json: $code"
python3 - "$dir/status.json" <<'PY' || fail "status.json does not hold the fixture run"
import json, math, sys
d = json.load(open(sys.argv[1]), parse_constant=lambda c: sys.exit(f"non-JSON constant {c}"))
assert d["total_peers"] == 4 and d["rounds_completed"] == 6 and d["open_step"] == 70, d
assert d["mode"] == "spes" and d["fingerprint"] == "0123456789abcdef"
assert [p["state"] for p in d["peers"]] == ["alive", "late", "missing", "unseen"]
late = d["peers"][1]
assert late["last_upload_step"] == 50 and abs(late["seconds_since_seen"] - 65) < 1e-6
assert late["points"][3]["loss"] is None and len(late["points"]) == 25
assert d["peers"][0]["latest"]["mfu"] is None and d["peers"][3]["latest"] is None
rounds = d["rounds"]
assert [r["step"] for r in rounds] == [10, 20, 30, 40, 50, 60]
assert [r["partial"] for r in rounds] == [False] * 4 + [True, False]
assert rounds[4]["peers"] == 3 and rounds[0]["merge_alpha"] == 0.3 and rounds[5]["bytes_in"] == 6000000
print("status.json: the fixture run, NaN and infinity as null")
PY
code=$(curl -s -o "$dir/page.html" -w '%{http_code} %{content_type}' "$url/")
[ "$code" = "200 text/html; charset=utf-8" ] || fail "GET /: $code"
grep -q '<table id="peers">' "$dir/page.html" || fail "the page has no peers table"
curl -s -I "$url/" -o "$dir/head" -w '%{http_code}' | grep -q 200 || fail "HEAD / not 200"
grep -qi "^content-length: $(stat -c %s "$dir/page.html")" "$dir/head" || fail "HEAD's Content-Length is not the page's"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/metrics")" = 404 ] || fail "unknown path not 404"
python3 tests/integration/lib/http_hostile.py 127.0.0.1 "$fixture_port" --timeout_s 2 || fail "hostile requests"
kill -0 "$fixture_pid" || fail "the server died"
kill "$fixture_pid"; wait "$fixture_pid"; rc=$?
[ $rc -eq 0 ] || fail "the fixture server exited with $rc after SIGTERM"
fixture_pid=""

# ---- with a token ----
printf 'tok-%s\n' "$RANDOM$RANDOM" >"$dir/token"
token=$(tr -d '\n' <"$dir/token")
start_fixture_server "$dir" --token_file "$dir/token" --timeout_s 2
url="http://127.0.0.1:$fixture_port"
# A client looping on malformed requests cannot flood the log: at most 20 lines a minute, then one
# line saying the rest are dropped (checked first thing, well inside the server's first minute).
python3 - "$fixture_port" <<'PY'
import socket, sys
for _ in range(60):
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nnot a header line\r\n\r\n")   # 400, which libmicrohttpd logs
        while s.recv(4096):
            pass
PY
lines=$(grep -c "status http:" "$dir/serve.err")
[ "$lines" -le 21 ] || fail "$lines lines of libmicrohttpd messages in a minute (limit 20 + 1)"
grep -q "the rest of the minute's are dropped" "$dir/serve.err" || fail "no line saying messages are dropped"
for path in / /status.json; do
  [ "$(curl -s -o "$dir/body" -w '%{http_code}' "$url$path")" = 401 ] || fail "$path without the token: not 401"
  grep -q '"peers"\|<table' "$dir/body" && fail "$path without the token shows the run"
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong" "$url$path")" = 401 ] \
    || fail "$path with a wrong token: not 401"
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "$url$path")" = 200 ] \
    || fail "$path with the token as a Bearer header: not 200"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url$path?token=$token")" = 200 ] || fail "$path?token=: not 200"
done
curl -s "$url/?token=$token" | grep -q "href=\"status.json?token=$token\"" || fail "the page's link drops the token"
python3 tests/integration/lib/http_hostile.py 127.0.0.1 "$fixture_port" --token "$token" --connections 50 \
  || fail "hostile requests with a token"
kill "$fixture_pid"; wait "$fixture_pid"
fixture_pid=""

# ---- slowloris (issue 29): 70 connections trickling a header line a second, none idle for the
# timeout, must not lock a client with the token out (it used to get 0 of 13 requests) ----
start_fixture_server "$dir" --token_file "$dir/token"
python3 tests/integration/lib/http_slowloris.py 127.0.0.1 "$fixture_port" --token "$token" \
  || fail "slowloris locked the token holder out"
kill -0 "$fixture_pid" || fail "the server died under slowloris"
echo "status server: JSON, page, HEAD, 404, token, hostile requests and slowloris all as documented"
