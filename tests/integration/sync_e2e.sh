#!/usr/bin/env bash
# Real server + 4 peer processes for 3 sync rounds (tests/unit/test_sync_e2e.c), then an
# independent numpy check of every logged upload and download, the merge step included.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="$SPES_BUILD/tests/test_sync_e2e"
[ -x "$BIN" ] || { echo "test_sync_e2e not built"; exit 1; }
if [ ! -x "${SPES_VENV_PY:-}" ]; then echo "SKIPPED: no test virtualenv at ${SPES_VENV_PY:-<unset>} (make venv)"; exit 77; fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
SYNC_E2E_DIR="$dir" "$BIN"
# Settings of test_sync_e2e.c: 4 peers, 2 experts each, merge every 20 steps, alpha 0.5 decaying over 100 steps, top-3.
"$SPES_VENV_PY" tests/ref/check_sync_e2e.py "$dir" 4 2 20 0.5 100 3 10 20 30
