#!/usr/bin/env bash
# Resume is bit-exact: 8 steps straight vs 4 steps (stop_at) + --resume + 4 steps, on a tiny
# MoE with gradient accumulation (2 micro-batches), warm-up + cosine, clipping and weight
# decay. Every weight, both AdamW moments, the train state and the loss log must be equal
# byte for byte. Also: a changed config refuses to resume (and --force-resume overrides),
# a fresh run refuses a save_folder that holds checkpoints, old checkpoints are pruned,
# load_path loads weights only, SIGINT finishes the step, saves and exits 0, and the
# checkpoint loads in transformers.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPES_BIN=${SPES_BIN:-$PWD/build/spes}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2   # fixed thread count: same reduction order in every run

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" resume-test
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 8
global_train_batch_size: 8
device_train_microbatch_size: 4
save_interval_unsharded: 2
save_num_unsharded_checkpoints_to_keep: 2
console_log_interval: 2
EOF

run() { "$SPES_BIN" train "$tmp/tiny.yaml" "$@"; }

run --save_folder="$tmp/straight" > "$tmp/straight.log" 2>&1 || { cat "$tmp/straight.log"; exit 1; }
run --save_folder="$tmp/split" --stop_at=4 > "$tmp/split1.log" 2>&1 || { cat "$tmp/split1.log"; exit 1; }
[ -d "$tmp/split/step4" ] || { echo "no step4 checkpoint after stop_at=4"; exit 1; }
[ ! -d "$tmp/split/step8" ] || { echo "stop_at=4 trained past step 4"; exit 1; }
run --save_folder="$tmp/split" --resume > "$tmp/split2.log" 2>&1 || { cat "$tmp/split2.log"; exit 1; }
grep -q "resumed from .*step4" "$tmp/split2.log" || { echo "second half did not resume from step4"; cat "$tmp/split2.log"; exit 1; }

for f in model.safetensors train_state.safetensors train_state.json config.json; do
  cmp "$tmp/straight/step8/$f" "$tmp/split/step8/$f" || { echo "step8/$f differs between straight and resumed runs"; exit 1; }
done
strip_perf() { sed 's/,"perf":{[^}]*}//' "$1"; }
strip_perf "$tmp/straight/metrics.jsonl" > "$tmp/a.jsonl"
strip_perf "$tmp/split/metrics.jsonl" > "$tmp/b.jsonl"
[ "$(wc -l < "$tmp/a.jsonl")" -eq 8 ] || { echo "expected 8 step lines"; cat "$tmp/a.jsonl"; exit 1; }
cmp "$tmp/a.jsonl" "$tmp/b.jsonl" || { echo "loss logs differ"; diff "$tmp/a.jsonl" "$tmp/b.jsonl"; exit 1; }
echo "bit-exact: step8 weights, moments, train state and loss log equal after stop+resume"

# optimizer.overlap_next_forward queues each step's AdamW under the next forward, part by part
# (on the cpu one queue: the same ops in another order, the gradients zeroed behind each part's
# update instead of before the step): the same bits, across saves every 2 steps and a resume.
ovl=(--optimizer.overlap_next_forward=true --save_folder="$tmp/overlap")
run "${ovl[@]}" --stop_at=4 > "$tmp/overlap1.log" 2>&1 || { cat "$tmp/overlap1.log"; exit 1; }
run "${ovl[@]}" --resume > "$tmp/overlap2.log" 2>&1 || { cat "$tmp/overlap2.log"; exit 1; }
grep -q "AdamW runs under the next step's forward" "$tmp/overlap2.log" || { echo "overlap not on"; cat "$tmp/overlap2.log"; exit 1; }
for f in model.safetensors train_state.safetensors train_state.json; do
  cmp "$tmp/straight/step8/$f" "$tmp/overlap/step8/$f" || { echo "step8/$f differs with optimizer.overlap_next_forward"; exit 1; }
done
strip_perf "$tmp/overlap/metrics.jsonl" > "$tmp/c.jsonl"
cmp "$tmp/a.jsonl" "$tmp/c.jsonl" || { echo "loss logs differ with optimizer.overlap_next_forward"; diff "$tmp/a.jsonl" "$tmp/c.jsonl"; exit 1; }
echo "optimizer.overlap_next_forward: the same bits (weights, moments, train state, loss log), stop and resume included"

# The loss went down (the trainer trains).
python3 - "$tmp/a.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, last = rows[0]["ce"], rows[-1]["ce"]
assert last < first, f"ce did not fall: {first} -> {last}"
print(f"ce {first:.4f} -> {last:.4f}")
EOF

# Pruning: keep 2 -> step6 and step8 remain.
ls "$tmp/straight" | grep -q '^step6$' && ls "$tmp/straight" | grep -q '^step8$' || { echo "missing kept checkpoints"; ls "$tmp/straight"; exit 1; }
! ls "$tmp/straight" | grep -q '^step[24]$' || { echo "old checkpoints not pruned"; ls "$tmp/straight"; exit 1; }

