#!/usr/bin/env bash
# Stopping `spes demo` (SIGTERM, then again with SIGINT) while its peers train stops its children
# too: each peer saves a checkpoint and exits, the server is stopped, and no `spes` process of
# the demo is left behind (they used to be orphaned and train on). The demo exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
out=$(mktemp -d)
leftovers() { pgrep -f -- "$out/demo" || true; }
cleanup() { for p in $(leftovers); do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT
fail=0

# stop_demo <signal>: starts a long demo, sends <signal> once both peers are training, checks.
stop_demo() {
  rm -rf "$out/demo"
  "$SPES_BIN" demo --peers 2 --experts_per_peer 2 --steps 100000 --sync_steps 3 --batch 2 --train_docs 300 \
    --no_baseline --out "$out/demo" >"$out/demo.txt" 2>&1 &
  local demo=$! rc=0
  for _ in $(seq 1 600); do
    [ -s "$out/demo/peer0/metrics.jsonl" ] && [ -s "$out/demo/peer1/metrics.jsonl" ] && break; sleep 0.1
  done
  kill -"$1" "$demo"
  for _ in $(seq 1 300); do kill -0 "$demo" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$demo" 2>/dev/null; then echo "FAIL $1: the demo did not exit within 30 s"; fail=1; return; fi
  wait "$demo" || rc=$?
  sleep 0.5
  local left
  left=$(leftovers)
  if [ -n "$left" ]; then
    echo "FAIL $1: orphaned processes after the demo exited:"; ps -o pid,args -p $(echo $left | tr ' ' ,) | cut -c1-150; fail=1
  elif [ $rc -eq 0 ]; then
    echo "FAIL $1: the demo exited 0 after being stopped"; fail=1
  elif ! grep -q "saved step\|saved .*/step" "$out/demo/peer0.log" "$out/demo/peer1.log"; then
    echo "FAIL $1: the peers saved no checkpoint when stopped"; tail -5 "$out/demo/peer0.log"; fail=1
  else
    echo "ok   $1: demo exit $rc, no process left, peers saved: $(ls -d "$out"/demo/peer*/step* | xargs -n1 basename | tr '\n' ' ')"
  fi
}
stop_demo TERM
stop_demo INT
exit $fail
