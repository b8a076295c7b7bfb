#!/usr/bin/env bash
# `spes eval` multiple-choice scoring vs lm-evaluation-harness (HF backend) on the same
# exported model and the same ARC-Easy/PIQA questions: per-choice log-likelihoods, acc and
# acc_norm (= our acc_per_char). See tests/ref/lm_eval_check.py.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
. tests/integration/lib/require.sh
require_venv torch transformers lm_eval accelerate   # lm_eval's HF backend needs accelerate
if [ ! -f "$SPES_TEST_DATA/eval/arc_easy_rc_0shot/requests.jsonl.gz" ] || [ ! -f "$SPES_TEST_DATA/tokenizers/gpt-neox-olmo.json" ]; then
  echo "SKIPPED: test data (eval request files, gpt-neox-olmo tokenizer) not found under $SPES_TEST_DATA"
  exit 77
fi
require_spes
run_ref_check lm_eval_check.py "$SPES_TEST_DATA/eval" "$SPES_TEST_DATA/tokenizers/gpt-neox-olmo.json"
