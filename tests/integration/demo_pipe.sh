#!/usr/bin/env bash
# `spes demo | head -1`: the demo's stdout is a pipe whose reader ends after one line. The demo
# runs to its end (exit 0, the peers' final checkpoints written) and leaves no process behind; it
# used to die of SIGPIPE at its next line (exit 141) and orphan its server, which served on forever.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
out=$(mktemp -d)
leftovers() { pgrep -f -- "$out/demo" || true; }
cleanup() { for p in $(leftovers); do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT
fail=0

"$SPES_BIN" demo --peers 2 --experts_per_peer 2 --steps 30 --sync_steps 3 --batch 2 --train_docs 300 \
  --no_baseline --out "$out/demo" 2> "$out/demo.err" | head -1 > "$out/head.txt"
rc=${PIPESTATUS[0]}
sleep 0.5
[ "$rc" = 0 ] || { echo "FAIL: the demo exited $rc with its stdout's reader gone (141: SIGPIPE)"; cat "$out/demo.err"; fail=1; }
grep -q "^SPES demo: 2 peers" "$out/head.txt" || { echo "FAIL: head did not get the demo's first line"; fail=1; }
left=$(leftovers)
if [ -n "$left" ]; then
  echo "FAIL: processes left after the demo:"; ps -o pid,args -p "$(echo $left | tr ' ' ,)" | cut -c1-150; fail=1
fi
for p in 0 1; do
  [ -f "$out/demo/peer$p/step30/model.safetensors" ] || { echo "FAIL: peer $p did not save step 30"; fail=1; }
done
[ "$fail" = 0 ] || exit 1
echo "demo_pipe: OK"
