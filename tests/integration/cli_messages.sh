#!/usr/bin/env bash
# Bad command-line values get one clear line naming the flag as the user typed it: never a
# doubled prefix like "----batch" (flags passed to the checked parsers with their dashes), and
# no message without the flag's name. Runs every command with a bad value of a few flags.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
fail=0
# expect <flag as shown> <command...>: exit 1 or 2, stderr names the flag, has no "---".
expect() {
  local flag=$1; shift
  local err
  err=$("$SPES_BIN" "$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -eq 0 ] || grep -q -- '---' <<<"$err" || ! grep -qF -- "$flag" <<<"$err"; then
    echo "FAIL spes $*: exit $rc: $(head -1 <<<"$err")"; fail=1
  else
    echo "ok   spes $*: $(head -1 <<<"$err" | cut -c1-110)"
  fi
}
expect --batch demo --batch 0
expect --peers demo --peers many
expect --steps demo --steps -3
expect --train_docs demo --train_docs 1
expect --threads_per_peer demo --threads_per_peer 0
expect --payload demo --payload int3
expect --lr_scale demo --lr_scale 0
expect --beta1 demo --beta1 1
expect --sync_warmup_steps demo --sync_warmup_steps 32
expect --sync_warmup_every demo --sync_warmup_every 50
expect --batch debug-step --model x --batch 0
expect --seq debug-step --model x --seq 0
expect --lm_z_mult debug-step --model x --lm_z_mult -1
expect --threads debug-step --model x --threads 0
expect --batch eval --model x --tokens y --batch 0
expect --top_k generate --model x --prompt a --top_k -1
expect --temperature generate --model x --prompt a --temperature -1
# A model directory without a tokenizer.json: the first line says so (it was the bare usage).
nodir=$(mktemp -d)
err=$("$SPES_BIN" generate --model "$nodir" --prompt a 2>&1 >/dev/null)
if head -1 <<<"$err" | grep -qF "$nodir holds no tokenizer.json"; then
  echo "ok   spes generate without a tokenizer: $(head -1 <<<"$err" | cut -c1-110)"
else
  echo "FAIL spes generate without a tokenizer: $(head -1 <<<"$err")"; fail=1
fi
rmdir "$nodir"
expect --num_experts upcycle --dense a --out b --num_experts 0 --top_k 1
expect --max_shard_size export --checkpoint a --out b --max_shard_size 0
expect --processes tokenize --file_glob a --tokenizer_name_or_path bytes --output_prefix o --processes 0
expect --dtype list-files --dtype
expect --foo train configs/tiny_shakespeare.yaml --foo=1
exit $fail
