#!/usr/bin/env bash
# Loads a page in headless Chromium (Debian's `chromium`) and writes what it rendered:
#   chromium_dom.sh URL DOM_OUT [SCREENSHOT_PNG]
# DOM_OUT gets the serialised DOM after load (--dump-dom); with SCREENSHOT_PNG also a 1280x2000
# screenshot. Exit 77 when Chromium is not installed, 1 when it fails or takes longer than
# CHROMIUM_TIMEOUT_S (default 60): it can never hang a test. Used by the status page tests.
set -u
url=$1 dom=$2 shot=${3:-}
bin=$(command -v chromium || command -v chromium-browser || true)
[ -n "$bin" ] || { echo "chromium is not installed (scripts/install-deps.sh installs it)"; exit 77; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --user-data-dir="$profile"
       --disable-extensions --disable-background-networking)
t=${CHROMIUM_TIMEOUT_S:-60}
# why_failed RC: a timeout says so (timeout(1) exits 124, or 137 after its KILL).
why_failed() { case $1 in 124|137) echo "timed out after ${t} s" ;; *) echo "exit $1" ;; esac; }
timeout -k 5 "$t" "$bin" "${flags[@]}" --dump-dom "$url" >"$dom" 2>"$profile/err.log"
rc=$?
if [ $rc -ne 0 ] || [ ! -s "$dom" ]; then
  echo "chromium --dump-dom $url failed ($(why_failed $rc)):"; tail -5 "$profile/err.log"; exit 1
fi
if [ -n "$shot" ]; then
  mkdir -p "$(dirname "$shot")"
  rm -f "$shot"
  timeout -k 5 "$t" "$bin" "${flags[@]}" --window-size=1280,2000 --screenshot="$shot" "$url" \
    >/dev/null 2>"$profile/err.log"
  rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$shot" ]; then
    echo "chromium --screenshot $url failed ($(why_failed $rc)):"; tail -5 "$profile/err.log"; exit 1
  fi
fi
exit 0
