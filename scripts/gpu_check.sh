#!/usr/bin/env bash
# Everything a lent GPU machine should check, in one call and within a time budget. Unpacks the
# bundle scripts/gpu_bundle.sh made (carried in .gpu-bundle/), then runs these stages in order:
#   facts     the GPU, driver, CUDA, NCCL and PyTorch there; spes version; no library missing
#   unit      the GPU test programs: each CUDA op against the cpu op, NCCL with one rank,
#             ZeRO-2/3 on one rank (tests/gpu/test_*.c)
#   e2e       the end-to-end GPU scripts (tests/gpu/*.sh): a training step against the cpu,
#             resume, fp16 loss scaling, SPES with 2 peers on the GPU, Shakespeare, and the
#             2-rank test with the machine's NCCL (which skips it below 2.30)
#   ranks     with the bundle's own NCCL (built with NCCL_SRC; >= 2.30 lets two ranks share the
#             GPU): the NCCL and ZeRO tests again and dist_ranks_gpu.sh (DDP, ZeRO-2, ZeRO-3 on
#             2 ranks against 1 rank)
#   bench     make bench-gpu's runner: ours against PyTorch eager and torch.compile on the
#             reference's 1B config (BENCH_GPU_TORCH_MODES=off leaves the compiled one out:
#             compiling the 1B model takes minutes of a short lease; BENCH_GPU_VARIANT="NAME=VALUE[; ...]"
#             times ours once more with a switch set, e.g. SPES_CUDA_EXPERT_STREAMS=4)
#   memcheck  the GPU test programs again under compute-sanitizer memcheck
#   profile   one all-trainable step of the bench's 1B model under Nsight Compute (ncu, which
#             reads a Firecracker machine's counters, not a gVisor one's: KINDS.md): every
#             kernel's device time, run one at a time, grouped by bench/gpu_kernel_table.py
#             (profile.log; the raw CSV in the logs as profile/ncu.csv). Not in the default list:
#             ncu serialises and replays ~2,000 kernels (minutes); name it.
# From the repository root:  bash scripts/gpu_check.sh [STAGE...]   (default: all, in this order)
# The device tool's call: command "bash scripts/gpu_check.sh", carry [".gpu-bundle"].
#   SPES_GPU_CHECK_BUDGET  seconds for the whole call (default 420, inside the device call's
#                          600 and the lease's 15 minutes with the machine's start): no test
#                          starts after it, one still running then is killed (skipped)
#   SPES_GPU_BUNDLE        the bundle's folder (default .gpu-bundle)
# Logs: the device tool brings back at most 8 files from $OUT, so after every stage the logs
# (one folder per stage) are packed into $OUT/gpu-check-logs.tar.gz and the table so far into
# $OUT/gpu-check-summary.txt (without $OUT: /tmp). A call killed at its limit keeps what the
# finished stages packed. The output ends with the table: stage, seconds, exit status, result.
set -u
cd "$(dirname "$0")/.." || exit 1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(facts unit e2e ranks bench memcheck)
for stage in "${stages[@]}"; do
  case $stage in facts | unit | e2e | ranks | bench | memcheck | profile) ;; *) echo "gpu_check: no stage '$stage'"; exit 2 ;; esac
done
start=$(date +%s)
export SPES_TEST_DEADLINE=$((start + ${SPES_GPU_CHECK_BUDGET:-420}))
out=${OUT:-/tmp}
logs=/tmp/gpu-check-logs
rm -rf "$logs" && mkdir -p "$logs"
bundle=/tmp/spes-bundle
rm -rf "$bundle" && mkdir -p "$bundle"
tar -xJf "${SPES_GPU_BUNDLE:-.gpu-bundle}/bundle.tar.xz" -C "$bundle" ||
  { echo "gpu_check: cannot unpack ${SPES_GPU_BUNDLE:-.gpu-bundle}/bundle.tar.xz (scripts/gpu_bundle.sh makes it)"; exit 1; }
