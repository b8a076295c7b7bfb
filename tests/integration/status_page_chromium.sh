#!/usr/bin/env bash
# The status page in a real browser: headless Chromium (Debian's `chromium`) loads the fixture
# run's page (`test_status_http serve`, with a token passed as ?token=) and its rendered DOM must
# show the peers table with each peer's state, a loss curve per reporting peer, the round bars
# and the partial round (tests/integration/lib/status_page_check.sh, reusable for a real run).
# The screenshot is kept as a test artifact: $SPES_BUILD/artifacts/status_page.png (DOM next to
# it). Skipped (77) without Chromium.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
  || { echo "SKIPPED: chromium not installed (scripts/install-deps.sh installs it)"; exit 77; }
. tests/integration/lib/status_fixture_server.sh
dir=$(mktemp -d)
fixture_pid=""
cleanup() { [ -n "$fixture_pid" ] && kill "$fixture_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
echo "browser-token" >"$dir/token"
start_fixture_server "$dir" --token_file "$dir/token"
shot=${SPES_BUILD:-$PWD/build}/artifacts/status_page.png
rm -f "$shot"
bash tests/integration/lib/status_page_check.sh "http://127.0.0.1:$fixture_port/?token=browser-token" "$shot" \
  peers=4 state:0=alive state:1=late state:2=missing state:3=unseen curve:0 curve:1 curve:2 curves=4 \
  bars=6 'rounds>=6' partial=50
rc=$?
[ $rc -eq 77 ] && { echo "SKIPPED: chromium could not be found"; exit 77; }
[ $rc -eq 0 ] || { echo "FAIL: the page in Chromium"; tail -5 "$dir/serve.err"; exit 1; }
