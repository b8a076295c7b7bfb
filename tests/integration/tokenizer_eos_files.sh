#!/usr/bin/env bash
# The tokenizer's EOS against transformers' AutoTokenizer (tests/ref/tokenizer_eos_files.py):
# tokenizer_config.json and special_tokens_map.json in agreement, disagreement, missing or broken.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_venv transformers tokenizers numpy
require_spes
tokenizer=${SPES_TEST_DATA:-../shared/data}/tokenizers/gpt-neox-olmo.json
if [ ! -f "$tokenizer" ]; then
  echo "SKIPPED: $tokenizer not found (SPES_TEST_DATA)"
  exit 77
fi
run_ref_check tokenizer_eos_files.py "$tokenizer"
