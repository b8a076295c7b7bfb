#!/usr/bin/env bash
# The launch scripts as a scheduler would run them: 4 nodes started with RANK/MASTER_ADDR/
# NPROC_PER_NODE through scripts/run_cluster.sh (rank 0 starts and stops the server), on
# 127.0.0.1. All must finish, and the final weights of the 4 nodes must be byte-identical
# (the run ends on a sync step); an outer-optimizer override given as "--key value" reaches the
# server. Then node 2 restarts with run_single_node.sh --resume and finds its finished checkpoint.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export SPES_BIN=${SPES_BIN:-$ROOT/build/spes}
DATA=${SPES_TEST_DATA:-$ROOT/../shared/data}
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt"; exit 77; }
work=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
"$SPES_BIN" tokenize --file_glob "$DATA/tinyshakespeare.txt" --tokenizer_name_or_path bytes \
  --output_prefix "$work/tok/ts_" --dtype uint16 2>/dev/null
"$SPES_BIN" list-files "$work/tok" "$work/file_list.txt" 2>/dev/null

export PORT=$(( 20000 + RANDOM % 20000 )) MASTER_ADDR=localhost NPROC_PER_NODE=1 THREADS=1
export TOTAL_PEERS=4 NUM_TRAIN_EXPERTS_PER_NODE=2 MERGE_INTERVAL=2 MERGE_ALPHA_START=0.1 MERGE_DECAY_STEPS=100
overrides=(--data.paths="[$work/file_list.txt]" --max_duration=4 --scheduler.t_warmup=1
           --global_train_batch_size=2 --device_train_microbatch_size=2 --spes_config.sync_steps=2
           --save_interval_unsharded=2 --eval_interval=1000 --spes_config.outer_momentum 0.5)
pids=()
for rank in 0 1 2 3; do
  RANK=$rank SERVER_LOG="$work/server.log" "$ROOT/scripts/run_cluster.sh" "${overrides[@]}" >"$work/rank$rank.log" 2>&1 &
  pids+=($!)
done
for rank in 0 1 2 3; do
  wait "${pids[$rank]}" || { echo "rank $rank failed:"; tail -20 "$work/rank$rank.log"; exit 1; }
done
for rank in 1 2 3; do
  cmp "$work/output/spes-tiny-4nodes/node0/step4/model.safetensors" \
      "$work/output/spes-tiny-4nodes/node$rank/step4/model.safetensors" || { echo "node $rank differs"; exit 1; }
done
grep -q "listening on" "$work/server.log" || { echo "rank 0 did not start the server"; exit 1; }
# The peers' outer-optimizer override (the "--key value" form) reached the server: a server on
# other values would have refused them.
grep -q "momentum 0.5" "$work/server.log" || { echo "the server did not get the outer momentum"; cat "$work/server.log"; exit 1; }
# Rank 0 stopped its server at the end: nothing listens any more.
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then echo "server still running after rank 0 finished"; exit 1; fi
# A finished node resumed: it loads step 4 and has nothing left to do.
SERVER_ADDR=127.0.0.1:$PORT "$ROOT/scripts/run_single_node.sh" 2 --resume "${overrides[@]}" >"$work/resume.log" 2>&1 ||
  { tail -20 "$work/resume.log"; exit 1; }
grep -qi "step4\|step 4" "$work/resume.log" || { echo "resume did not find step 4:"; tail -5 "$work/resume.log"; exit 1; }
echo "launch scripts: 4 nodes via run_cluster.sh, identical final weights, server stopped, resume ok"
