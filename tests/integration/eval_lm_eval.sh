#!/usr/bin/env bash
# `spes eval` multiple-choice scoring vs lm-evaluation-harness (HF backend) on the same
# exported model and the same ARC-Easy/PIQA questions: per-choice log-likelihoods, acc and
# acc_norm (= our acc_per_char). See tests/ref/lm_eval_check.py.
# Exit 0 = pass, 77 = skipped (reason on the last line), other = failure.
set -u
cd "$(dirname "$0")/../.."
SPES_BIN=${SPES_BIN:-$PWD/build/spes}
SPES_VENV_PY=${SPES_VENV_PY:-$PWD/.venv/bin/python}
SPES_TEST_DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
if [ ! -x "$SPES_VENV_PY" ] || ! "$SPES_VENV_PY" -c 'import torch, transformers, lm_eval' 2>/dev/null; then
  echo "SKIPPED: no test virtualenv with torch+transformers+lm_eval at $SPES_VENV_PY (run tests/setup_venv.sh)"
  exit 77
fi
if ! "$SPES_VENV_PY" -c 'import accelerate' 2>/dev/null; then
  echo "SKIPPED: lm_eval's HF backend needs the 'accelerate' package, missing from $SPES_VENV_PY"
  exit 77
fi
if [ ! -f "$SPES_TEST_DATA/eval/arc_easy_rc_0shot/requests.jsonl.gz" ] || [ ! -f "$SPES_TEST_DATA/tokenizers/gpt-neox-olmo.json" ]; then
  echo "SKIPPED: test data (eval request files, gpt-neox-olmo tokenizer) not found under $SPES_TEST_DATA"
  exit 77
fi
if [ ! -x "$SPES_BIN" ]; then
  echo "SKIPPED: spes binary not found at $SPES_BIN (build first)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_DATASETS_CACHE="$work/hf_datasets" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
  "$SPES_VENV_PY" tests/ref/lm_eval_check.py "$SPES_BIN" "$work" "$SPES_TEST_DATA/eval" "$SPES_TEST_DATA/tokenizers/gpt-neox-olmo.json"
