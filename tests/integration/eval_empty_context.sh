#!/usr/bin/env bash
# `spes eval` requests with an empty context vs lm-evaluation-harness (HF backend): the context
# becomes the tokenizer's BOS, else its EOS (lm_eval's prefix token), not config.json's
# eos_token_id; a tokenizer naming neither is refused; a context of whitespace alone is refused,
# as lm_eval fails on it; trailing whitespace beyond ASCII's moves to the continuation as
# Python's rstrip() moves it. See tests/ref/lm_eval_empty_context.py.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
. tests/integration/lib/require.sh
require_venv torch transformers lm_eval accelerate   # lm_eval's HF backend needs accelerate
if [ ! -f "$SPES_TEST_DATA/tokenizers/gpt-neox-olmo.json" ]; then
  echo "SKIPPED: the gpt-neox-olmo tokenizer not found under $SPES_TEST_DATA"
  exit 77
fi
require_spes
run_ref_check lm_eval_empty_context.py "$SPES_TEST_DATA/tokenizers/gpt-neox-olmo.json"
