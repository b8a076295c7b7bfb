#!/usr/bin/env bash
# The torchrun-style rendezvous (src/parallel/rendezvous.c) against processes that are not ranks,
# ranks that disagree, and half a torchrun environment (issue 29, items 4-6):
#   - a process of another user claiming RANK=1 first is refused; the real rank 1 joins, the job
#     trains (needs root and setpriv to be another user; skipped otherwise);
#   - a silent connection does not hold the rendezvous (it used to take the whole
#     SPES_RENDEZVOUS_TIMEOUT, then fail);
#   - a process of this user that claims RANK=1 and never joins MPI ends rank 0 within the
#     timeout, naming rank 1 (it used to hang in MPI_Comm_accept forever);
#   - ranks started with different configurations are refused, naming the keys (another
#     learning rate used to train and exit 0; another batch size or strategy hung); a per-rank
#     key (threads) may differ; --resume on one rank only is refused too;
#   - WORLD_SIZE=2 without MASTER_PORT, or without LOCAL_RANK, is refused naming the variable;
#     LOCAL_WORLD_SIZE=1 with WORLD_SIZE=2 (one process per node) for a training that is not a
#     SPES peer is refused (it used to train as independent one-rank jobs on one save_folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
command -v ompi-server >/dev/null || { echo "SKIPPED: no ompi-server (openmpi-bin)"; exit 77; }
tmp=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
impostor=tests/integration/lib/rdv_impostor.py

