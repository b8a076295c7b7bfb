# Shared by the integration tests of a server and its peers (sourced, not a test itself): their
# preamble and exit trap, a tokenized tiny corpus, `spes train` peers of the tiny config that
# sync every 2 steps, log waiting and the aggregate checks.
# Needs: $SPES, $DATA, $dir (the test's temp dir): reliability_begin sets them.

# reliability_begin [--venv]: the start of a test of a server and its peers, after `set -euo
# pipefail` and the cd to the repository: $SPES and $DATA (skipped, exit 77, without the corpus;
# with --venv also without the test virtualenv), a temp dir $dir, an empty $server_pid and $pids,
# and an exit trap that kills $server_pid and every pid in $pids (continuing a stopped one first),
# runs the script's cleanup_extra if it defines one, waits, and removes the temp dir (the one made
# here, whatever $dir holds by then).
reliability_begin() {
  SPES=${SPES_BIN:-build/spes}
  DATA=${SPES_TEST_DATA:-../shared/data}
  [ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt"; exit 77; }
  if [ "${1:-}" = --venv ] && [ ! -x "${SPES_VENV_PY:-}" ]; then
    echo "SKIPPED: no test virtualenv (make venv)"
    exit 77
  fi
  dir=$(mktemp -d)
  reliability_tmp=$dir
  server_pid=""
  pids=()
  trap reliability_cleanup EXIT
}

reliability_cleanup() {
  local p
  for p in "${pids[@]}" $server_pid; do
    kill -CONT "$p" 2>/dev/null || true
    kill -9 "$p" 2>/dev/null || true
  done
  if declare -F cleanup_extra >/dev/null; then cleanup_extra; fi
  wait 2>/dev/null || true
  rm -rf "$reliability_tmp"
}

# Tokenizes tinyshakespeare with the byte tokenizer into $dir/file_list.txt.
reliability_data() {
  "$SPES" tokenize --file_glob "$DATA/tinyshakespeare.txt" --tokenizer_name_or_path bytes \
    --output_prefix "$dir/tok/ts_" --dtype uint16 2>/dev/null
  "$SPES" list-files "$dir/tok" "$dir/file_list.txt"
}

# Starts `spes server` for 4 peers of 1 expert each on a random port of 127.0.0.1 in the
# background, extra flags appended, logging to $dir/server.log; sets $port and $server_pid.
reliability_server() {
  port=$(( 20000 + RANDOM % 20000 ))
  rm -f "$dir/server.log"   # a previous server's "listening on" must not satisfy reliability_wait_log
  "$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 127.0.0.1 --port "$port" "$@" \
    >"$dir/server.log" 2>&1 &
  server_pid=$!
}

# Starts peer <peer> of 4 (1 expert each) in the background; sets $last_pid.
# usage: reliability_peer <peer> <port> <steps> <save_folder> <log> [save_interval] [extra args...]
# $RELIABILITY_PEER_ARGS (e.g. --spes_config.payload_dtype=int8) is added to every peer.
reliability_peer() {
  local peer=$1 port=$2 steps=$3 save=$4 log=$5 interval=${6:-$3}
  shift 6 2>/dev/null || shift $#
  SPES_NUM_THREADS=1 "$SPES" train configs/tiny_shakespeare.yaml \
    --data.paths="[$dir/file_list.txt]" --data.seed=$((6198 + 1000 * peer)) \
    --using_spes=true --spes_config.num_peers=4 --spes_config.peer_id=$peer \
    --spes_config.num_train_experts_per_node=1 --spes_config.sync_steps=2 \
    --spes_config.server_addr=127.0.0.1:$port \
    --max_duration=$steps --scheduler.t_warmup=2 --global_train_batch_size=4 --device_train_microbatch_size=4 \
    --save_folder="$save" --save_interval_unsharded=$interval --save_num_unsharded_checkpoints_to_keep=-1 \
    --eval_interval=1000 --try_load_latest_save=false --threads=1 ${RELIABILITY_PEER_ARGS:-} "$@" >"$log" 2>&1 &
  last_pid=$!
}

# reliability_run_peers DIR STEPS SAVE_EVERY [PEER FLAGS...]: the 4 peers of reliability_peer
# against the running server ($port), peer i saving to DIR/peer<i> (log DIR/peer<i>.log) with its
# audit trail in DIR/sync (SPES_SYNC_LOG_DIR); waits for them all and exits 1 with the failed
# peers' and the server's log tails if any failed.
reliability_run_peers() {
  local run=$1 steps=$2 every=$3 peer status=0 pids=()
  shift 3
  mkdir -p "$run/sync"
  export SPES_SYNC_LOG_DIR="$run/sync"
  for peer in 0 1 2 3; do
    reliability_peer $peer "$port" "$steps" "$run/peer$peer" "$run/peer$peer.log" "$every" "$@"
    pids+=("$last_pid")
  done
  for peer in 0 1 2 3; do
    wait "${pids[$peer]}" || { echo "peer $peer failed:"; tail -20 "$run/peer$peer.log"; status=1; }
  done
  [ $status -eq 0 ] || { echo "server log:"; tail -20 "$run/server.log"; exit 1; }
}

# server_matches_peers DIR STEP...: the server's aggregate of each STEP in its state dir
# (DIR/state) is byte for byte the one peer 0 holds after that sync (DIR/sync). Exits 1 otherwise.
server_matches_peers() {
  local run=$1 step
  shift
  for step in "$@"; do
    cmp -s "$run/state/aggregate_s$step.safetensors" "$run/sync/down_s${step}_p0.safetensors" ||
      { echo "step $step: the server's aggregate differs from the one the peers hold"; exit 1; }
  done
  echo "server and peers hold byte-identical aggregates at every step"
}

# peer_view DIR STEP PEER: the download view peer PEER's log names for sync STEP ("": the whole aggregate).
peer_view() { sed -n "s/^.*sync step $2: .*MB\(, view \(.*\)\)\{0,1\}$/\2/p" "$1/peer$3.log"; }

# Waits up to 60 s for <pattern> in <file>; prints the file's tail and fails otherwise.
reliability_wait_log() {
  for _ in $(seq 1 6000); do grep -q "$1" "$2" && return 0; sleep 0.01; done
  echo "never logged '$1' in $2:"; tail -20 "$2"; return 1
}

# peers_match_aggregate DIR PEERS STEP...: after each sync STEP, every peer's checkpoint
# (DIR/peer<i>/step<STEP>) is byte-identical to peer 0's and equal to the aggregate peer 0
# downloaded (DIR/sync/down_s<STEP>_p0, SPES_SYNC_LOG_DIR=DIR/sync). Exits 1 on a difference.
peers_match_aggregate() {
  local dir=$1 peers=$2 step peer
  shift 2
  for step in "$@"; do
    for ((peer = 1; peer < peers; peer++)); do
      cmp -s "$dir/peer0/step$step/model.safetensors" "$dir/peer$peer/step$step/model.safetensors" ||
        { echo "step $step: peer $peer's weights differ from peer 0's after sync"; exit 1; }
    done
    # The loaded weights are exactly the downloaded aggregate.
    "$SPES_VENV_PY" - "$dir" "$step" <<'PY' || exit 1
import sys, numpy as np
from safetensors.numpy import load_file
d, step = sys.argv[1], sys.argv[2]
ckpt = load_file(f"{d}/peer0/step{step}/model.safetensors")
agg = load_file(f"{d}/sync/down_s{step}_p0.safetensors")
assert set(ckpt) == set(agg), "checkpoint and aggregate hold different tensors"
for k in agg:
    assert np.array_equal(ckpt[k], agg[k].astype(np.float32)), f"step {step}: {k} differs from the aggregate"
PY
    echo "step $step: $peers peers byte-identical, equal to the aggregate"
  done
}
