#!/usr/bin/env bash
# In-loop downstream evaluation (an `evaluators:` entry of type downstream with our `requests:`
# key): a tiny byte-level MoE trains 3 steps with arc_easy (oe-eval request file, first 12
# documents) evaluated at step 2 (eval_interval) and 3 (the end); step 2's accuracies in
# metrics.jsonl equal what `spes eval --task` reports for the step-2 checkpoint, and a missing
# tokenizer.identifier is a clear error at start.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
DATA=${SPES_TEST_DATA:-../shared/data}
TASK="$DATA/eval/arc_easy_rc_0shot"
[ -f "$TASK/requests.jsonl.gz" ] || { echo "SKIPPED: no $TASK (set SPES_TEST_DATA)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 16
tiny_config "$tmp" downstream
cat >> "$tmp/tiny.yaml" <<YAML
max_duration: 3
global_train_batch_size: 8
device_train_microbatch_size: 8
save_interval_unsharded: 2
eval_interval: 2
threads: 2
device: cpu
tokenizer:
  identifier: bytes
evaluators:
  - label: arc_easy
    type: downstream
    requests: $TASK
    limit: 12
YAML
bytes_vocab=(--model.vocab_size=260 --model.embedding_size=260)
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run" "${bytes_vocab[@]}" > "$tmp/train.log" 2>&1 ||
  { tail -20 "$tmp/train.log"; exit 1; }
grep -q "eval arc_easy at step 2: 12 docs acc_raw" "$tmp/train.log" || { echo "FAIL: no eval line"; tail "$tmp/train.log"; exit 1; }
"$SPES_BIN" eval --model "$tmp/run/step2" --tokenizer bytes --task "$TASK" --limit 12 --output "$tmp/res.json" \
  --no_progress > "$tmp/eval.log" 2>&1 || { cat "$tmp/eval.log"; exit 1; }
python3 - "$tmp/run/metrics.jsonl" "$tmp/res.json" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' in l]
assert [(l["eval"], l["step"]) for l in lines] == [("arc_easy", 2), ("arc_easy", 3)], lines   # eval_interval, and the end
ours, ref = lines[0], json.load(open(sys.argv[2]))["tasks"]["arc_easy"]
assert ours["docs"] == ref["num_docs"] == 12, (ours["docs"], ref["num_docs"])
for m in ("acc_raw", "acc_per_token", "acc_per_char", "acc_per_byte", "acc_uncond"):
    if ref.get(m) is None:
        assert m not in ours, m
    else:
        assert ours[m] == ref[m], (m, ours[m], ref[m])
print("in-loop arc_easy at step 2 = spes eval of the step-2 checkpoint: " +
      ", ".join(f"{m} {ours[m]:.4f}" for m in ours if m.startswith("acc")))
PY
# without a tokenizer the run stops at start, naming the evaluator and the key
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run2" "${bytes_vocab[@]}" --tokenizer.identifier=null > "$tmp/bad.log" 2>&1; then
  echo "FAIL: a downstream evaluator without a tokenizer trained"; exit 1
fi
grep -q "evaluator 'arc_easy' (downstream) tokenises its requests with tokenizer.identifier" "$tmp/bad.log" ||
  { echo "FAIL: unclear error"; cat "$tmp/bad.log"; exit 1; }
echo PASS
