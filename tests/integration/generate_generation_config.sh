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
SPES_NUM_THREADS=${SPES_NUM_THREADS:-2} run_ref_check generate_defaults_check.py
