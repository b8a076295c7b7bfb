# The tiny data-parallel test setup (sourced): dist_tiny_setup DIR writes DIR/tokens.npy (64
# instances of 32 pseudo-random ids) and DIR/tiny.yaml (the tiny MoE of tiny_model.sh; global
# batch 12 in micro-batches of 2; 5 steps; 1 thread per rank; cpu), and remembers DIR for
# dist_train / dist_check below.
source "$(dirname "${BASH_SOURCE[0]}")/tiny_model.sh"
dist_tiny_setup() {
  local dir=$1
  DIST_TINY_DIR=$dir
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

# dist_train NAME NPROC [overrides...]: trains DIR/tiny.yaml with NPROC ranks into DIR/NAME
# (log DIR/NAME.log); a failure prints the log's tail and exits.
dist_train() {
  local name=$1 n=$2 dir=$DIST_TINY_DIR
  shift 2
  if ! timeout 300 "$SPES_BIN" train "$dir/tiny.yaml" --save_folder="$dir/$name" --nproc_per_node "$n" "$@" >>"$dir/$name.log" 2>&1; then
    echo "FAIL: training $name ($n ranks $*)"; tail -30 "$dir/$name.log"; exit 1
  fi
}

# dist_check A B STEP [compare options]: the runs DIR/A and DIR/B agree (lib/dist_compare.py).
dist_check() {
  local dir=$DIST_TINY_DIR
  echo "-- $2 vs $1"
  python3 tests/integration/lib/dist_compare.py "$dir/$1" "$dir/$2" "$3" "${@:4}" || { echo "FAIL: $2 differs from $1"; exit 1; }
}
