#!/usr/bin/env bash
# `spes train` on hostile inputs other than checkpoints: config values that parse but make no
# sense (or overflow), odd YAML, broken token files. Each must end in one clear error naming
# what and where (file:line or the --key, the data file) with exit 1, never a crash, a hang, a
# wrapped number or a run that trains on something else than asked. The tiny MoE of
# lib/tiny_model.sh (40 instances of 32 ids, vocab 64), a few steps at most.
set -u
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
. tests/integration/lib/tiny_model.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tiny_tokens "$tmp"
tiny_config "$tmp" hostile
sed -i 's/t_warmup: 2/t_warmup: 1/' "$tmp/tiny.yaml"   # so that a 2-step run has a decay
cat >>"$tmp/tiny.yaml" <<EOF
max_duration: 2
global_train_batch_size: 4
device_train_microbatch_size: 2
save_folder: $tmp/out
threads: 1
EOF
fail=0

# run CONFIG ARGS...: spes train with a fresh save folder; sets rc and err (stderr + stdout).
run() {
  rm -rf "$tmp/out"
  err=$(timeout "${LIMIT:-120}" "$SPES_BIN" train "$@" 2>&1)
  rc=$?
}

# refused WHAT EXPECT CONFIG ARGS...: exit 1 and the output holds EXPECT (a fixed string).
refused() {
  local what=$1 expect=$2
  shift 2
  run "$@"
  if [ $rc -ne 1 ] || ! grep -qF -- "$expect" <<<"$err"; then
    echo "FAIL $what: exit $rc, expected exit 1 and '$expect'; got: $(grep -a 'spes:' <<<"$err" | tail -2 | cut -c1-300)"
    fail=1
  else
    echo "ok   $what: $(grep -a '^spes:' <<<"$err" | tail -1 | cut -c1-160)"
  fi
}

# trains WHAT CONFIG ARGS...: exit 0.
trains() {
  local what=$1
  shift
  run "$@"
  if [ $rc -ne 0 ]; then
    echo "FAIL $what: exit $rc: $(tail -2 <<<"$err" | cut -c1-300)"
    fail=1
  else
    echo "ok   $what: trained"
  fi
}

cfg=$tmp/tiny.yaml
trains "the base config" "$cfg"

# max_duration in epochs times steps per epoch past int64 wrapped: 1844674407370955162ep of 10
# steps is 2^64 + 4, so the run trained 4 steps; larger ones said "the decay ends at step -8e18".
refused "epochs overflowing the step count" "command line --max_duration: 1844674407370955162ep of 10 steps each" \
  "$cfg" --max_duration=1844674407370955162ep

# A SPES peer's token file is read after the load: its error named the key with no file:line.
: >"$tmp/empty_token"
refused "an empty peer token file" \
  "command line --spes_config.auth_token_file: token file $tmp/empty_token is empty" \
  "$cfg" --using_spes=true --spes_config.server_addr=127.0.0.1:1 --spes_config.auth_token_file="$tmp/empty_token"

# The schedule is checked once the data gives the step count: its errors said "scheduler: the
# decay ends at step 2 (t_max or max_duration), ..." with no file:line; they name the key where
# it was set, as the loader's own errors do.
refused "a warm-up longer than the run" \
  "$(basename "$cfg"):$(grep -n '^max_duration:' "$cfg" | cut -d: -f1): max_duration: the decay ends at step 2, not after the warm-up (scheduler.t_warmup 5)" \
  "$cfg" --scheduler.t_warmup=5
refused "a warm-up longer than the run in epochs" \
  "command line --max_duration: the decay ends at step 10, not after the warm-up (scheduler.t_warmup 20)" \
  "$cfg" --max_duration=1ep --scheduler.t_warmup=20

# optimizer.eps 1e-50 is > 0 as written but 0 as the float AdamW computes with: the first
# update divided 0 by 0 and step 2 stopped on "the loss is -nan; lower optimizer.learning_rate".
refused "eps that is 0 in fp32" "command line --optimizer.eps: 1e-50 is too small for the 32-bit float" \
  "$cfg" --optimizer.eps=1e-50
trains "eps 1e-40 (a float subnormal, not 0)" "$cfg" --optimizer.eps=1e-40

# Two evaluators with one label trained and wrote two {"eval":"val",...} lines per evaluation
# to metrics.jsonl, from different data, with nothing to tell them apart.
cp "$cfg" "$tmp/evals.yaml"
cat >>"$tmp/evals.yaml" <<EOF
evaluators:
  - label: val
    data: {paths: [$tmp/tokens.npy]}
  - label: val
    data: {paths: [$tmp/tokens.npy]}
EOF
line=$(grep -n "label: val" "$tmp/evals.yaml" | tail -1 | cut -d: -f1)
refused "evaluators sharing a label" "evals.yaml:$line: evaluators[1]: label 'val' is taken by an earlier evaluator" \
  "$tmp/evals.yaml"

# 200000 keys (2 MB): every key was compared with all earlier ones and strcat'ed onto the
# unknown-key list, minutes of CPU (hours at 10 MB); refused at key 10001 now, in well under 20 s.
{ cat "$cfg"; seq 1 200000 | sed 's/^/k/; s/$/: 1/'; } >"$tmp/keys.yaml"
LIMIT=20 refused "a mapping of 200000 keys" "has more than 10000 keys" "$tmp/keys.yaml"

# A config over 64 MiB (a token file given by mistake) was read whole into memory first (4 GB
# of RSS for a 4 GB file) to be told "NUL byte in the config file"; refused by its size now.
truncate -s 200M "$tmp/huge.yaml"
refused "a 200 MiB config" "huge.yaml is 209715200 bytes, more than a YAML config can be" "$tmp/huge.yaml"
rm -f "$tmp/huge.yaml"

# An evaluator's missing file was reported as "evaluator 'val': evaluator 'val': data file: ..."
# (the loader and the trainer each added the label).
run "$cfg" "--evaluators=[{label: val, data: {paths: [$tmp/missing.npy]}}]"
if [ $rc -ne 1 ] || ! grep -qF "spes: evaluator 'val': data file: cannot open $tmp/missing.npy" <<<"$err" ||
   grep -qF "evaluator 'val': evaluator" <<<"$err"; then
  echo "FAIL an evaluator's missing file: exit $rc: $(tail -1 <<<"$err")"; fail=1
else
  echo "ok   an evaluator's missing file: $(tail -1 <<<"$err")"
fi

# A YAML merge key: OmegaConf merges the mapping; here "<<" was an unknown key, warned about and
# ignored, and the run trained with the default seed and warm-up instead.
{ echo "<<: {seed: 3}"; cat "$cfg"; } >"$tmp/merge.yaml"
refused "a YAML merge key" "merge.yaml:1: YAML merge keys (<<) are not supported" "$tmp/merge.yaml"

# Dimensions past what the model code handles were refused only by the trainer, as "model
# config: dimensions are implausibly large (...)", with neither the key nor where it was set.
refused "n_layers past the model's bound" "command line --model.n_layers: 2147483647 is more than the 65536" \
  "$cfg" --model.n_layers=2147483647
refused "vocab past the model's bound" "command line --model.vocab_size: 20000000 rows is more than" \
  "$cfg" --model.vocab_size=20000000 --model.embedding_size=20000000

exit $fail
