#!/usr/bin/env bash
# Token ids of `spes tokenize --dump_ids` identical to Hugging Face tokenizers (PyPI) for the
# shipped dolma2 / gpt-neox-olmo tokenizers, a Qwen2-style one and a Split-behaviours one, over
# Tiny Shakespeare and generated Unicode stress text; decode agrees; invalid UTF-8 is refused.
set -u
cd "$(dirname "$0")/../.."
DATA=${SPES_TEST_DATA:-../shared/data}
PY=${SPES_VENV_PY:-.venv/bin/python}
SPES=${SPES_BIN:-build/spes}
[ -x "$PY" ] || { echo "SKIPPED: no test virtualenv ($PY); run tests/setup_venv.sh"; exit 77; }
"$PY" -c "import tokenizers" 2>/dev/null || { echo "SKIPPED: tokenizers not installed in $PY"; exit 77; }
[ -f "$DATA/tinyshakespeare.txt" ] && [ -f "$DATA/tokenizers/dolma2.json" ] || { echo "SKIPPED: test data not found in $DATA"; exit 77; }
[ -x "$SPES" ] || { echo "FAILED: $SPES not built"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" tests/ref/tokenizer_parity.py "$SPES" "$DATA" "$work"
