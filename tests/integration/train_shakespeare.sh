#!/usr/bin/env bash
# Quality check on real text: tinyshakespeare through `spes tokenize` with the built-in byte
# tokenizer (ids 0..255 = bytes, EOS 256; embedding padded to 264), the last 32 KiB held out.
# A small MoE (d_model 128, 2 layers, 4 experts top-2, 0.59M parameters) trains SPES_SHAKESPEARE_STEPS
# steps of 16 x 128 tokens (default 100: 205k tokens, ~4.5 GFLOP a step) and the held-out
# cross-entropy must end at least 0.8 nats below the unigram entropy of the training bytes
# (the best a model that ignores context can do).
# SPES_SHAKESPEARE_OUT=DIR keeps the run (metrics.jsonl, train.log) and draws
# DIR/shakespeare_loss.svg with scripts/plot_loss.py (the README figure).
set -euo pipefail
cd "$(dirname "$0")/../.."
SPES_BIN=${SPES_BIN:-$PWD/build/spes}
DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
STEPS=${SPES_SHAKESPEARE_STEPS:-100}
# Under `make test-asan` the 100 steps take ~15 min on 2 cores, and this is a quality check: the
# same tokenize/train/eval code runs under ASan in train_resume, spes_train_e2e and demo_smoke.
# SPES_SHAKESPEARE_STEPS set explicitly runs it anyway.
if [ -n "${SPES_ASAN:-}" ] && [ -z "${SPES_SHAKESPEARE_STEPS:-}" ]; then
  echo "SKIPPED under ASan: 100 training steps take ~15 min there (a quality check, not a memory check); set SPES_SHAKESPEARE_STEPS to run it"
  exit 77
fi
if [ ! -f "$DATA/tinyshakespeare.txt" ]; then
  echo "SKIPPED: $DATA/tinyshakespeare.txt not found (set SPES_TEST_DATA)"
  exit 77
fi
if [ -n "${SPES_SHAKESPEARE_OUT:-}" ]; then
  out=$SPES_SHAKESPEARE_OUT; mkdir -p "$out"; rm -rf "$out/run"
else
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi

# Split the text (the last 32 KiB held out), `spes tokenize` each part with the built-in
# byte tokenizer, check the ids are the (stripped) bytes + EOS 256, and compute the unigram
# entropy (nats) of the training bytes.
python3 - "$DATA/tinyshakespeare.txt" "$out" <<'EOF'
import sys
text = open(sys.argv[1], "rb").read()
held = 32 * 1024
open(f"{sys.argv[2]}/train.txt", "wb").write(text[:-held])
open(f"{sys.argv[2]}/val.txt", "wb").write(text[-held:])
EOF
for split in train val; do
  "$SPES_BIN" tokenize --file_glob "$out/$split.txt" --tokenizer_name_or_path bytes \
    --output_prefix "$out/${split}_" --dtype uint16 > "$out/tokenize_$split.log" 2>&1 \
    || { cat "$out/tokenize_$split.log"; exit 1; }
  shards=("$out/${split}_"*.npy)
  [ "${#shards[@]}" -eq 1 ] || { echo "$split: expected one token shard, got: ${shards[*]}"; exit 1; }
  mv "${shards[0]}" "$out/$split.npy"
done
H=$(python3 - "$out" <<'EOF'
import math, struct, sys
from collections import Counter
for split in ("train", "val"):
    raw = open(f"{sys.argv[1]}/{split}.npy", "rb").read()
    ids = list(struct.unpack("<%dH" % (len(raw) // 2), raw))
    text = open(f"{sys.argv[1]}/{split}.txt", "rb").read().strip()   # documents are stripped
    assert ids[:-1] == list(text) and ids[-1] == 256, f"{split}: token ids are not the bytes + EOS"
    if split == "train":
        counts, n = Counter(text), len(text)
print("%.6f" % -sum(c / n * math.log(c / n) for c in counts.values()))
EOF
)
echo "unigram entropy of the training bytes: $H nats"

cat > "$out/shakespeare.yaml" <<EOF
run_name: shakespeare-bytes
seed: 6198
model:
  d_model: 128
  n_heads: 4
  n_layers: 2
  mlp_hidden_size: 256
  max_sequence_length: 128
  vocab_size: 257
  embedding_size: 264
  eos_token_id: 256
  pad_token_id: 256
  attention_layer_norm: true
  moe_num_experts: 4
  moe_top_k: 2
  moe_loss_weight: 0.01
  moe_zloss_weight: 0.001
  init_std: 0.02
softmax_auxiliary_loss: true
auxiliary_loss_multiplier: 1e-4
optimizer:
  name: adamw
  learning_rate: 3.0e-3
  weight_decay: 0.1
  eps: 1.0e-8
  betas: [0.9, 0.95]
scheduler:
  name: cosine_with_warmup
  t_warmup: 30
  alpha_f: 0.1
max_grad_norm: 1.0
data:
  paths: [$out/train.npy]
  memmap_dtype: uint16
  seed: 1
  drop_last: true
evaluators:
  - label: shakespeare-val
    type: lm
    data:
      paths: [$out/val.npy]
eval_interval: ${SPES_SHAKESPEARE_EVAL_INTERVAL:-50}
device_eval_batch_size: 32
max_duration: $STEPS
global_train_batch_size: 16
device_train_microbatch_size: 16
save_folder: $out/run
save_interval_unsharded: null
console_log_interval: 25
EOF

start=$(date +%s)
"$SPES_BIN" train "$out/shakespeare.yaml" 2>&1 | tee "$out/train.log"
echo "trained $STEPS steps in $(( $(date +%s) - start ))s"

python3 - "$out/run/metrics.jsonl" "$H" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
H = float(sys.argv[2])
evals = [r for r in rows if "eval" in r]
train = [r for r in rows if "eval" not in r]
assert evals, "no validation loss was logged"
final = evals[-1]["ce"]
print(f"train ce {train[0]['ce']:.3f} -> {train[-1]['ce']:.3f}; validation ce {evals[0]['ce']:.3f} -> {final:.3f} "
      f"(step {evals[-1]['step']}); unigram entropy {H:.3f}")
assert final < H - 0.8, f"validation ce {final:.3f} is not well below the unigram entropy {H:.3f}"
EOF
if [ -n "${SPES_SHAKESPEARE_OUT:-}" ]; then
  python3 scripts/plot_loss.py "$out/run/metrics.jsonl" --unigram "$H" --out "$out/shakespeare_loss.svg" \
    --title "tinyshakespeare, byte-level MoE (4 experts, top-2): cross-entropy"
fi
