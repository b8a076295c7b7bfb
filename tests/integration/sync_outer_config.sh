#!/usr/bin/env bash
# The outer optimizer's config keys (spes_config.outer_lr / outer_momentum, docs/sync.md) with
# real processes:
#  - scripts/run_parameter_server.sh with CONFIG= starts `spes server --config` with the config's
#    outer settings (0.7 / 0.9 here), and says so;
#  - a peer whose config expects other settings (the defaults, 1 / 0) stops at the handshake
#    with the server's refusal naming both pairs and what to change;
#  - 4 peers of that config run 2 sync rounds with it: byte-identical weights after the last
#    round, and the server keeps the outer optimizer's state in its --state_dir.
# (An older peer that states nothing, and a default server: tests/unit/test_sync_outer_hello.c.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data
{ cat configs/tiny_shakespeare.yaml; printf 'spes_config:\n  outer_lr: 0.7\n  outer_momentum: 0.9\n'; } >"$dir/outer.yaml"

port=$(( 20000 + RANDOM % 20000 ))
SPES_BIN=$SPES CONFIG="$dir/outer.yaml" TOTAL_PEERS=4 NUM_TRAIN_EXPERTS_PER_NODE=1 HOST=127.0.0.1 PORT=$port \
  MERGE_INTERVAL=0 MERGE_ALPHA_START=0 bash scripts/run_parameter_server.sh --state_dir "$dir/state" \
  >"$dir/server.log" 2>&1 &
server_pid=$!
reliability_wait_log "spes server: listening on" "$dir/server.log"
grep -q "outer optimizer lr 0.7, momentum 0.9 (from $dir/outer.yaml)" "$dir/server.log" ||
  { echo "the server did not take the config's outer settings:"; tail -5 "$dir/server.log"; exit 1; }

# A peer at the defaults: refused at the handshake, with both pairs and the fix named.
peer() {   # <config> <peer> <steps> [extra overrides]: runs `spes train` in the foreground
  local cfg=$1 p=$2 steps=$3
  shift 3
  SPES_NUM_THREADS=1 "$SPES" train "$cfg" --data.paths="[$dir/file_list.txt]" --data.seed=$((6198 + 1000 * p)) \
    --using_spes=true --spes_config.num_peers=4 --spes_config.peer_id="$p" \
    --spes_config.num_train_experts_per_node=1 --spes_config.sync_steps=2 \
    --spes_config.server_addr=127.0.0.1:$port --spes_config.retry_timeout_s=5 \
    --max_duration="$steps" --scheduler.t_warmup=1 --global_train_batch_size=4 --device_train_microbatch_size=4 \
    --save_folder="$dir/run/peer$p" --save_interval_unsharded="$steps" --eval_interval=1000 \
    --try_load_latest_save=false --threads=1 "$@"
}
if peer configs/tiny_shakespeare.yaml 0 2 >"$dir/default_peer.log" 2>&1; then
  echo "a peer expecting no outer optimizer was accepted by a server running lr 0.7, momentum 0.9"; exit 1
fi
for want in "outer_lr 1, outer_momentum 0" "this server runs --outer_lr 0.7 --outer_momentum 0.9" \
            "spes_config.outer_lr"; do
  grep -qF "$want" "$dir/default_peer.log" || { echo "refusal lacks '$want':"; tail -5 "$dir/default_peer.log"; exit 1; }
done
echo "a peer expecting other outer settings is refused: $(grep -o 'its config expects[^;]*' "$dir/default_peer.log" | head -1)"

# The config's peers: 2 rounds (steps 2 and 4) with the outer optimizer.
pids=()
for p in 0 1 2 3; do
  peer "$dir/outer.yaml" $p 4 >"$dir/peer$p.log" 2>&1 &
  pids+=($!)
done
for p in 0 1 2 3; do wait "${pids[$p]}" || { echo "peer $p failed:"; tail -20 "$dir/peer$p.log"; exit 1; }; done
for p in 1 2 3; do
  cmp -s "$dir/run/peer0/step4/model.safetensors" "$dir/run/peer$p/step4/model.safetensors" ||
    { echo "peer $p's weights differ from peer 0's after the last round"; exit 1; }
done
ls "$dir"/state/outer_s4.bin >/dev/null || { echo "no outer optimizer state for step 4 in the state dir"; exit 1; }
echo "4 peers of the config with outer_lr 0.7, outer_momentum 0.9: 2 rounds, identical weights, outer state kept"
