# The tiny data-parallel test setup (sourced): dist_tiny_setup DIR writes DIR/tokens.npy (64
# instances of 32 pseudo-random ids) and DIR/tiny.yaml (a 2-layer, 4-expert MoE; global batch
# 12 in micro-batches of 2; 5 steps; 1 thread per rank; cpu).
dist_tiny_setup() {
  local dir=$1
  python3 - "$dir/tokens.npy" <<'PY'
import struct, sys
x, out = 12345, []
for _ in range(64 * 32):
    x = (1103515245 * x + 12345) % 2**31
    out.append((x >> 16) % 64)
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(out), *out))
PY
  cat > "$dir/tiny.yaml" <<YAML
run_name: dist-test
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
scheduler:
  name: cosine_with_warmup
  t_warmup: 2
data:
  paths: [$dir/tokens.npy]
  memmap_dtype: uint16
  seed: 3
  drop_last: true
max_duration: 5
global_train_batch_size: 12
device_train_microbatch_size: 2
max_grad_norm: 0.5
save_folder: $dir/out
save_interval_unsharded: 5
threads: 1
device: cpu
YAML
}
