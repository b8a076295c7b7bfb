#!/usr/bin/env bash
# An upcycled model's special token ids (bos, an eos list, no pad) through `spes train`
# checkpoints (load_path, resume without it) and `spes export`, where the YAML sets none, sets one
# among them, or contradicts them (tests/ref/upcycle_train_token_ids_check.py).
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv torch transformers safetensors
require_spes
SPES_NUM_THREADS=${SPES_NUM_THREADS:-2} run_ref_check upcycle_train_token_ids_check.py
