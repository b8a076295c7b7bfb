# The tiny data-parallel test setup (sourced): dist_tiny_setup DIR writes DIR/tokens.npy (64
# instances of 32 pseudo-random ids) and DIR/tiny.yaml (the tiny MoE of tiny_model.sh; global
# batch 12 in micro-batches of 2; 5 steps; 1 thread per rank; cpu).
source "$(dirname "${BASH_SOURCE[0]}")/tiny_model.sh"
dist_tiny_setup() {
  local dir=$1
  tiny_tokens "$dir" 64
  tiny_config "$dir" dist-test
  cat >> "$dir/tiny.yaml" <<YAML
max_duration: 5
global_train_batch_size: 12
device_train_microbatch_size: 2
save_folder: $dir/out
save_interval_unsharded: 5
threads: 1
device: cpu
YAML
}
