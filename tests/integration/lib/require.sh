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
require_venv() {
  SPES_VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
  if [ ! -x "$SPES_VENV_PY" ] || ! "$SPES_VENV_PY" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then
    echo "SKIPPED: no test virtualenv with $* at $SPES_VENV_PY (run tests/setup_venv.sh)"
    exit 77
  fi
}