# A changed configuration does not resume silently...
if run --save_folder="$tmp/split" --resume --optimizer.learning_rate=1e-2 > "$tmp/hash.log" 2>&1; then
  echo "resume with a different learning rate was accepted"; exit 1
fi
grep -q "different configuration" "$tmp/hash.log" || { echo "unclear config-hash error:"; cat "$tmp/hash.log"; exit 1; }
grep -q "changed: optimizer.learning_rate: [0-9.e-]* -> 0.01" "$tmp/hash.log" || { echo "the error does not name the changed key:"; cat "$tmp/hash.log"; exit 1; }
# ...unless forced.
run --save_folder="$tmp/split" --force-resume --optimizer.learning_rate=1e-2 > "$tmp/force.log" 2>&1 || { cat "$tmp/force.log"; exit 1; }
# A fresh run into a folder with checkpoints is refused.
if run --save_folder="$tmp/straight" > "$tmp/fresh.log" 2>&1; then echo "fresh run overwrote checkpoints"; exit 1; fi
grep -q "already holds checkpoints" "$tmp/fresh.log" || { cat "$tmp/fresh.log"; exit 1; }

# load_path initialises the weights only: a new run from straight/step8 (an HF-style
# directory) with a negligible learning rate saves step1 with step8's weights (to 1e-9;
# an update of 1e-12 only moves values that are themselves tiny).
run --save_folder="$tmp/loaded" --load_path="$tmp/straight/step8" --stop_at=1 --optimizer.learning_rate=1e-12 \
  > "$tmp/load.log" 2>&1 || { cat "$tmp/load.log"; exit 1; }
grep -q "initial weights from" "$tmp/load.log" || { echo "load_path not used"; cat "$tmp/load.log"; exit 1; }
python3 - "$tmp/loaded/step1/model.safetensors" "$tmp/straight/step8/model.safetensors" <<'PYEOF'
import array, json, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header, data = json.loads(b[8:8 + n]), b[8 + n:]
    out = {}
    for k, v in header.items():
        if k != "__metadata__":
            a = array.array("f")
            a.frombytes(data[v["data_offsets"][0]:v["data_offsets"][1]])
            out[k] = a
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys()
worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
assert worst < 1e-9, worst
print(f"load_path: step8 weights loaded (max difference after one 1e-12 step: {worst:.1e})")
PYEOF

# SIGINT: finish the step, save, exit 0. (The binary itself goes to the background, not a
# function: a backgrounded subshell would ignore SIGINT and never pass it on.)
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/sig" --max_duration=100000 --save_interval_unsharded=1000000 --console_log_interval=1 \
  > "$tmp/sig.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ -f "$tmp/sig/metrics.jsonl" ] && [ "$(wc -l < "$tmp/sig/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -INT "$pid"
rc=0; timeout 60 tail --pid="$pid" -f /dev/null || { kill -9 "$pid"; echo "SIGINT did not stop training"; exit 1; }
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { echo "SIGINT exit status $rc"; cat "$tmp/sig.log"; exit 1; }
last=$(tail -1 "$tmp/sig/metrics.jsonl" | sed 's/^{"step":\([0-9]*\).*/\1/')
[ -f "$tmp/sig/step$last/train_state.json" ] || { echo "no checkpoint at step $last after SIGINT"; ls "$tmp/sig"; exit 1; }
echo "SIGINT at step $last: checkpoint saved, exit 0"

# The checkpoint directory is a Hugging Face model: transformers loads it as
# OlmoeForCausalLM with our weights and runs it.
if [ -x "${SPES_VENV_PY:-}" ]; then
  "$SPES_VENV_PY" - "$tmp/straight/step8" <<'PYEOF'
import sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
d = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
assert type(model).__name__ == "OlmoeForCausalLM", type(model).__name__
ours = load_file(f"{d}/model.safetensors")
sd = model.state_dict()
# transformers 5 fuses each layer's experts: gate_up_proj [E, 2I, H] = cat(gate, up), down_proj [E, H, I].
for k, v in ours.items():
    if ".mlp.experts." in k:
        prefix, rest = k.split(".mlp.experts.")
        e, kind = int(rest.split(".")[0]), rest.split(".")[1]
        if kind == "down_proj":
            theirs = sd[f"{prefix}.mlp.experts.down_proj"][e]
        else:
            fused = sd[f"{prefix}.mlp.experts.gate_up_proj"][e]
            half = fused.shape[0] // 2
            theirs = fused[:half] if kind == "gate_proj" else fused[half:]
    else:
        theirs = sd[k]
    assert torch.equal(theirs, v), k
logits = model(torch.arange(16).unsqueeze(0) % 64).logits
assert torch.isfinite(logits).all()
print(f"transformers loads step8 as {type(model).__name__}: {sum(v.numel() for v in ours.values())} parameters")
PYEOF
else
  echo "(no test virtualenv: HF loading of the checkpoint not checked)"
fi
