#!/usr/bin/env bash
# `spes tokenize` with a --file_glob that matches things that are not input files: a
# directory, a broken symlink, a FIFO. Each is refused before any worker starts, with a
# message naming the path and exit code 1 (it used to segfault formatting the path after
# globfree, and a FIFO would have blocked a worker forever).
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '{"text": "hello"}\n' >"$dir/a.jsonl"
fail=0

# expect_refusal <label> <glob> <message fragment>
expect_refusal() {
  local out rc
  out=$(timeout 20 "$SPES_BIN" tokenize --file_glob "$2" --tokenizer_name_or_path bytes \
    --output_prefix "$dir/out/t_" --dtype uint16 2>&1)
  rc=$?
  if [ $rc -ne 1 ] || ! grep -qF -- "$3" <<<"$out"; then
    echo "FAIL $1: exit $rc (want 1), output:"; echo "$out" | tail -5; fail=1
  else
    echo "ok   $1: $(tail -1 <<<"$out")"
  fi
}

mkdir "$dir/sub.jsonl"
expect_refusal "directory" "$dir/*.jsonl" "$dir/sub.jsonl is a directory"
rmdir "$dir/sub.jsonl"
ln -s "$dir/missing.jsonl" "$dir/broken.jsonl"
expect_refusal "broken symlink" "$dir/*.jsonl" "$dir/broken.jsonl is a broken symbolic link"
rm "$dir/broken.jsonl"
mkfifo "$dir/pipe.jsonl"
expect_refusal "fifo" "$dir/*.jsonl" "$dir/pipe.jsonl is not a regular file"
rm "$dir/pipe.jsonl"

# The good file alone still tokenizes.
if "$SPES_BIN" tokenize --file_glob "$dir/*.jsonl" --tokenizer_name_or_path bytes --output_prefix "$dir/out/t_" \
    --dtype uint16 2>/dev/null && [ "$(cat "$dir"/out/t_000_*.npy | wc -c)" -eq 12 ]; then
  echo "ok   regular file tokenized"
else
  echo "FAIL regular file"; fail=1
fi
exit $fail
