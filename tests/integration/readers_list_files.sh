#!/usr/bin/env bash
# `spes list-files DIR OUT`: only *.npy token files, recursively, sorted absolute paths,
# written atomically; --dtype validates every file; clear errors for a missing directory,
# a directory without token files, and a corrupt token file.
set -u
BIN=${SPES_BIN:?SPES_BIN not set}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not built"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$tmp/data/b_sub/deeper" "$tmp/data/a_sub" "$tmp/empty/sub"
printf '\x01\x00\x02\x00' > "$tmp/data/tok_000_000001.npy"                 # 2 uint16 tokens
printf '\x01\x00\x02\x00\x03\x00\x04\x00' > "$tmp/data/b_sub/deeper/z.npy"  # 4 uint16 tokens
printf '\x05\x00' > "$tmp/data/a_sub/y.npy"                                 # 1 uint16 token
echo "log" > "$tmp/data/tokenize.log"
echo "x" > "$tmp/data/a_sub/notes.npy.txt"
touch "$tmp/empty/sub/readme.md"
ln -s "$tmp/data/a_sub" "$tmp/data/link_to_dir"   # symlinked directories are not followed

cd "$tmp"
"$BIN" list-files data out/../file_list.txt 2>err.txt && fail "OUT in a missing directory should fail"
"$BIN" list-files data file_list.txt 2>err.txt || fail "list-files failed: $(cat err.txt)"
expected=$(printf '%s\n' "$tmp/data/a_sub/y.npy" "$tmp/data/b_sub/deeper/z.npy" "$tmp/data/tok_000_000001.npy")
[ "$(cat file_list.txt)" = "$expected" ] || fail "manifest differs:
$(cat file_list.txt)
expected:
$expected"
ls "$tmp" | grep -q 'file_list.txt.tmp' && fail "temp file left behind"

"$BIN" list-files data file_list2.txt --dtype uint16 2>err.txt || fail "--dtype uint16 failed: $(cat err.txt)"
grep -q "3 token files, 7 tokens" err.txt || fail "summary missing: $(cat err.txt)"
"$BIN" list-files data file_list3.txt --dtype uint32 2>err.txt && fail "odd-sized uint32 file accepted"
grep -q "y.npy" err.txt || fail "error does not name the bad file: $(cat err.txt)"
[ -e file_list3.txt ] && fail "manifest written despite the error"

"$BIN" list-files missing_dir out.txt 2>err.txt && fail "missing dir accepted"
grep -q "missing_dir is not a directory" err.txt || fail "unclear error: $(cat err.txt)"
"$BIN" list-files empty out.txt 2>err.txt && fail "dir without token files accepted"
grep -q "no token files" err.txt || fail "unclear error: $(cat err.txt)"
"$BIN" list-files data 2>/dev/null && fail "missing OUT accepted"
"$BIN" list-files --help | grep -q "usage: spes list-files" || fail "--help"
echo "list-files ok"