source "$bundle/env.sh"
# The machine's python3 holds PyTorch and transformers: the references of the tests and bench.
[ -x "${SPES_VENV_PY:-}" ] || SPES_VENV_PY=$(command -v python3)
export SPES_VENV_PY
# cuDNN (attention's fused kernels; src/ops/cuda/cudnn_loader.cu dlopens libcudnn.so.9): the GPU
# machines have it only in PyTorch's nvidia-cudnn wheel, which C cannot ask Python for: here.
if [ -z "${SPES_CUDNN_LIB:-}" ]; then
  cudnn_dir=$("$SPES_VENV_PY" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
  if [ -n "$cudnn_dir" ] && [ -e "$cudnn_dir/libcudnn.so.9" ]; then export SPES_CUDNN_LIB=$cudnn_dir; fi
fi
# OpenMPI's shared-memory transport keeps its segments in /dev/shm; a microVM may lack it.
[ -w /dev/shm ] || export OMPI_MCA_btl_vader_backing_directory=/tmp

stage_facts() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -2
  "$SPES_VENV_PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  "$SPES_BIN" version
  echo "cuDNN for attention: SPES_CUDNN_LIB=${SPES_CUDNN_LIB:-(unset: the loader searches itself)}" \
    "$(ls "${SPES_CUDNN_LIB:-/nonexistent}"/libcudnn.so.9.* 2>/dev/null | head -1)," \
    "torch's cuDNN $("$SPES_VENV_PY" -c 'import torch; print(torch.backends.cudnn.version())' 2>/dev/null || echo '?')"
  if [ -f "$SPES_BUNDLE/nccl/libnccl.so.2" ]; then
    echo "bundle's NCCL: $(LD_LIBRARY_PATH="$SPES_BUNDLE/nccl:$LD_LIBRARY_PATH" "$SPES_BIN" version | sed -n 's/^nccl: //p')"
  fi
  mpirun --version | head -1
  # A GPU the driver shows but the CUDA runtime cannot open would make every later test skip
  # (and pass): fail here instead.
  local gpus
  gpus=$("$SPES_BUILD/tests-gpu/gpu_count" 2>&1)
  echo "GPUs visible to spes: $gpus"
  if [ "$gpus" = 0 ] && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "facts: nvidia-smi lists a GPU that the CUDA runtime does not open; every test would skip"
    return 1
  fi
  local missing
  missing=$(ldd "$SPES_BIN" "$SPES_BUILD"/tests-gpu/* "$SPES_BUILD"/bench/* | grep "not found" | sort -u)
  [ -z "$missing" ] || { echo "missing libraries:"; echo "$missing"; return 1; }
  echo "facts: every library resolves"
}
gpu_tests() {   # gpu_tests REGEX [MEMCHECK]: tests/run_gpu.sh on the tests whose names match
  SPES_TEST_ONLY=$1 SPES_GPU_MEMCHECK=${2:-0} SPES_TEST_LOG_DIR="$logs/$stage" bash tests/run_gpu.sh "$SPES_BUILD"
}
stage_unit() { gpu_tests '^test_'; }
stage_e2e() { gpu_tests "^($(cd tests/gpu && ls ./*.sh | sed 's|^\./||; s|\.sh$||' | paste -sd'|'))\$"; }
stage_ranks() {
  if [ ! -f "$SPES_BUNDLE/nccl/libnccl.so.2" ]; then
    echo "0 passed, 0 failed, 1 skipped (the bundle has no NCCL of its own: build it with NCCL_SRC)"
    return 0
  fi
  LD_LIBRARY_PATH="$SPES_BUNDLE/nccl:$LD_LIBRARY_PATH" NCCL_DEBUG=${NCCL_DEBUG:-WARN} \
    gpu_tests '^(test_dist_nccl|test_sharded_params_gpu|dist_ranks_gpu)$'
}
stage_bench() {
  local left=$((SPES_TEST_DEADLINE - $(date +%s))) rc=0
  [ "$left" -gt 0 ] || { echo "bench-gpu: skipped (out of time)"; return 0; }
  timeout -k 5 "$left" bash bench/run_gpu.sh "$SPES_BUILD" || rc=$?
  case $rc in
    0) ;;
    124 | 137) echo "bench-gpu: skipped (killed at the deadline: out of time)" ;;
    *) echo "bench-gpu: failed (status $rc)"; return 1 ;;
  esac
}
stage_memcheck() { gpu_tests '^memcheck ' 1; }
stage_profile() {
  local left=$((SPES_TEST_DEADLINE - $(date +%s))) rc=0 ncu
  [ "$left" -gt 30 ] || { echo "profile: skipped (out of time)"; return 0; }
  ncu=$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1 || true)
  [ -n "$ncu" ] || { echo "profile: skipped (no ncu here)"; return 0; }
  # The clocks and caches as a real step finds them (METHOD.md: leave the clocks alone); the
  # bench's one profiled step between cudaProfilerStart and Stop; base units (nanoseconds).
  # shellcheck disable=SC2086  # BENCH_GPU_ARGS is a list of flags
  timeout -k 5 "$left" "$ncu" --clock-control none --cache-control none --profile-from-start off \
    --metrics gpu__time_duration.sum --csv --print-units base --log-file "$logs/profile/ncu.csv" \
    "$SPES_BUILD/bench/gpu_train_step" --profile-step --warmup 1 --steps 1 ${BENCH_GPU_ARGS:-} \
    >"$logs/profile/bench.log" 2>&1 || rc=$?
  grep -E "^(profile-step|all-trainable): " "$logs/profile/bench.log" | head -3
  case $rc in
    0) ;;
    124 | 137) echo "profile: skipped (killed at the deadline: out of time)"; return 0 ;;
    *)
      tail -n 5 "$logs/profile/bench.log" "$logs/profile/ncu.csv"
      # The bench ran its step but ncu could not profile it (no counters on a gVisor machine):
      # a tool missing here, not a failure of ours.
      if grep -q "^profile-step: " "$logs/profile/bench.log"; then
        echo "profile: skipped (ncu status $rc: $(grep -m1 "==ERROR==" "$logs/profile/ncu.csv" || echo 'see profile/ncu.csv'))"
        return 0
      fi
      echo "profile: failed (ncu status $rc)"; return 1 ;;
  esac
  python3 bench/gpu_kernel_table.py --top 40 "$logs/profile/ncu.csv" || { echo "profile: failed (no table)"; return 1; }
  echo "profile: one step's kernels above"
}

table=()
status=0
for stage in "${stages[@]}"; do
  echo "==== $stage"
  t0=$(date +%s)
  mkdir -p "$logs/$stage"
  "stage_$stage" 2>&1 | tee "$logs/$stage.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  table+=("$(printf '%-9s %4ss  rc=%s  %s' "$stage" $(($(date +%s) - t0)) "$rc" "$(tail -1 "$logs/$stage.log")")")
  printf '%s\n' "${table[@]}" >"$out/gpu-check-summary.txt"
  tar -C "$logs" -czf "$out/gpu-check-logs.tar.gz" .
done
echo "==== gpu_check: $(($(date +%s) - start))s; logs in $out/gpu-check-logs.tar.gz"
printf '%s\n' "${table[@]}"
exit $status
