#!/usr/bin/env bash
# configs/tiny_shakespeare.yaml works as committed, following the recipe in its header:
# spes tokenize (bytes) -> spes list-files (manifest) -> spes train with overrides, run from a
# scratch directory so the config's relative paths (data/..., output/${run_name}) land there.
# Checks the manifest is read, the override shortens the run, ${run_name} names the folder.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
SPES_BIN=${SPES_BIN:-$repo/build/spes}
DATA=${SPES_TEST_DATA:-$repo/../shared/data}
if [ ! -f "$DATA/tinyshakespeare.txt" ]; then
  echo "SKIPPED: $DATA/tinyshakespeare.txt not found (set SPES_TEST_DATA)"
  exit 77
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir -p data/tinyshakespeare
"$SPES_BIN" tokenize --file_glob "$DATA/tinyshakespeare.txt" --tokenizer_name_or_path bytes \
  --output_prefix data/tinyshakespeare/ts_ --dtype uint16
"$SPES_BIN" list-files data/tinyshakespeare data/tinyshakespeare/file_list.txt
test -s data/tinyshakespeare/file_list.txt

"$SPES_BIN" train "$repo/configs/tiny_shakespeare.yaml" --max_duration=4 --scheduler.t_warmup=1 --save_interval_unsharded=2 \
  --console_log_interval=1 --threads=2 2>&1 | tee train.log
test -d output/tiny-shakespeare/step4 || { echo "FAIL: no output/tiny-shakespeare/step4"; ls -R output; exit 1; }
test -s output/tiny-shakespeare/metrics.jsonl

# a bad override is refused before any work, naming the key
if "$SPES_BIN" train "$repo/configs/tiny_shakespeare.yaml" --model.d_model=abc >bad.log 2>&1; then
  echo "FAIL: --model.d_model=abc was accepted"; exit 1
fi
grep -q "model.d_model: expected an integer, got 'abc'" bad.log || { cat bad.log; exit 1; }
echo "tiny_shakespeare config: tokenize -> manifest -> 4 steps OK"
