#!/usr/bin/env bash
# SIGUSR1 to `spes demo` while its peers train is passed on to them: each peer saves a checkpoint
# after its current step and trains on, as `spes train` does; the demo and its server go on (the
# signal's default action used to end the demo, orphaning its children). Then SIGTERM stops it
# all (demo_stop.sh) and no process of the demo is left.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
out=$(mktemp -d)
leftovers() { pgrep -f -- "$out/demo" || true; }
cleanup() { for p in $(leftovers); do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
steps() { grep -c '"step"' "$1" 2>/dev/null || echo 0; }

"$SPES_BIN" demo --peers 2 --experts_per_peer 2 --steps 100000 --sync_steps 3 --batch 2 --train_docs 300 \
  --no_baseline --out "$out/demo" > "$out/demo.txt" 2>&1 &
demo=$!
for _ in $(seq 1 600); do
  [ -s "$out/demo/peer0/metrics.jsonl" ] && [ -s "$out/demo/peer1/metrics.jsonl" ] && break; sleep 0.1
done
kill -USR1 "$demo"
saved() { grep -q "saved step [0-9]* as asked (SIGUSR1); training on" "$out/demo/peer$1.log"; }
for _ in $(seq 1 300); do saved 0 && saved 1 && break; kill -0 "$demo" 2>/dev/null || break; sleep 0.1; done
for p in 0 1; do
  saved "$p" || { tail -3 "$out/demo/peer$p.log"; bad "peer $p did not save on SIGUSR1"; }
  ls -d "$out/demo/peer$p"/step* > /dev/null 2>&1 || bad "peer $p has no checkpoint"
done
# Training goes on: every peer's steps grow, and the demo still runs.
before0=$(steps "$out/demo/peer0/metrics.jsonl") before1=$(steps "$out/demo/peer1/metrics.jsonl")
for _ in $(seq 1 300); do
  [ "$(steps "$out/demo/peer0/metrics.jsonl")" -gt "$before0" ] && [ "$(steps "$out/demo/peer1/metrics.jsonl")" -gt "$before1" ] && break
  sleep 0.1
done
[ "$(steps "$out/demo/peer0/metrics.jsonl")" -gt "$before0" ] && [ "$(steps "$out/demo/peer1/metrics.jsonl")" -gt "$before1" ] ||
  bad "the peers did not train on after saving"
kill -0 "$demo" 2>/dev/null || bad "the demo ended on SIGUSR1"
grep -q "demo: SIGUSR1: each training process saves a checkpoint" "$out/demo.txt" || bad "the demo did not say it passed SIGUSR1 on"
grep -qi "stopping\|stopped by" "$out/demo/peer0.log" "$out/demo/peer1.log" && bad "a peer read SIGUSR1 as a stop"

kill -TERM "$demo" 2>/dev/null
for _ in $(seq 1 300); do kill -0 "$demo" 2>/dev/null || break; sleep 0.1; done
kill -0 "$demo" 2>/dev/null && bad "the demo did not exit within 30 s of SIGTERM"
wait "$demo" 2>/dev/null
sleep 0.5
[ -z "$(leftovers)" ] || bad "processes left after the demo: $(leftovers | tr '\n' ' ')"
[ "$fail" = 0 ] || exit 1
echo "demo_save: OK (checkpoints: $(ls -d "$out"/demo/peer*/step* | xargs -n1 basename | tr '\n' ' '))"
