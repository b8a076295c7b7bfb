#!/usr/bin/env bash
# Special token ids through `spes upcycle` and `spes export` (tests/ref/special_tokens_check.py):
# absent ids stay absent (null, as transformers writes None), an eos_token_id list and
# bos_token_id are carried into config.json and generation_config.json, and greedy generation
# stops at every id of the list, in transformers and in `spes generate`.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv torch transformers safetensors
require_spes
run_ref_check special_tokens_check.py
