#!/usr/bin/env bash
# The offline tools' outputs on a full disk (small tmpfs mounts; root only: skipped without).
# For each tool the output disk fills mid-write; then: the exit status is non-zero, the message
# names the path and "No space left on device", nothing is left under a final name that a later
# step would take as whole, no temp file remains, and a rerun once space is freed succeeds with
# output byte-identical to an undisturbed run's.
#   tokenize    shards of two worker processes (--processes 2), several per worker (and a run
#               stopped by SIGTERM removes its shards too): a failed
#               run removes every shard it committed (a rerun was refused for "shards of an
#               earlier run", and the partial set looked like a dataset); with stdout and
#               stderr a closed pipe (`| head -1`) the run completes whole.
#   list-files  the manifest.
#   export      a folder of weights, config.json, generation_config.json and tokenizer.json:
#               a failure at any file leaves --out as it was (a fresh --out: no folder at all),
#               not a folder of weights and config that loads but lacks its tokenizer.
#   eval        --output and --output_requests.
#   generate    stdout redirected to a full disk: an error, not a silent exit 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
. tests/integration/lib/tmpfs_disk.sh
cleanup() { tmpfs_unmount_all; rm -rf "$tmp"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
export SPES_NUM_THREADS=1

# disk NAME: a 4 MB tmpfs at $tmp/NAME (root only: skipped without it).
disk() { tmpfs_disk "$1" 4m; }
# leave NAME BYTES: a filler file takes all but about BYTES of the disk's free space.
leave() {
  python3 - "$tmp/$1" "$2" <<'PYEND'
import os, sys
d, keep = sys.argv[1], int(sys.argv[2])
st = os.statvfs(d)
free = st.f_bavail * st.f_frsize
with open(os.path.join(d, "filler"), "wb") as f:
    f.write(b"\0" * max(0, free - keep))
PYEND
}
unfill() { rm -f "$tmp/$1/filler"; }

fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# failed NAME LOG PATH: the run's log says PATH... and "No space left on device"
failed() {
  grep -q "$3.*No space left on device" "$2" || { tail -3 "$2"; bad "$1: the message does not name $3 and the cause"; }
}
no_temps() {   # no_temps NAME DIR: nothing named *.tmp* under DIR
  local t
  t=$(find "$2" -name '*.tmp*' | head -3)
  [ -z "$t" ] || bad "$1: temp files left: $t"
}
same_tree() {   # same_tree NAME A B: the same files, byte for byte (the filler aside)
  (cd "$2" && find . -type f ! -name filler | sort) > "$tmp/a.list"
  (cd "$3" && find . -type f ! -name filler | sort) > "$tmp/b.list"
  cmp -s "$tmp/a.list" "$tmp/b.list" || { diff "$tmp/a.list" "$tmp/b.list" | head -5 || true; bad "$1: other files than the undisturbed run's"; return; }
  while read -r f; do cmp -s "$2/$f" "$3/$f" || bad "$1: $f differs from the undisturbed run's"; done < "$tmp/a.list"
}

# ---- tokenize: 4 input files, 2 workers, 16 kB shards; about 1.3 MB of tokens in all.
mkdir -p "$tmp/docs"
python3 - "$tmp/docs" <<'PYEND'
import json, random, sys
r = random.Random(5)
for f in range(4):
    with open(f"{sys.argv[1]}/part{f}.jsonl", "w") as out:
        for d in range(200):
            words = " ".join("".join(r.choice("abcdefgh") for _ in range(r.randint(1, 8))) for _ in range(r.randint(50, 350)))
            out.write(json.dumps({"text": words}) + "\n")
PYEND
tok=(tokenize --file_glob "$tmp/docs/*.jsonl" --tokenizer_name_or_path bytes --processes 2 --max_shard_bytes 16384)
mkdir -p "$tmp/plain_tok"
"$SPES_BIN" "${tok[@]}" --output_prefix "$tmp/plain_tok/t_" > "$tmp/plain_tok.log" 2>&1 || { tail -3 "$tmp/plain_tok.log"; bad "tokenize: the plain run failed"; }
[ "$(ls "$tmp/plain_tok" | wc -l)" -gt 20 ] || bad "tokenize: the plain run wrote few shards"
disk tok
leave tok 400000
if "$SPES_BIN" "${tok[@]}" --output_prefix "$tmp/tok/out/t_" > "$tmp/tok.log" 2>&1; then bad "tokenize on a full disk succeeded"; fi
failed tokenize "$tmp/tok.log" "$tmp/tok/out/t_00[01]_"
left=$(ls "$tmp/tok/out" | head -3)
[ -z "$left" ] || bad "tokenize: a failed run left shards: $left"
no_temps tokenize "$tmp/tok"
unfill tok
"$SPES_BIN" "${tok[@]}" --output_prefix "$tmp/tok/out/t_" > "$tmp/tok2.log" 2>&1 || { tail -3 "$tmp/tok2.log"; bad "tokenize: the rerun failed"; }
same_tree tokenize "$tmp/plain_tok" "$tmp/tok/out"
# stdout and stderr a pipe that closes at once: the run completes whole or not at all.
mkdir -p "$tmp/pipe_tok"
{ "$SPES_BIN" "${tok[@]}" --output_prefix "$tmp/pipe_tok/t_" 2>&1; echo "exit $?" > "$tmp/pipe_tok.rc"; } | head -c 0 || true
[ "$(cat "$tmp/pipe_tok.rc")" = "exit 0" ] || bad "tokenize | head: $(cat "$tmp/pipe_tok.rc")"
sleep 0.5   # (workers a killed parent left would still be writing)
same_tree "tokenize | head" "$tmp/plain_tok" "$tmp/pipe_tok"
no_temps "tokenize | head" "$tmp/pipe_tok"

# SIGTERM while both workers write (2 x 100 MB, over a second each here): the run stops non-zero
# saying so, and removes every shard it wrote, its workers' temp files included.
mkdir -p "$tmp/big" "$tmp/sig_tok"
for f in 0 1; do yes '{"text": "the quick brown fox jumps over the lazy dog again and again"}' | head -c 100M > "$tmp/big/part$f.jsonl" || true; done
"$SPES_BIN" tokenize --file_glob "$tmp/big/*.jsonl" --tokenizer_name_or_path bytes --processes 2 --max_shard_bytes 1048576 \
  --output_prefix "$tmp/sig_tok/t_" > "$tmp/sig_tok.log" 2>&1 &
sig_pid=$!
for _ in $(seq 1 500); do [ -n "$(ls "$tmp/sig_tok")" ] && break; sleep 0.01; done
kill -TERM "$sig_pid"
rc=0
wait "$sig_pid" || rc=$?
[ "$rc" != 0 ] || bad "tokenize: SIGTERM mid-run exited 0 (did it finish first? $(tail -1 "$tmp/sig_tok.log"))"
grep -q "stopped by a signal" "$tmp/sig_tok.log" || bad "tokenize: SIGTERM not said: $(tail -2 "$tmp/sig_tok.log")"
sleep 0.3   # (workers a killed parent left would still be writing)
left=$(ls "$tmp/sig_tok" | head -3)
[ -z "$left" ] || bad "tokenize: SIGTERM left shards or temp files: $left"
# kill -9 of the parent (the OOM killer): its workers end with it instead of writing on for nobody.
mkdir -p "$tmp/kill_tok"
"$SPES_BIN" tokenize --file_glob "$tmp/big/*.jsonl" --tokenizer_name_or_path bytes --processes 2 --max_shard_bytes 1048576 \
  --output_prefix "$tmp/kill_tok/t_" > "$tmp/kill_tok.log" 2>&1 &
kill_pid=$!
for _ in $(seq 1 500); do [ -n "$(ls "$tmp/kill_tok")" ] && break; sleep 0.01; done
kill -KILL "$kill_pid"
wait "$kill_pid" 2>/dev/null || true
sleep 0.3
n1=$(ls "$tmp/kill_tok" | wc -l)
sleep 1
n2=$(ls "$tmp/kill_tok" | wc -l)
[ "$n1" = "$n2" ] || bad "tokenize: after kill -9 of the parent its workers wrote on ($n1 then $n2 files)"
! pgrep -f -- "--output_prefix $tmp/kill_tok/t_" > /dev/null || bad "tokenize: workers outlived a killed parent"
rm -rf "$tmp/big"

# ---- list-files: a manifest of many long paths onto a full disk.
mkdir -p "$tmp/many/$(printf 'd%.0s' {1..200})"
for i in $(seq 1 400); do : > "$tmp/many/$(printf 'd%.0s' {1..200})/$(printf 'f%.0s' {1..100})_$i.npy"; done
"$SPES_BIN" list-files "$tmp/many" "$tmp/plain_list.txt" > /dev/null 2>&1 || bad "list-files: the plain run failed"
disk list
leave list 20000
if "$SPES_BIN" list-files "$tmp/many" "$tmp/list/files.txt" > "$tmp/list.log" 2>&1; then bad "list-files on a full disk succeeded"; fi
failed list-files "$tmp/list.log" "$tmp/list/files.txt"
[ ! -e "$tmp/list/files.txt" ] || bad "list-files: a failed run left the manifest"
no_temps list-files "$tmp/list"
unfill list
"$SPES_BIN" list-files "$tmp/many" "$tmp/list/files.txt" > /dev/null 2>&1 || bad "list-files: the rerun failed"
cmp -s "$tmp/plain_list.txt" "$tmp/list/files.txt" || bad "list-files: the rerun's manifest differs"

# ---- export: a tiny model (vocab 320, so the bytes tokenizer fits), a 300 kB "tokenizer.json".
source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 40
tiny_config "$tmp" offline
printf 'max_duration: 4\nglobal_train_batch_size: 8\ndevice_train_microbatch_size: 8\n' >> "$tmp/tiny.yaml"
"$SPES_BIN" train "$tmp/tiny.yaml" --model.vocab_size=257 --model.embedding_size=320 --save_folder="$tmp/run" \
  > "$tmp/train.log" 2>&1 || { tail -3 "$tmp/train.log"; bad "the tiny run failed"; }
head -c 300000 /dev/urandom | base64 > "$tmp/tokenizer.json"
exp=(export --checkpoint "$tmp/run" --tokenizer "$tmp/tokenizer.json")
"$SPES_BIN" "${exp[@]}" --out "$tmp/plain_hf" > "$tmp/plain_hf.log" 2>&1 || { tail -3 "$tmp/plain_hf.log"; bad "export: the plain run failed"; }
weights=$(stat -c %s "$tmp/plain_hf/model.safetensors")
disk hf
# room for the weights and config, not the tokenizer; then not for the weights either (sharded)
for case in "tokenizer $((weights + 100000))" "weights $((weights / 2)) --max_shard_size 50KB"; do
  set -- $case
  name=$1 room=$2
  shift 2
  leave hf "$room"
  if "$SPES_BIN" "${exp[@]}" "$@" --out "$tmp/hf/out" > "$tmp/hf.log" 2>&1; then bad "export ($name) on a full disk succeeded"; fi
  failed "export ($name)" "$tmp/hf.log" "$tmp/hf/out"
  [ ! -e "$tmp/hf/out" ] || bad "export ($name): a failed run left $(ls "$tmp/hf/out" | tr '\n' ' ')"
  no_temps "export ($name)" "$tmp/hf"
  unfill hf
  rm -rf "$tmp/hf/out"
done
# A whole export there already: a failed one leaves it as it was.
"$SPES_BIN" "${exp[@]}" --out "$tmp/hf/out" > "$tmp/hf.log" 2>&1 || { tail -3 "$tmp/hf.log"; bad "export: the run with room failed"; }
same_tree "export" "$tmp/plain_hf" "$tmp/hf/out"
leave hf $((weights / 2))
if "$SPES_BIN" "${exp[@]}" --dtype bf16 --out "$tmp/hf/out" > "$tmp/hf.log" 2>&1; then bad "export over an export on a full disk succeeded"; fi
failed "export over an export" "$tmp/hf.log" "$tmp/hf/out"
same_tree "export over an export" "$tmp/plain_hf" "$tmp/hf/out"
no_temps "export over an export" "$tmp/hf"
unfill hf
"$SPES_BIN" "${exp[@]}" --out "$tmp/hf/out" > "$tmp/hf.log" 2>&1 || { tail -3 "$tmp/hf.log"; bad "export: the rerun failed"; }
same_tree "export rerun" "$tmp/plain_hf" "$tmp/hf/out"

# ---- eval --output / --output_requests, generate's stdout, on a full disk.
disk ev
leave ev 0
ev=(eval --model "$tmp/plain_hf" --tokenizer bytes --tokens "$tmp/tokens.npy" --max_tokens 256)
if "$SPES_BIN" "${ev[@]}" --output "$tmp/ev/results.json" > "$tmp/ev.log" 2>&1; then bad "eval --output on a full disk succeeded"; fi
failed "eval --output" "$tmp/ev.log" "$tmp/ev/results.json"
[ ! -e "$tmp/ev/results.json" ] || bad "eval: a failed run left results.json"
no_temps eval "$tmp/ev"
if "$SPES_BIN" generate --model "$tmp/plain_hf" --tokenizer bytes --prompt "ab" --max_new_tokens 8 > "$tmp/ev/gen.txt" 2> "$tmp/gen.log"; then
  bad "generate onto a full disk succeeded"
fi
grep -q "stdout.*No space left on device" "$tmp/gen.log" || { tail -2 "$tmp/gen.log"; bad "generate: the message does not name stdout and the cause"; }
unfill ev
"$SPES_BIN" "${ev[@]}" --output "$tmp/ev/results.json" > /dev/null 2>&1 || bad "eval: the rerun failed"
python3 -c "import json,sys; json.load(open(sys.argv[1]))['perplexity']['loss']" "$tmp/ev/results.json" || bad "eval: the rerun's results"
# --output_requests: 600 request scores (about 50 kB) with 8 kB free.
mkdir -p "$tmp/task"
python3 - "$tmp/task/requests.jsonl" <<'PYEND'
import json, sys
with open(sys.argv[1], "w") as f:
    for d in range(300):
        for i, c in enumerate([" c", " d"]):
            f.write(json.dumps({"request": {"context": "ab" * (d % 5 + 1), "continuation": c}, "doc_id": d, "idx": i, "label": 0}) + "\n")
PYEND
evt=(eval --model "$tmp/plain_hf" --tokenizer bytes --task "$tmp/task/requests.jsonl" --no_progress)
"$SPES_BIN" "${evt[@]}" --output_requests "$tmp/plain_requests.jsonl" > /dev/null 2>&1 || bad "eval --task: the plain run failed"
leave ev 8000
if "$SPES_BIN" "${evt[@]}" --output_requests "$tmp/ev/requests.jsonl" > "$tmp/evr.log" 2>&1; then bad "eval --output_requests on a full disk succeeded"; fi
failed "eval --output_requests" "$tmp/evr.log" "$tmp/ev/requests.jsonl"
[ ! -e "$tmp/ev/requests.jsonl" ] || bad "eval: a failed run left requests.jsonl ($(wc -l < "$tmp/ev/requests.jsonl") lines)"
no_temps "eval --output_requests" "$tmp/ev"
unfill ev
"$SPES_BIN" "${evt[@]}" --output_requests "$tmp/ev/requests.jsonl" > /dev/null 2>&1 || bad "eval --output_requests: the rerun failed"
cmp -s "$tmp/plain_requests.jsonl" "$tmp/ev/requests.jsonl" || bad "eval --output_requests: the rerun's file differs"

[ "$fail" = 0 ] || exit 1
echo "offline_full_disk: OK"
