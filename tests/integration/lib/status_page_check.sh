#!/usr/bin/env bash
# Loads a status page in headless Chromium and checks its rendered DOM:
#   status_page_check.sh URL SCREENSHOT_PNG EXPECTATION...
# (expectations as in status_dom_check.py: peers=4 state:2=missing curve:0 bars>=3 partial ...).
# Keeps the screenshot at SCREENSHOT_PNG and the DOM next to it (.dom.html) as test artifacts.
# Exit 0 when the page shows every expectation, 77 when Chromium is not installed (message on the
# last line), 1 otherwise. Chromium runs under a timeout (chromium_dom.sh): it cannot hang a test.
set -u
lib=$(cd "$(dirname "$0")" && pwd)
url=$1 shot=$2; shift 2
dom="${shot%.png}.dom.html"
mkdir -p "$(dirname "$shot")"
bash "$lib/chromium_dom.sh" "$url" "$dom" "$shot"
rc=$?
[ $rc -eq 0 ] || exit $rc
python3 -c 'import sys; sys.exit(open(sys.argv[1], "rb").read(8) != b"\x89PNG\r\n\x1a\n")' "$shot" ||
  { echo "screenshot $shot is not a PNG"; exit 1; }
python3 "$lib/status_dom_check.py" "$dom" "$@" || exit 1
echo "page checked in Chromium: DOM $dom, screenshot $shot"
