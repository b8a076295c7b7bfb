#!/usr/bin/env bash
# Tokenizer throughput, ours (bench/tokenize.c, the library `spes tokenize` uses) against Hugging
# Face tokenizers (bench/tokenize_hf.py, encode_batch) on the same documents: Tiny Shakespeare
# repeated to ~TOKENIZE_BENCH_MB megabytes (default 50; HF runs at ~2 MB/s per core here, so
# its single-thread pass takes ~25 s) and a Unicode-heavy text of a quarter
# of that, 1 and 2 processes (HF: RAYON_NUM_THREADS=1 and 2), tokenizer dolma2.json
# (cl100k-style, OLMo 2). Token counts of both sides must agree.
# Last line: "tokenize: ours_mb_s=<x> hf_mb_s=<x> ratio=<x>" (Shakespeare, 1 process each).
#
# usage: bench/tokenize.sh BUILD_DIR [VENV_PYTHON]
set -u
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
PY=${2:-.venv/bin/python}
DATA=${SPES_TEST_DATA:-../shared/data}
MB=${TOKENIZE_BENCH_MB:-50}
OURS="$BUILD_DIR/bench/tokenize"
TOK="$DATA/tokenizers/dolma2.json"
[ -x "$OURS" ] || { echo "tokenize: skipped (no $OURS; build it with make build)"; exit 0; }
[ -f "$TOK" ] && [ -f "$DATA/tinyshakespeare.txt" ] || { echo "tokenize: skipped (no test data in $DATA)"; exit 0; }
have_hf=1
"$PY" -c "import tokenizers" 2>/dev/null || have_hf=0
GEN_PY=$PY
[ -x "$GEN_PY" ] || GEN_PY=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$GEN_PY" bench/tokenize_corpus.py "$DATA/tinyshakespeare.txt" "$work" "$MB" || { echo "tokenize: failed (corpus generation)"; exit 1; }

# field KEY LINE: value of KEY=value in LINE.
field() { echo "$2" | grep -oE "$1=[^ ]+" | sed 's/.*=//'; }

declare -A R
for corpus in shakespeare unicode; do
  for procs in 1 2; do
    line=$("$OURS" "$TOK" "$work/$corpus.txt" "$procs") || { echo "tokenize: failed (ours on $corpus)"; exit 1; }
    echo "$corpus, $procs process(es): $line"
    R[ours_${corpus}_$procs]=$(field mb_s "$line")
    R[ourscpu_${corpus}_$procs]=$(field mb_cpu_s "$line")
    R[ours_tokens_$corpus]=$(field tokens "$line")
    if [ $have_hf = 1 ]; then
      line=$(RAYON_NUM_THREADS=$procs TOKENIZERS_PARALLELISM=true "$PY" bench/tokenize_hf.py "$TOK" "$work/$corpus.txt") ||
        { echo "tokenize: failed (HF on $corpus)"; exit 1; }
      echo "$corpus, $procs thread(s):    $line"
      R[hf_${corpus}_$procs]=$(field mb_s "$line")
      R[hfcpu_${corpus}_$procs]=$(field mb_cpu_s "$line")
      hf_tokens=$(field tokens "$line")
      [ "$hf_tokens" = "${R[ours_tokens_$corpus]}" ] || { echo "tokenize: failed (token counts differ on $corpus: ours ${R[ours_tokens_$corpus]}, HF $hf_tokens)"; exit 1; }
    fi
  done
done
echo
# ratio A B
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "NA" }'; }
echo "MB/s of input text (wall clock), and per CPU second (robust when other jobs share the cores):"
printf "%-12s %-6s %10s %10s %7s   %12s %12s %7s\n" corpus procs ours_mb_s hf_mb_s ratio ours_mb_cpu_s hf_mb_cpu_s ratio
for corpus in shakespeare unicode; do
  for procs in 1 2; do
    o=${R[ours_${corpus}_$procs]} h=${R[hf_${corpus}_$procs]:-NA}
    oc=${R[ourscpu_${corpus}_$procs]} hc=${R[hfcpu_${corpus}_$procs]:-NA}
    printf "%-12s %-6s %10s %10s %7s   %12s %12s %7s\n" "$corpus" "$procs" "$o" "$h" "$(ratio "$o" "$h")" \
      "$oc" "$hc" "$(ratio "$oc" "$hc")"
  done
done
o=${R[ours_shakespeare_1]} h=${R[hf_shakespeare_1]:-NA}
echo "tokenize: ours_mb_s=$o hf_mb_s=$h ratio=$(ratio "$o" "$h")"
