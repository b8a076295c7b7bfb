#!/usr/bin/env bash
# A dense model's generation_config.json (an eos_token_id list beyond config.json's, sampling
# settings) kept unchanged through `spes upcycle`, `spes train` checkpoints (load_path, resume)
# and `spes export`; `spes generate` and transformers' generate stop at its ids
# (tests/ref/generation_config_check.py).
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv torch transformers safetensors
require_spes
SPES_NUM_THREADS=${SPES_NUM_THREADS:-2} run_ref_check generation_config_check.py
