#!/usr/bin/env bash
# In-loop downstream evaluation (an `evaluators:` entry of type downstream with our `requests:`
# key): a tiny byte-level MoE trains 3 steps with arc_easy (oe-eval request file, first 12
# documents) evaluated at step 2 (eval_interval) and 3 (the end); each line of metrics.jsonl
# equals what `spes eval --task` reports for that step's checkpoint: the accuracies and the
# mean log-probability of the right answers (a continuous figure, exact: the same weights give
# the same bits; one step older weights would not). A tokenizer.identifier that is not set, not
# there, or has more ids than the model's embedding fails at start, naming the evaluator.
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
save_interval_unsharded: 1
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
for step in 1 2 3; do
  "$SPES_BIN" eval --model "$tmp/run/step$step" --tokenizer bytes --task "$TASK" --limit 12 --output "$tmp/res$step.json" \
    --no_progress > "$tmp/eval$step.log" 2>&1 || { cat "$tmp/eval$step.log"; exit 1; }
done
python3 - "$tmp/run/metrics.jsonl" "$tmp" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' in l]
assert [(l["eval"], l["step"]) for l in lines] == [("arc_easy", 2), ("arc_easy", 3)], lines   # eval_interval, and the end
ref = {s: json.load(open(f"{sys.argv[2]}/res{s}.json"))["tasks"]["arc_easy"] for s in (1, 2, 3)}
for ours in lines:
    r = ref[ours["step"]]
    assert ours["docs"] == r["num_docs"] == 12, (ours["docs"], r["num_docs"])
    for m in ("acc_raw", "acc_per_token", "acc_per_char", "acc_per_byte", "acc_uncond", "gold_logprob"):
        if r.get(m) is None:
            assert m not in ours, m
        else:
            assert ours[m] == r[m], (ours["step"], m, ours[m], r[m])
    print(f"in-loop arc_easy at step {ours['step']} = spes eval of its checkpoint: " +
          ", ".join(f"{m} {ours[m]:.4f}" for m in ours if m.startswith(("acc", "gold"))))
assert ref[1]["gold_logprob"] != lines[0]["gold_logprob"], "one step older weights give the same figure: the check is blind"
PY
# without a tokenizer the run stops at start, naming the evaluator and the key
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run2" "${bytes_vocab[@]}" --tokenizer.identifier=null > "$tmp/bad.log" 2>&1; then
  echo "FAIL: a downstream evaluator without a tokenizer trained"; exit 1
fi
grep -q "evaluator 'arc_easy' (downstream) tokenises its requests with tokenizer.identifier.*it is not set" "$tmp/bad.log" ||
  { echo "FAIL: unclear error"; cat "$tmp/bad.log"; exit 1; }
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run3" "${bytes_vocab[@]}" --tokenizer.identifier=/nonexistent/tok.json > "$tmp/bad2.log" 2>&1; then
  echo "FAIL: a missing tokenizer file trained"; exit 1
fi
grep -q "evaluator 'arc_easy' (downstream) tokenises .*bytes: .*/nonexistent/tok.json" "$tmp/bad2.log" ||
  { echo "FAIL: unclear error for a missing tokenizer file"; cat "$tmp/bad2.log"; exit 1; }
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/run4" > "$tmp/bad3.log" 2>&1; then   # vocab 64 < 257 byte ids
  echo "FAIL: a tokenizer with more ids than the embedding trained"; exit 1
fi
# named at the line that set tokenizer.identifier, as the loader's errors read (it had no file:line)
id_line=$(grep -n '^  identifier: bytes' "$tmp/tiny.yaml" | cut -d: -f1)
grep -qF "tiny.yaml:$id_line: tokenizer.identifier: evaluator 'arc_easy' (downstream): bytes has 257 ids, more than the model's embedding" "$tmp/bad3.log" ||
  { echo "FAIL: unclear error for a vocab mismatch"; cat "$tmp/bad3.log"; exit 1; }
[ ! -d "$tmp/run4/step1" ] || { echo "FAIL: the mismatch was found after training began"; exit 1; }
echo PASS
