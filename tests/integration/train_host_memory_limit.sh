#!/usr/bin/env bash
# The memory check at the start of `spes train` counts the limits a process really has, not only
# the host's MemAvailable (base/host_memory.h): under `ulimit -v` and in a memory cgroup (a
# container's limit) too small for the run, it stops before the first step naming the limit,
# where it used to start and then fail an allocation mid-run, be killed by the kernel, or hang in
# OpenBLAS (which spins when its buffer allocation fails). A limit the run fits trains.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
cg=""
cleanup() { [ -n "$cg" ] && rmdir "$cg" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export SPES_NUM_THREADS=1

# A model whose plan peaks at ~0.57 GiB: the tiny MoE with a 50k vocabulary, 64 x 32 tokens a step.
source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 200
tiny_config "$tmp" memlimit
sed -i 's/d_model: 32/d_model: 256/; s/vocab_size: 64/vocab_size: 50304/; s/embedding_size: 64/embedding_size: 50304/' "$tmp/tiny.yaml"
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 4
global_train_batch_size: 64
device_train_microbatch_size: 64
EOF

fail=0
ran=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
refused() {   # refused NAME LIMIT_TEXT: the run stopped before step 1, naming the limit
  grep -q "out of memory before the first step: .* free on cpu .*($2)" "$tmp/$1.log" &&
    ! grep -q "info\] step 1/" "$tmp/$1.log" || { tail -3 "$tmp/$1.log"; bad "$1: not refused at the start naming $2"; }
}

# ulimit -v (not under ASan, whose shadow memory cannot be mapped under an address-space limit)
if [ -z "${SPES_ASAN:-}" ]; then
  ran=1
  (ulimit -v 1000000; timeout 120 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/as" > "$tmp/as.log" 2>&1)
  [ $? = 1 ] || bad "ulimit -v 1 GB: exit status not 1"
  refused as "the address-space limit (ulimit -v)"
  grep -q "device_train_microbatch_size [0-9]* fits" "$tmp/as.log" || bad "ulimit -v: no micro-batch that fits named"
  (ulimit -v 3000000; timeout 120 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/as_ok" > "$tmp/as_ok.log" 2>&1) ||
    { tail -3 "$tmp/as_ok.log"; bad "ulimit -v 3 GB: the run failed"; }
fi

# A memory cgroup of 400 MB (v1 or v2; root with a writable cgroup tree only)
own=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}:\(.*\)/\3/p' /proc/self/cgroup | head -1)
if [ -n "$own" ] && mkdir "/sys/fs/cgroup/memory${own%/}/spes_limit_$$" 2>/dev/null; then
  cg="/sys/fs/cgroup/memory${own%/}/spes_limit_$$" limit_file=memory.limit_in_bytes
elif own=$(sed -n 's/^0::\(.*\)/\1/p' /proc/self/cgroup) && [ -n "$own" ] && mkdir "/sys/fs/cgroup${own%/}/spes_limit_$$" 2>/dev/null; then
  cg="/sys/fs/cgroup${own%/}/spes_limit_$$" limit_file=memory.max
fi
if [ -n "$cg" ] && echo 400000000 > "$cg/$limit_file" 2>/dev/null; then
  ran=1
  (echo "$BASHPID" > "$cg/cgroup.procs" && timeout 120 "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/cg" > "$tmp/cg.log" 2>&1)
  [ $? = 1 ] || bad "a 400 MB cgroup: exit status not 1"
  refused cg "the cgroup's memory limit"
else
  echo "(no memory cgroup could be made here: the cgroup case not run)"
fi

[ "$ran" = 1 ] || { echo "SKIPPED: neither ulimit -v (ASan) nor a memory cgroup available"; exit 77; }
[ "$fail" = 0 ] || exit 1
echo "train_host_memory_limit: OK"
