#!/usr/bin/env bash
# Where the model commands write, and what they echo, on bad input:
#  - `spes export --out` into a training checkpoint (a directory with train_state.json), into a
#    save_folder, or onto its own --checkpoint is refused and leaves the checkpoint untouched
#    (it used to overwrite the F32 weights with a BF16 copy that resume then continued from);
#  - `spes eval --output` / `--output_requests` to a path that cannot be created fails before
#    the evaluation, not after it;
#  - `spes generate` refuses a prompt longer than the model's context without echoing it.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
SPES=$SPES_BIN
DATA=${SPES_TEST_DATA:-../shared/data}
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source tests/integration/lib/reliability.sh
reliability_data >/dev/null 2>&1
SPES_NUM_THREADS=1 "$SPES" train configs/tiny_shakespeare.yaml --data.paths="[$dir/file_list.txt]" --max_duration=2 --scheduler.t_warmup=1 \
  --save_folder="$dir/run" --eval_interval=1000 --threads=1 >"$dir/train.log" 2>&1 || { tail "$dir/train.log"; exit 1; }
ck="$dir/run/step2"
sha() { sha256sum "$ck"/model.safetensors "$ck"/train_state.json | cut -c1-16 | tr '\n' ' '; }
before=$(sha)
fail=0
check() {   # check <label> <want_rc> <fragment of stderr> <command...>
  local label=$1 want=$2 frag=$3; shift 3
  "$@" >"$dir/out.txt" 2>"$dir/err.txt"; local rc=$?
  if [ $rc -ne "$want" ] || ! grep -qF -- "$frag" "$dir/err.txt"; then
    echo "FAIL $label: exit $rc (want $want), stderr:"; tail -3 "$dir/err.txt"; fail=1
  else echo "ok   $label: $(grep -F -- "$frag" "$dir/err.txt" | tail -1 | cut -c1-150)"; fi
}

check "export into a checkpoint" 1 "is a training checkpoint" "$SPES" export --checkpoint "$ck" --out "$ck" --dtype bf16
check "export into another step's checkpoint" 1 "is a training checkpoint" \
  "$SPES" export --checkpoint "$dir/run" --out "$ck" --dtype bf16
check "export into a save_folder" 1 "is a training save_folder" "$SPES" export --checkpoint "$ck" --out "$dir/run"
[ "$(sha)" = "$before" ] || { echo "FAIL the checkpoint changed"; fail=1; }
check "export to a new directory" 0 "export: wrote" "$SPES" export --checkpoint "$dir/run" --out "$dir/hf"
check "export onto its own source" 1 "is the --checkpoint directory itself" "$SPES" export --checkpoint "$dir/hf" --out "$dir/hf"

check "eval --output into a missing directory" 1 "--output" \
  "$SPES" eval --model "$dir/hf" --tokens "$(ls "$dir"/tok/*.npy | head -1)" --max_tokens 4096 --output "$dir/missing/results.json"
[ ! -s "$dir/out.txt" ] || { echo "FAIL eval ran before failing on --output:"; head -3 "$dir/out.txt"; fail=1; }
check "eval --output onto a directory" 1 "is a directory" \
  "$SPES" eval --model "$dir/hf" --tokens "$(ls "$dir"/tok/*.npy | head -1)" --max_tokens 4096 --output "$dir/hf"
check "eval --output_requests into a missing directory" 1 "--output_requests" \
  "$SPES" eval --model "$dir/hf" --tokens "$(ls "$dir"/tok/*.npy | head -1)" --max_tokens 4096 --output_requests "$dir/missing/r.jsonl"
[ ! -s "$dir/out.txt" ] || { echo "FAIL eval ran before failing on --output_requests"; fail=1; }

head -c 1000000 "$DATA/tinyshakespeare.txt" >"$dir/prompt.txt"
check "generate with a prompt past the context" 1 "max_seq_len is" \
  "$SPES" generate --model "$dir/hf" --tokenizer bytes --prompt_file "$dir/prompt.txt" --max_new_tokens 4
[ "$(wc -c <"$dir/out.txt")" -lt 1000 ] || { echo "FAIL generate echoed $(wc -c <"$dir/out.txt") bytes of a refused prompt"; fail=1; }
check "generate with a short prompt" 0 "new tokens" "$SPES" generate --model "$dir/hf" --tokenizer bytes --prompt "ROMEO:" --max_new_tokens 4
exit $fail
