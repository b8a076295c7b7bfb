#!/usr/bin/env bash
# `spes debug-step` against Hugging Face transformers' OlmoeForCausalLM / Qwen3MoeForCausalLM:
# logits, each loss term and every parameter gradient within 1e-5 relative (per tensor, to
# its largest reference entry) on tiny random models; see tests/ref/model_vs_hf.py.
# Exit 0 = match, 77 = skipped (reason on the last line), other = mismatch or error.
set -u
cd "$(dirname "$0")/../.."
SPES_BIN=${SPES_BIN:-$PWD/build/spes}
SPES_VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}

if [ ! -x "$SPES_VENV_PY" ] || ! "$SPES_VENV_PY" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  echo "SKIPPED: no test virtualenv with torch+transformers at $SPES_VENV_PY (run tests/setup_venv.sh)"
  exit 77
fi
if [ ! -x "$SPES_BIN" ]; then
  echo "SKIPPED: spes binary not found at $SPES_BIN (build first)"
  exit 77
fi
if ! "$SPES_BIN" debug-step --help >/dev/null 2>&1; then
  echo "SKIPPED: $SPES_BIN has no working 'debug-step' command"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Our binary and the reference each get the two cores in turn, never both at once. The models
# are tiny, so idle OpenMP threads sleep instead of spinning (on a busy machine spinning
# made this test 2-3x slower).
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$SPES_VENV_PY" tests/ref/model_vs_hf.py "$SPES_BIN" "$work"
