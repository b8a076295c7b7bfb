# Shared preconditions of integration scripts (sourced). Each prints the reason and exits 77
# (skipped) when something the test needs is missing.

# require_spes: $SPES_BIN (default build/spes) must be an executable.
require_spes() {
  SPES_BIN=${SPES_BIN:-$PWD/build/spes}
  if [ ! -x "$SPES_BIN" ]; then
    echo "SKIPPED: spes binary not found at $SPES_BIN (build first)"
    exit 77
  fi
}

# require_venv MODULE...: the test virtualenv's python ($SPES_VENV_PY) imports every module.
# A bare name (SPES_VENV_PY=python3, the GPU machines' python with torch) is looked up on PATH.
require_venv() {
  SPES_VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
  SPES_VENV_PY=$(command -v "$SPES_VENV_PY" || echo "$SPES_VENV_PY")
  if [ ! -x "$SPES_VENV_PY" ] || ! "$SPES_VENV_PY" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then
    echo "SKIPPED: no test virtualenv with $* at $SPES_VENV_PY (run tests/setup_venv.sh)"
    exit 77
  fi
}

# require_mpirun: OpenMPI's mpirun (scripts/install-deps.sh installs it). Under ASan the
# ranks run without leak detection: OpenMPI's components are dlopen'ed and unloaded before
# LeakSanitizer reports at exit, so their leaks show as "<unknown module>" frames that no
# suppression can name. Address and UB checks stay on; our own code's leaks are checked by
# every single-rank test.
require_mpirun() {
  if ! command -v mpirun >/dev/null; then
    echo "SKIPPED: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"
    exit 77
  fi
  if [ -n "${SPES_ASAN:-}" ]; then export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"; fi
}

# run_ref_check SCRIPT [ARGS...]: runs tests/ref/SCRIPT $SPES_BIN WORK [ARGS...] with the
# virtualenv's python (require_venv and require_spes first), WORK a temporary directory removed
# at exit; offline (no hub, no datasets download; the datasets cache in WORK) and one OpenMP
# thread unless OMP_NUM_THREADS is set. Its status is the caller's last command's.
run_ref_check() {
  local script=$1
  shift
  REF_WORK=$(mktemp -d)
  trap 'rm -rf "$REF_WORK"' EXIT
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_DATASETS_CACHE="$REF_WORK/hf_datasets" \
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$SPES_VENV_PY" "tests/ref/$script" "$SPES_BIN" "$REF_WORK" "$@"
}
