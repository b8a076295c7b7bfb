#!/usr/bin/env bash
# amp_fp16's dynamic loss scaling, through the real trainer (on the cpu backend, where the
# arithmetic stays fp32): scaling by a power of two is exact, so a run with the scaler trains
# the same bytes as one without; a forced gradient overflow (SPES_FORCE_GRAD_OVERFLOW_STEP)
# skips that step's update, halves the scale, and training carries on. Also: a bad precision
# or device value is refused naming the key, and device: cuda without CUDA says why.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=2

python3 - "$tmp/tokens.npy" <<'EOF'
import struct, sys
x, out = 4242, []
for _ in range(40 * 32):
    x = (1103515245 * x + 12345) % 2**31
    out.append((x >> 16) % 64)
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(out), *out))
EOF
cat > "$tmp/tiny.yaml" <<EOF
seed: 5
model: {d_model: 32, n_heads: 4, n_layers: 2, mlp_hidden_size: 64, max_sequence_length: 32, vocab_size: 64,
        embedding_size: 64, eos_token_id: 63, pad_token_id: 63, attention_layer_norm: true, moe_num_experts: 4,
        moe_top_k: 2, moe_loss_weight: 0.01, moe_zloss_weight: 0.001, init_std: 0.02}
optimizer: {name: adamw, learning_rate: 3.0e-3, weight_decay: 0.1, eps: 1.0e-8, betas: [0.9, 0.95]}
scheduler: {name: cosine_with_warmup, t_warmup: 2, alpha_f: 0.1}
max_grad_norm: 0.5
data: {paths: [$tmp/tokens.npy], memmap_dtype: uint16, seed: 3, drop_last: true}
max_duration: 5
global_train_batch_size: 8
device_train_microbatch_size: 4
save_interval_unsharded: 1
EOF
S=$SPES_BIN
$S train "$tmp/tiny.yaml" --save_folder="$tmp/fp32" > "$tmp/fp32.log" 2>&1
$S train "$tmp/tiny.yaml" --save_folder="$tmp/fp16" --precision=amp_fp16 > "$tmp/fp16.log" 2>&1
cmp "$tmp/fp32/step5/model.safetensors" "$tmp/fp16/step5/model.safetensors"
cmp "$tmp/fp32/step5/train_state.safetensors" "$tmp/fp16/step5/train_state.safetensors"
grep -q "scale 65536" "$tmp/fp16.log" || { echo "console shows no loss scale"; cat "$tmp/fp16.log"; exit 1; }
echo "ok: amp_fp16 loss scaling on fp32 arithmetic trains the same bytes as fp32"

SPES_FORCE_GRAD_OVERFLOW_STEP=3 $S train "$tmp/tiny.yaml" --save_folder="$tmp/ovf" --precision=amp_fp16 > "$tmp/ovf.log" 2>&1
grep -q "step 3: gradient overflow in fp16; step skipped, loss scale now 32768" "$tmp/ovf.log" ||
  { echo "no skip message"; cat "$tmp/ovf.log"; exit 1; }
# The skipped step leaves the weights as they were; the steps after it train again.
cmp "$tmp/ovf/step2/model.safetensors" "$tmp/ovf/step3/model.safetensors"
if cmp -s "$tmp/ovf/step3/model.safetensors" "$tmp/ovf/step4/model.safetensors"; then
  echo "step 4 did not update the weights after the skipped step"; exit 1
fi
grep -q '"step":3,.*"loss_scale":32768,"step_skipped":true' "$tmp/ovf/metrics.jsonl" ||
  { echo "metrics.jsonl lacks the skipped step"; cat "$tmp/ovf/metrics.jsonl"; exit 1; }
grep -q '"loss_scale": 32768' "$tmp/ovf/step5/train_state.json" ||
  { echo "the checkpoint lacks the loss scale"; cat "$tmp/ovf/step5/train_state.json"; exit 1; }
if grep -q loss_scale "$tmp/fp32/step5/train_state.json"; then echo "fp32 checkpoint has a loss scale"; exit 1; fi
$S train "$tmp/tiny.yaml" --save_folder="$tmp/ovf" --precision=amp_fp16 --max_duration=6 --resume > "$tmp/res.log" 2>&1
grep -q "step 6/6 .*scale 32768" "$tmp/res.log" || { echo "resume lost the loss scale"; cat "$tmp/res.log"; exit 1; }
echo "ok: a forced overflow skips the update, halves the scale, training recovers, the scale survives resume"

if $S train "$tmp/tiny.yaml" --save_folder="$tmp/bad" --precision=bf16 > "$tmp/bad.log" 2>&1; then
  echo "precision bf16 was accepted"; exit 1; fi
grep -q "precision" "$tmp/bad.log" && grep -q "amp_bf16" "$tmp/bad.log"
if ! $S version | grep -q "cuda("; then
  if $S train "$tmp/tiny.yaml" --save_folder="$tmp/cuda" --device=cuda > "$tmp/cuda.log" 2>&1; then
    echo "device cuda was accepted by a build without CUDA"; exit 1; fi
  grep -q "built without CUDA" "$tmp/cuda.log" || { cat "$tmp/cuda.log"; exit 1; }
fi
echo "ok: bad precision/device values refused with the reason"
