#!/usr/bin/env bash
# `spes export` / import against Hugging Face transformers (tests/ref/export_import_check.py):
# exports of both formats (fp32, sharded, bf16) load with AutoModelForCausalLM and give the
# source logits; our logits and eval loss match transformers'; directories written by
# transformers (sharded, bf16) import; missing / mis-shaped tensors are named.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
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
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$SPES_VENV_PY" tests/ref/export_import_check.py "$SPES_BIN" "$work"
