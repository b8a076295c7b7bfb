#!/usr/bin/env bash
# TensorBoard event files beside metrics.jsonl (src/train/tfevents.c), read back with the
# `tensorboard` package's readers (tests/integration/lib/tfevents_check.py): every scalar of
# metrics.jsonl, train and eval lines, at its step, in float32; after a resume from an older
# checkpoint the steps past it are not there twice; a truncated or corrupted copy is detected;
# a run killed with SIGKILL leaves only whole records.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_venv tensorboard numpy
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=1
check() { "$SPES_VENV_PY" tests/integration/lib/tfevents_check.py "$@"; }

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" tfevents-test
cat >> "$tmp/tiny.yaml" <<YAML
max_duration: 6
global_train_batch_size: 8
device_train_microbatch_size: 8
save_interval_unsharded: 2
save_num_unsharded_checkpoints_to_keep: -1
console_log_interval: 2
evaluators:
  - label: val
    type: lm
    data:
      paths: [$tmp/tokens.npy]
eval_interval: 3
device_eval_batch_size: 8
YAML

"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run" > "$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
check "$tmp/run"

# Resume from step 4 of a run that logged 6 steps: steps 5 and 6 are dropped from the old
# event file (as from metrics.jsonl) and logged again in a new one, so each is there once.
rm -rf "$tmp/run/step6"
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run" --resume > "$tmp/resume.log" 2>&1 || { cat "$tmp/resume.log"; exit 1; }
grep -q "resumed from .*step4" "$tmp/resume.log" || { echo "did not resume from step4"; cat "$tmp/resume.log"; exit 1; }
[ "$(ls "$tmp/run"/events.out.tfevents.* | wc -l)" = 2 ] || { echo "expected 2 event files after the resume"; ls "$tmp/run"; exit 1; }
check "$tmp/run"

# Damage is detected: a file cut inside its last record, and one byte flipped inside a record.
first=$(ls "$tmp/run"/events.out.tfevents.* | head -1)
for damage in truncate corrupt; do
  rm -rf "$tmp/bad" && cp -r "$tmp/run" "$tmp/bad"
  bad="$tmp/bad/$(basename "$first")"
  size=$(stat -c %s "$bad")
  if [ $damage = truncate ]; then
    truncate -s $((size - 5)) "$bad"
  else
    printf '\x55' | dd of="$bad" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
  fi
  if check "$tmp/bad" 2> "$tmp/bad.err"; then echo "a $damage'd event file was not detected"; exit 1; fi
  grep -q "damaged" "$tmp/bad.err" || { echo "$damage: unexpected message: $(cat "$tmp/bad.err")"; exit 1; }
  echo "$damage: detected ($(cat "$tmp/bad.err"))"
done

# Killed mid-run with SIGKILL: every event file is whole records and holds every logged line
# (the newest may lack its event when the kill fell between the two writes).
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/killed" --max_duration=100000 --save_interval_unsharded=100000 \
  --eval_interval=100000 > "$tmp/killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$tmp/killed/metrics.jsonl" ] && [ "$(wc -l < "$tmp/killed/metrics.jsonl")" -ge 20 ] && break
  sleep 0.05
done
kill -9 $pid
wait $pid 2>/dev/null || true
pid=""
[ "$(wc -l < "$tmp/killed/metrics.jsonl")" -ge 20 ] || { echo "the run never logged 20 steps"; tail "$tmp/killed.log"; exit 1; }
check "$tmp/killed" --allow-missing-last
echo "tfevents: ok"
