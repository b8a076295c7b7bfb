# A tiny MoE and its data for training tests (sourced).

# tiny_tokens DIR [INSTANCES]: DIR/tokens.npy, INSTANCES (default 40) instances of 32 tokens:
# deterministic pseudo-random ids in [0, 64), raw uint16.
tiny_tokens() {
  python3 - "$1/tokens.npy" "${2:-40}" <<'EOF'
import struct, sys
x, out = 12345, []
for _ in range(int(sys.argv[2]) * 32):
    x = (1103515245 * x + 12345) % 2**31
    out.append((x >> 16) % 64)
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(out), *out))
EOF
}

# tiny_config DIR RUN_NAME: DIR/tiny.yaml, a tiny MoE (d_model 32, 4 heads, 2 layers, 4
# experts top-2, vocab 64, seq 32) on DIR/tokens.npy with all four losses, warm-up + cosine,
# clipping and weight decay. The caller appends its run-control keys (max_duration, batch
# sizes, save interval, ...).
tiny_config() {
  cat > "$1/tiny.yaml" <<EOF
run_name: $2
seed: 17
model:
  d_model: 32
  n_heads: 4
  n_layers: 2
  mlp_hidden_size: 64
  max_sequence_length: 32
  vocab_size: 64
  embedding_size: 64
  eos_token_id: 63
  pad_token_id: 63
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
  t_warmup: 2
  alpha_f: 0.1
max_grad_norm: 0.5
data:
  paths: [$1/tokens.npy]
  memmap_dtype: uint16
  seed: 3
  drop_last: true
EOF
}
