#!/usr/bin/env bash
# `spes tokenize` holds a bounded amount of memory per document (issue 29 item 15): a 17 KB
# .jsonl.zst whose line 2 is one 200 MB document used to take ~1 GB (the whole line, its text,
# the cleaned copy, the ids). Now a record longer than --max_doc_bytes (32 MiB by default) is
# read past without being held, reported as "FILE:LINE: skipped: ..." and counted; the other
# documents are tokenized. Also: a .json entry and a .txt file over a small --max_doc_bytes are
# skipped the same way, and a limit beyond 256 MiB is refused.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
command -v zstd >/dev/null || { echo "SKIPPED: no zstd"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $1"; [ -f "${2:-}" ] && tail -5 "$2"; exit 1; }

python3 - "$dir/big.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write('{"text": "first small document"}\n')
    f.write('{"text": "' + "hello world " * (200 * 1000 * 1000 // 12) + '"}\n')
    f.write('{"text": "last one"}\n')
PY
zstd -q -19 --rm "$dir/big.jsonl" -o "$dir/big.jsonl.zst"
echo "input: $(stat -c %s "$dir/big.jsonl.zst") bytes compressed"

# run_peak LOG ARGS...: runs spes tokenize ARGS; prints "EXIT PEAK_RSS_MB".
run_peak() {
  local log=$1
  shift
  python3 - "$log" "$SPES_BIN" tokenize "$@" <<'PY'
import resource, subprocess, sys
with open(sys.argv[1], "w") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
}

read -r rc peak < <(run_peak "$dir/big.log" --file_glob "$dir/big.jsonl.zst" --tokenizer_name_or_path bytes \
  --output_prefix "$dir/out/big_")
echo "200 MB document: exit $rc, peak RSS $peak MB"
[ "$rc" = 0 ] || fail "exit $rc" "$dir/big.log"
grep -q "big.jsonl.zst:2: skipped: the line is 200000004 bytes, longer than the limit of 33554432 bytes per document (--max_doc_bytes)" \
  "$dir/big.log" || fail "no skip message naming file:line" "$dir/big.log"
grep -q "2 documents (0 empty dropped, 1 malformed skipped)" "$dir/big.log" || fail "counts" "$dir/big.log"
[ "$peak" -lt 150 ] || fail "peak RSS $peak MB (the limit per document is 32 MiB)" "$dir/big.log"
# "first small document" + EOS and "last one" + EOS, uint32 ids.
[ "$(cat "$dir"/out/big_000_*.npy | wc -c)" -eq $(( (20 + 1 + 8 + 1) * 4 )) ] || fail "tokens written"

# A lower limit applies to .json entries and .txt files too; a limit above 256 MiB is refused.
printf '[{"text": "short"}, {"text": "%s"}]\n' "$(head -c 300 /dev/zero | tr '\0' x)" >"$dir/a.json"
head -c 500 /dev/zero | tr '\0' y >"$dir/b.txt"
"$SPES_BIN" tokenize --file_glob "$dir/[ab].*" --tokenizer_name_or_path bytes --output_prefix "$dir/out/small_" \
  --max_doc_bytes 200 >"$dir/small.log" 2>&1 || fail "small limit: exit" "$dir/small.log"
grep -q "a.json:1: skipped: entry 1 is 312 bytes, longer than the limit of 200 bytes" "$dir/small.log" || fail "json entry" "$dir/small.log"
grep -q "b.txt: skipped: the file (one document) is 500 bytes, longer than the limit of 200 bytes" "$dir/small.log" ||
  fail "txt file" "$dir/small.log"
if "$SPES_BIN" tokenize --file_glob "$dir/b.txt" --tokenizer_name_or_path bytes --output_prefix "$dir/out/x_" \
     --max_doc_bytes 300000000 >"$dir/over.log" 2>&1; then
  fail "--max_doc_bytes 300000000 accepted"
fi
grep -q "max_doc_bytes must be between 1 and 268435456" "$dir/over.log" || fail "limit message" "$dir/over.log"
echo "tokenize_huge_document: OK"
