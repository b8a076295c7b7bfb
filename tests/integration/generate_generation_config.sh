#!/usr/bin/env bash
# `spes generate` takes the sampling settings it is not given (do_sample, temperature, top_k,
# top_p, max_new_tokens / max_length) from the model directory's generation_config.json, as
# transformers' generate does: greedy outputs equal transformers' token for token
# (tests/ref/generate_defaults_check.py).
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv torch transformers safetensors
require_spes
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} SPES_NUM_THREADS=${SPES_NUM_THREADS:-2} \
  "$SPES_VENV_PY" tests/ref/generate_defaults_check.py "$SPES_BIN" "$work"
