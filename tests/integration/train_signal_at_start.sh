#!/usr/bin/env bash
# `spes train` installs its signal handlers first thing, so a signal during the start (the config
# load, the ranks joining, the data check) is kept for the first step boundary: SIGUSR1 saves
# after step 1 and training goes on (its default action used to end the process), and SIGINT or
# SIGTERM stops every rank before step 1, exit 0, nothing trained and no checkpoint written (they
# used to kill the process without a word). The start is held deterministically: rank 0 of a
# torchrun-style job (src/parallel/rendezvous.h) waits in the rendezvous, before anything is
# trained, until rank 1 comes; its ompi-server child shows it is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
command -v ompi-server > /dev/null || { echo "SKIPPED: no ompi-server (openmpi-bin)"; exit 77; }
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# rank NAME R PORT: rank R of 2 in the background (its pid in $rank_pid; a rank alone gives up
# after SPES_RENDEZVOUS_TIMEOUT, 60 s).
rank() {
  RANK=$2 LOCAL_RANK=$2 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$3 \
    "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$1" > "$tmp/$1.$2.log" 2>&1 &
  rank_pid=$!
  pids+=("$rank_pid")
}

# signal_at_start NAME SIGNAL: rank 0 gets SIGNAL while it waits for rank 1, then rank 1 comes.
# Both ranks must exit 0.
signal_at_start() {
  local name=$1 port r0 r1 rc
  port=$(free_port)
  rank "$name" 0 "$port"
  r0=$rank_pid
  for _ in $(seq 1 600); do pgrep -P "$r0" ompi-server > /dev/null && break; sleep 0.05; done
  pgrep -P "$r0" ompi-server > /dev/null || { bad "$name: rank 0 never waited in the rendezvous"; return; }
  kill -"$2" "$r0"
  rank "$name" 1 "$port"
  r1=$rank_pid
  rc=0
  wait "$r0" || rc=$?
  [ "$rc" = 0 ] || { tail -3 "$tmp/$name.0.log"; bad "$name: rank 0 exited $rc after SIG$2 at its start"; }
  rc=0
  wait "$r1" || rc=$?
  [ "$rc" = 0 ] || { tail -3 "$tmp/$name.1.log"; bad "$name: rank 1 exited $rc"; }
}

signal_at_start usr1 USR1
grep -q "saved step 1 as asked (SIGUSR1); training on" "$tmp/usr1.0.log" || bad "usr1: no save after step 1"
[ -d "$tmp/usr1/step1" ] && [ -d "$tmp/usr1/step5" ] || bad "usr1: expected step1 and step5, got: $(ls "$tmp/usr1" 2>&1 | tr '\n' ' ')"

signal_at_start term TERM
grep -q "stopped by signal before step 1: nothing trained, no checkpoint written" "$tmp/term.0.log" ||
  bad "term: the stop before step 1 was not said"
grep -q '"step"' "$tmp/term/metrics.jsonl" 2>/dev/null && bad "term: a step was trained after the stop"
ls -d "$tmp"/term/step* > /dev/null 2>&1 && bad "term: a checkpoint was written: $(ls -d "$tmp"/term/step*)"

[ "$fail" = 0 ] || exit 1
echo "train_signal_at_start: OK"
