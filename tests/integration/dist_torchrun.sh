#!/usr/bin/env bash
# Ranks started torchrun-style, without mpirun (src/parallel/rendezvous.h): separate processes
# with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_WORLD_SIZE) set.
#   - 2 ranks (ZeRO-2) and 3 ranks (DDP) train what mpirun's ranks train: the same bits (the same
#     MPI collectives on a communicator of the same size), and 1 rank's within tolerance; also
#     under the real torchrun (the test virtualenv's) when it is there;
#   - a rank killed mid-run ends the other rank with a message naming it, within seconds;
#   - a rank whose peers never come fails after SPES_RENDEZVOUS_TIMEOUT with the missing ranks;
#   - LOCAL_WORLD_SIZE smaller than WORLD_SIZE (a multi-node torchrun job) is refused.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
command -v ompi-server >/dev/null || { echo "SKIPPED: no ompi-server (openmpi-bin)"; exit 77; }
tmp=$(mktemp -d)
uri_before=$(ls /tmp/spes-ompi-server-*.uri 2>/dev/null | sort || true)
pids=""
rank0s=""   # every rank 0 started: none may leave its ompi-server behind
trap 'for p in $pids; do kill -9 $p 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

# torchrun NAME NPROC [overrides...]: NPROC processes, one per rank, as torchrun starts them.
torchrun() {
  local name=$1 n=$2 port r
  shift 2
  port=$(free_port)
  pids=""
  for r in $(seq 0 $((n - 1))); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 300 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$name" "$@" >"$tmp/$name.$r.log" 2>&1 &
    pids="$pids $!"
    [ "$r" = 0 ] && rank0s="$rank0s $!"
  done
  for p in $pids; do
    wait "$p" || { echo "FAIL: torchrun-style $name ($n ranks $*)"; tail -20 "$tmp/$name".*.log; exit 1; }
  done
  pids=""
}
mpi() {   # mpi NAME NPROC [overrides...]
  local name=$1 n=$2
  shift 2
  "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$name" --nproc_per_node "$n" "$@" >"$tmp/$name.log" 2>&1 ||
    { echo "FAIL: mpirun $name"; tail -20 "$tmp/$name.log"; exit 1; }
}

mpi one 1
torchrun tr2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --ddp.bucket_cap_mb=0.01
grep -q "dist: 2 ranks, strategy zero2" "$tmp/tr2.0.log" || { echo "FAIL: tr2 did not run 2 ranks"; cat "$tmp/tr2.0.log"; exit 1; }
mpi mpi2 2 --fsdp.sharding_strategy=SHARD_GRAD_OP --ddp.bucket_cap_mb=0.01
dist_check mpi2 tr2 5 --tol 0 --exact-steps 5
dist_check one tr2 5 --tol 1e-5 --exact-steps 1
# torchrun itself (the test virtualenv's), whose agent holds MASTER_PORT for its own store.
if [ -x .venv/bin/torchrun ]; then
  .venv/bin/torchrun --nnodes 1 --nproc_per_node 2 --no-python "$SPES_BIN" train "$tmp/tiny.yaml" \
    --save_folder="$tmp/real2" --fsdp.sharding_strategy=SHARD_GRAD_OP --ddp.bucket_cap_mb=0.01 >"$tmp/real2.log" 2>&1 ||
    { echo "FAIL: torchrun"; tail -30 "$tmp/real2.log"; exit 1; }
  dist_check mpi2 real2 5 --tol 0 --exact-steps 5
else
  echo "(no .venv/bin/torchrun: the real torchrun case is skipped)"
fi
torchrun tr3 3 --distributed_strategy=ddp
mpi mpi3 3 --distributed_strategy=ddp
dist_check mpi3 tr3 5 --tol 0 --exact-steps 5
dist_check one tr3 5 --tol 1e-5 --exact-steps 1

# A killed rank: the other one ends with a message naming it, within seconds (rank 1 killed:
# rank 0 sees its socket close; rank 0 killed: rank 1 sees rank 0's close).
kill_one() {   # kill_one VICTIM SURVIVOR
  local victim=$1 survivor=$2 port r start rc=0
  port=$(free_port)
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/kill$victim" --max_duration=100000 \
      --save_interval_unsharded=100000 >"$tmp/kill$victim.$r.log" 2>&1 &
    eval "pid$r=$!"
  done
  pids="$pid0 $pid1"
  rank0s="$rank0s $pid0"
  for _ in $(seq 1 600); do grep -q "step 20/" "$tmp/kill$victim.0.log" && break; sleep 0.1; done
  grep -q "step 20/" "$tmp/kill$victim.0.log" || { echo "FAIL: the 2-rank job did not reach step 20"; tail "$tmp/kill$victim".*.log; exit 1; }
  start=$(date +%s)
  eval "kill -9 \$pid$victim"
  eval "local spid=\$pid$survivor"
  for _ in $(seq 1 300); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$spid" 2>/dev/null && { echo "FAIL: rank $survivor still runs 30 s after rank $victim died"; exit 1; }
  wait "$spid" || rc=$?
  wait "$pid0" "$pid1" 2>/dev/null || true
  pids=""
  echo "rank $survivor ended with status $rc, $(( $(date +%s) - start )) s after rank $victim was killed"
  [ "$rc" -ne 0 ] || { echo "FAIL: rank $survivor exited 0"; exit 1; }
  grep -q "rank $survivor of 2: rank $victim is gone" "$tmp/kill$victim.$survivor.log" ||
    { echo "FAIL: no message naming rank $victim"; tail "$tmp/kill$victim.$survivor.log"; exit 1; }
}
kill_one 1 0
kill_one 0 1

# Peers that never come: an error naming them, after the timeout.
port=$(free_port)
if RANK=0 LOCAL_RANK=0 WORLD_SIZE=3 MASTER_PORT=$port SPES_RENDEZVOUS_TIMEOUT=2 timeout 60 \
     "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/alone" >"$tmp/alone.log" 2>&1; then
  echo "FAIL: rank 0 alone succeeded"; exit 1
fi
grep -q "1 of 3 ranks connected to rank 0 within 2 s; missing: 1 2" "$tmp/alone.log" || { echo "FAIL: message"; cat "$tmp/alone.log"; exit 1; }
# A torchrun job over several nodes is not one node's ranks.
if RANK=1 LOCAL_RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_PORT=$port timeout 60 \
     "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/nodes" >"$tmp/nodes.log" 2>&1; then
  echo "FAIL: a multi-node WORLD_SIZE was accepted"; exit 1
fi
grep -q "WORLD_SIZE=4 spans several nodes (LOCAL_WORLD_SIZE=2)" "$tmp/nodes.log" || { echo "FAIL: message"; cat "$tmp/nodes.log"; exit 1; }
# Every rank 0 above stopped its ompi-server (it dies with rank 0) and removed its URI file.
sleep 1
for p in $rank0s; do
  pgrep -f "spes-ompi-server-$p.uri" >/dev/null && { echo "FAIL: rank 0 (pid $p)'s ompi-server left running"; exit 1; }
done
# (Only files that were not there before this test: another run's, e.g. of a rank 0 killed by
# SIGKILL, are not this test's to judge.)
comm -13 <(echo "$uri_before") <(ls /tmp/spes-ompi-server-*.uri 2>/dev/null | sort) | grep . &&
  { echo "FAIL: an ompi-server URI file was left behind"; exit 1; }
echo "dist_torchrun: OK"
