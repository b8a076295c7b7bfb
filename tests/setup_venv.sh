#!/usr/bin/env bash
# Test-only Python references in a git-ignored virtualenv (.venv): Hugging Face transformers
# and tokenizers, torch, pyarrow, safetensors, lm_eval, tensorboard (its event file reader), and
# OLMo's own package (ai2-olmo, for its data utilities; installed without its dependencies, which
# pin other versions of torch: the tests load single files of it that need only numpy and torch).
# Versions are pinned so they install together. Idempotent: does nothing when the pinned set
# is already there. When PyPI cannot be reached the tests that need these report themselves
# skipped.
set -u
cd "$(dirname "$0")/.."
VENV=.venv
PINS="torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 pyarrow==26.0.1 numpy==2.4.6 safetensors==0.8.0 lm_eval==0.4.13 accelerate==1.15.0 tensorboard==2.21.0"
NODEPS="ai2-olmo==0.6.0"
STAMP="$VENV/.pins"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS $NODEPS" ]; then
  exit 0
fi
echo "setup_venv: installing $PINS $NODEPS into $VENV (first run only)"
python3 -m venv "$VENV" || { echo "setup_venv: cannot create $VENV; Python reference tests will skip"; exit 0; }
if "$VENV/bin/pip" install -q --disable-pip-version-check $PINS &&
   "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps $NODEPS; then
  echo "$PINS $NODEPS" > "$STAMP"
  echo "setup_venv: done"
else
  echo "setup_venv: pip install failed; Python reference tests will skip"
fi
exit 0
