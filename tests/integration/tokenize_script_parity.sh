#!/usr/bin/env bash
# `spes tokenize` end to end (every input format, 2 processes, small shards, uint16) against
# SPES's tokenize_data.py logic with transformers' AutoTokenizer: identical token streams.
set -u
cd "$(dirname "$0")/../.."
DATA=${SPES_TEST_DATA:-../shared/data}
PY=${SPES_VENV_PY:-.venv/bin/python}
SPES=${SPES_BIN:-build/spes}
[ -x "$PY" ] || { echo "SKIPPED: no test virtualenv ($PY); run tests/setup_venv.sh"; exit 77; }
"$PY" -c "import transformers, pyarrow, numpy" 2>/dev/null || { echo "SKIPPED: transformers/pyarrow/numpy missing in $PY"; exit 77; }
[ -f "$DATA/tokenizers/gpt-neox-olmo.json" ] || { echo "SKIPPED: test data not found in $DATA"; exit 77; }
[ -x "$SPES" ] || { echo "FAILED: $SPES not built"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" tests/ref/tokenizer_script_ref.py "$SPES" "$DATA" "$work"