# rank R PORT NAME [overrides...]: one torchrun-style rank of 2 in the background; its pid in $last.
rank() {
  local r=$1 port=$2 name=$3
  shift 3
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$name" "$@" >"$tmp/$name.$r.log" 2>&1 &
  last=$!
  pids="$pids $last"
}
# finish PID SECONDS: wait for PID at most SECONDS; its exit status in $rc (124: still running, killed).
finish() {
  local pid=$1 limit=$2 i
  rc=0
  for ((i = 0; i < limit * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rc=124; return; fi
  wait "$pid" || rc=$?
}
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; tail -15 "$f"; done; exit 1; }

# 1. Another user's process claims RANK=1 before the real rank 1 connects.
case_other_user() {
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && [ -x /usr/bin/python3 ]; then
  port=$(free_port)
  rank 0 "$port" other; r0=$last
  setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$impostor" 127.0.0.1 "$port" claim 1 2 \
    >"$tmp/other.impostor.log" 2>&1 &
  imp=$!; pids="$pids $imp"
  for _ in $(seq 100); do grep -q connected "$tmp/other.impostor.log" && break; sleep 0.1; done
  sleep 0.5
  rank 1 "$port" other; r1=$last
  finish "$r0" 90; rc0=$rc; finish "$r1" 30; rc1=$rc
  { kill -9 "$imp"; wait "$imp"; } 2>/dev/null || true
  [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "another user's impostor: ranks ended $rc0/$rc1" "$tmp/other.0.log" "$tmp/other.1.log" "$tmp/other.impostor.log"
  grep -q "refused a connection from uid 65534" "$tmp/other.0.log" || fail "no refusal naming the uid" "$tmp/other.0.log"
  grep -q "uri received" "$tmp/other.impostor.log" && fail "the impostor got the ompi-server URI" "$tmp/other.impostor.log"
  echo "another user's impostor refused; the real ranks trained"
else
  echo "(not root or no setpriv: the other-user impostor case is skipped)"
fi
}

# 2. A silent connection first, then the real rank 1: the job trains well within the timeout.
case_silent() {
port=$(free_port)
start=$(date +%s)
SPES_RENDEZVOUS_TIMEOUT=20 rank 0 "$port" silent; r0=$last
python3 "$impostor" 127.0.0.1 "$port" silent >"$tmp/silent.impostor.log" 2>&1 &
imp=$!; pids="$pids $imp"
for _ in $(seq 100); do grep -q connected "$tmp/silent.impostor.log" && break; sleep 0.1; done
SPES_RENDEZVOUS_TIMEOUT=20 rank 1 "$port" silent; r1=$last
finish "$r0" 90; rc0=$rc; finish "$r1" 30; rc1=$rc
{ kill -9 "$imp"; wait "$imp"; } 2>/dev/null || true
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "silent connection: ranks ended $rc0/$rc1" "$tmp/silent.0.log" "$tmp/silent.1.log"
took=$(( $(date +%s) - start ))
[ "$took" -lt 20 ] || fail "the silent connection held the rendezvous for $took s" "$tmp/silent.0.log"
echo "a silent connection did not hold the rendezvous: the job took $took s (timeout 20 s)"
}

# 3. A process of this user claims RANK=1 and never joins MPI: rank 0 ends within the timeout.
case_claim() {
port=$(free_port)
start=$(date +%s)
SPES_RENDEZVOUS_TIMEOUT=5 rank 0 "$port" claim; r0=$last
python3 "$impostor" 127.0.0.1 "$port" claim 1 2 >"$tmp/claim.impostor.log" 2>&1 &
imp=$!; pids="$pids $imp"
finish "$r0" 40; rc0=$rc
{ kill -9 "$imp"; wait "$imp"; } 2>/dev/null || true
[ "$rc0" != 0 ] && [ "$rc0" != 124 ] || fail "a rank 1 that never joins MPI: rank 0 ended $rc0" "$tmp/claim.0.log" "$tmp/claim.impostor.log"
grep -q "rank 1 did not join the MPI communicator within 5 s" "$tmp/claim.0.log" || fail "message" "$tmp/claim.0.log"
echo "a RANK=1 that never joins MPI ended rank 0 after $(( $(date +%s) - start )) s"
}

# 4. Ranks with different configurations.
differ() {   # differ NAME "rank 0 overrides" "rank 1 overrides" KEY...
  local name=$1 o0=$2 o1=$3 port k
  shift 3
  port=$(free_port)
  # shellcheck disable=SC2086
  rank 0 "$port" "$name" $o0; r0=$last
  # shellcheck disable=SC2086
  rank 1 "$port" "$name" $o1; r1=$last
  finish "$r0" 60; rc0=$rc; finish "$r1" 30; rc1=$rc
  [ "$rc0" != 0 ] && [ "$rc0" != 124 ] && [ "$rc1" != 0 ] && [ "$rc1" != 124 ] ||
    fail "$name: ranks with different configurations ended $rc0/$rc1" "$tmp/$name.0.log" "$tmp/$name.1.log"
  for k in "$@"; do
    grep -q "configuration differs from rank 0's.*$k" "$tmp/$name.0.log" || fail "$name: rank 0 does not name $k" "$tmp/$name.0.log"
  done
  [ ! -d "$tmp/$name/step5" ] || fail "$name: trained anyway" "$tmp/$name.0.log"
  echo "$name: refused, naming $*"
}
case_differ() {
differ lr "--optimizer.learning_rate=0.001" "--optimizer.learning_rate=0.002" "optimizer.learning_rate: 0.001 -> 0.002"
differ batch "--global_train_batch_size=4 --distributed_strategy=ddp" "--global_train_batch_size=8 --distributed_strategy=fsdp" \
  "global_train_batch_size: 4 -> 8" "distributed_strategy: \"ddp\" -> \"fsdp\""
port=$(free_port)
rank 0 "$port" threads --threads=1; r0=$last
rank 1 "$port" threads --threads=2; r1=$last
finish "$r0" 90; rc0=$rc; finish "$r1" 30; rc1=$rc
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "ranks differing only in threads ended $rc0/$rc1" "$tmp/threads.0.log" "$tmp/threads.1.log"
# --resume on one rank only: it would start at step 5, the other at 0.
port=$(free_port)
rank 0 "$port" threads --max_duration=8 --resume; r0=$last
rank 1 "$port" threads --max_duration=8; r1=$last
finish "$r0" 60; rc0=$rc; finish "$r1" 30; rc1=$rc
[ "$rc0" != 0 ] && [ "$rc0" != 124 ] && [ "$rc1" != 0 ] && [ "$rc1" != 124 ] ||
  fail "--resume on rank 0 only: ranks ended $rc0/$rc1" "$tmp/threads.0.log" "$tmp/threads.1.log"
grep -q "configuration differs from rank 0's.*--resume: true -> false" "$tmp/threads.0.log" || fail "message" "$tmp/threads.0.log"
[ ! -d "$tmp/threads/step8" ] || fail "--resume on rank 0 only: trained anyway" "$tmp/threads.0.log"
echo "--resume on one rank only: refused"
}

# 5. Half a torchrun environment.
half() {   # half NAME EXPECTED-MESSAGE VAR=VALUE...
  local name=$1 msg=$2
  rc=0
  shift 2
  env "$@" timeout 60 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$name" >"$tmp/$name.log" 2>&1 || rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "$name: ended $rc" "$tmp/$name.log"
  grep -q "$msg" "$tmp/$name.log" || fail "$name: message" "$tmp/$name.log"
  [ ! -d "$tmp/$name/step5" ] || fail "$name: trained anyway" "$tmp/$name.log"
  echo "$name: refused"
}
case_half() {
half no_port "MASTER_PORT is not set" RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
half no_port_addr "MASTER_PORT is not set" RANK=0 LOCAL_RANK=0 WORLD_SIZE=2
half no_local_rank "LOCAL_RANK is not set" RANK=1 WORLD_SIZE=2 MASTER_PORT=29500
half no_rank "RANK is not set" LOCAL_RANK=0 WORLD_SIZE=2 MASTER_PORT=29500
half per_node "LOCAL_WORLD_SIZE=1 with WORLD_SIZE=2" RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_PORT=29500
}
# DIST_RDV_CASES picks cases (e.g. to watch one fail against an older build).
for c in ${DIST_RDV_CASES:-other_user silent claim differ half}; do "case_$c"; done
echo "dist_rendezvous_hostile: OK"
