#!/usr/bin/env bash
# A real `spes train` peer against a hostile or broken parameter server
# (tests/integration/lib/hostile_sync_server.py, one way of breaking per run; the peer is the
# run's only one, owning every expert). Each case wants the peer to stop with exit 1 and a message
# naming the server and what is wrong (or, where the docs promise it, to retry first), within a
# bounded time, and to leave its save_folder whole: step 2 saved NOT synced, with the weights it
# trained (finite), resumable against an honest server.
# SPES_HOSTILE_CASES="nan truncated" runs only those cases.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv
/usr/bin/python3 -c "import grpc, google.protobuf" 2>/dev/null ||
  { echo "SKIPPED: python3-grpcio / python3-protobuf missing (scripts/install-deps.sh)"; exit 77; }
command -v protoc-c >/dev/null || { echo "SKIPPED: protoc-c missing"; exit 77; }
protoc-c --proto_path=proto --descriptor_set_out="$dir/federated.desc" proto/federated.proto
reliability_data
fail() { echo "FAIL: $*"; exit 1; }

# hostile MODE: (re)starts the hostile server; sets $port and $server_pid.
hostile() {
  [ -n "$server_pid" ] && { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true; }
  rm -f "$dir/server.out"   # the previous server's "listening on" must not be read as this one's
  /usr/bin/python3 tests/integration/lib/hostile_sync_server.py "$dir/federated.desc" "$1" >"$dir/server.out" 2>&1 &
  server_pid=$!
  port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$dir/server.out" 2>/dev/null || true)   # not there until the child opens it
    [ -n "$port" ] && return 0
    sleep 0.1
  done
  fail "the hostile server ($1) did not start: $(cat "$dir/server.out")"
}

# peer SAVE LOG STEPS [flags...]: the one peer of the run (4 experts of 4), a round every 2 steps,
# a checkpoint at every round, server retries given up after 3 s; its exit status in $rc.
peer() {
  local save=$1 log=$2 steps=$3
  shift 3
  set +e
  SPES_NUM_THREADS=1 timeout 120 "$SPES" train configs/tiny_shakespeare.yaml \
    --data.paths="[$dir/file_list.txt]" --data.seed=6198 \
    --using_spes=true --spes_config.num_peers=1 --spes_config.peer_id=0 \
    --spes_config.num_train_experts_per_node=4 --spes_config.sync_steps=2 \
    --spes_config.server_addr=127.0.0.1:$port --spes_config.retry_timeout_s=3 \
    --max_duration=$steps --scheduler.t_warmup=1 --global_train_batch_size=4 --device_train_microbatch_size=4 \
    --save_folder="$save" --save_interval_unsharded=2 --save_num_unsharded_checkpoints_to_keep=-1 \
    --eval_interval=1000 --try_load_latest_save=false --threads=1 "$@" >"$log" 2>&1
  rc=$?
  set -e
}

# unsynced_intact SAVE STEP: SAVE/stepSTEP is a complete checkpoint marked not synced whose
# weights are all finite and within +-65504.
unsynced_intact() {
  "$SPES_VENV_PY" - "$1/step$2" <<'PY'
import json, sys, numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
state = json.load(open(f"{d}/train_state.json"))
assert state.get("synced") is False, f"{d}: synced is {state.get('synced')!r}, want false"
for k, v in load_file(f"{d}/model.safetensors").items():
    assert np.all(np.isfinite(v)) and np.all(np.abs(v) <= 65504), f"{d}: tensor {k} holds poisoned values"
PY
}

# refused CASE STEPS WANT [flags...]: the peer against `hostile CASE` exits 1 within 40 s
# (between $refused_min and $refused_max s where set), its log names the server and WANT (an
# extended regex), and it saved step STEPS not synced (STEPS 0: refused at the handshake, before
# training: 2 steps asked, nothing saved).
refused_min=0 refused_max=40
refused() {
  local case=$1 steps=$2 want=$3
  shift 3
  hostile "$case"
  local start
  start=$(date +%s)
  peer "$dir/$case" "$dir/$case.log" "$([ "$steps" = 0 ] && echo 2 || echo "$steps")" "$@"
  local took=$(( $(date +%s) - start ))
  [ $rc -eq 1 ] || fail "$case: exit $rc, want 1: $(tail -5 "$dir/$case.log")"
  [ $took -lt $refused_max ] || fail "$case: took ${took}s, want under ${refused_max}s"
  [ $took -ge $refused_min ] || fail "$case: took ${took}s, want at least ${refused_min}s (cut before its deadline)"
  grep -q "server 127.0.0.1:$port" "$dir/$case.log" || fail "$case: the server is not named: $(tail -4 "$dir/$case.log")"
  grep -Eq "$want" "$dir/$case.log" || fail "$case: no '$want' in the log: $(tail -3 "$dir/$case.log")"
  if [ "$steps" = 0 ]; then
    ! ls -d "$dir/$case"/step* 2>/dev/null || fail "$case: refused at the handshake, yet it saved a step"
  else
    unsynced_intact "$dir/$case" "$steps" || fail "$case: step $steps is not a clean unsynced checkpoint"
  fi
  echo "ok   $case: exit 1 after ${took}s: $(grep -Eo "$want.{0,80}" "$dir/$case.log" | head -1)"
}

selected() { [ -z "${SPES_HOSTILE_CASES:-}" ] || [[ " $SPES_HOSTILE_CASES " == *" $1 "* ]]; }

# The baseline: an honest echo completes both rounds, synced.
if selected honest; then
  hostile honest
  peer "$dir/honest" "$dir/honest.log" 4
  [ $rc -eq 0 ] || fail "honest: exit $rc: $(tail -5 "$dir/honest.log")"
  ! grep -q '"synced": *false' "$dir/honest/step4/train_state.json" || fail "honest: step 4 not synced: $(ls "$dir/honest"; tail -5 "$dir/honest.log")"
  echo "ok   honest: 2 rounds synced"
fi

# case steps want
while read -r case steps want; do
  [ -n "$case" ] && selected "$case" || continue
  refused "$case" "$steps" "$want"
done <<'EOF'
nan               2  from server .*: tensor model\.embed_tokens\.weight is nan at flat index 0
huge_value        2  from server .*: tensor model\.embed_tokens\.weight is 1e\+30 at flat index 0
wrong_shape       2  tensor model\.embed_tokens\.weight has the wrong shape
wrong_dtype       2  tensor model\.embed_tokens\.weight has dtype I32
missing_tensor    2  has [0-9]+ tensors, the model [0-9]+
extra_tensor      2  has [0-9]+ tensors, the model [0-9]+
huge_total        2  total_bytes 1099511627776
many_chunks       2  total_chunks 2147483647
overrun           2  chunk [0-9]+ of step 2's aggregate is inconsistent
truncated         2  came to [0-9]+ bytes, [0-9]+ announced
other_step        2  asked for the aggregate of step 2, it sent the aggregate of step 12 \(its spes_step\)
hello_chunk_tiny  2  total_chunks 37 for [0-9]+ bytes; the chunk_size its Hello stated makes [0-9]+
hello_fingerprint 0  Hello answers model fingerprint [0-9a-f]+, but this peer's model is
silent            0  Hello failed \(UNAVAILABLE\)
error_hello       0  Hello failed \(INTERNAL\)
error_upload      2  UploadChunk failed \(INTERNAL\)
error_wait        2  WaitAggregate failed \(INTERNAL\)
error_download    2  DownloadChunk failed \(INTERNAL\)
unavailable_wait  2  WaitAggregate failed \(UNAVAILABLE\)
deadline_upload   2  UploadChunk failed \(DEADLINE_EXCEEDED\) after 0 s, before this peer's deadline of 96 s: the server ended the call \(it said: no progress within the idle timeout\), having seen no progress from this peer
EOF

# A server that takes a call and never answers: the call is given up at the deadline for its size
# (src/sync/call_deadline.h), not after the 30-minute cap, and not before the 60 s floor either. A
# DownloadChunk: 60 s + the chunk's 64 KiB x 4 calls in flight at 64 KiB/s = 64 s. An upload
# stream the server reads whole and never answers: 60 s + its ~2.4 MB at 64 KiB/s (~96 s). An upload
# stream the server stops reading after its first message (its HTTP/2 window kept small, so the
# peer cannot hand the rest to the transport): the timer of one message, 60 s + two 64 KiB messages
# at 64 KiB/s = 62 s, ends it before the stream's 96 s.
while read -r case want; do
  [ -n "$case" ] && selected "$case" || continue
  refused_min=60 refused_max=110
  refused "$case" 2 "$want"
  refused_min=0 refused_max=40
done <<'EOF'
stall_download  DownloadChunk failed \(DEADLINE_EXCEEDED\): no answer within its deadline of 64 s \(60 s \+ 65536 bytes x 4 at 64 KiB/s\)
stall_upload    UploadChunk failed \(DEADLINE_EXCEEDED\): no answer within its deadline of [0-9]+ s \(60 s \+ [0-9]+ bytes x 1 at 64 KiB/s\)
stall_upload_read  UploadChunk \(one message of the stream\) failed \(DEADLINE_EXCEEDED\): no answer within its deadline of 62 s \(60 s \+ 65536 bytes x 2 at 64 KiB/s\)
EOF

# int8 runs: round 2 goes whole (no base yet), round 4 as an int8 delta against step 2.
while read -r case want; do
  [ -n "$case" ] && selected "$case" || continue
  refused "$case" 4 "$want" --spes_config.payload_dtype=int8
done <<'EOF'
int8_nan_scale    scale is NaN
int8_huge_scale   reconstruction .* not within
int8_wrong_len    must be I8 with the model's shape
int8_wrong_base   delta is against base step 10[0-9] .*, but this peer holds the aggregate of step 2
EOF

# What a refused aggregate left is resumable: the peer refused the NaN one resumes against an
# honest server, redoes the sync of step 2 and trains on, synced.
if selected nan; then
  hostile honest
  peer "$dir/nan" "$dir/nan.resume.log" 4 --resume
  [ $rc -eq 0 ] || fail "resume after nan: exit $rc: $(tail -5 "$dir/nan.resume.log")"
  grep -q "redoing the sync of step 2" "$dir/nan.resume.log" || fail "resume after nan: step 2 not redone"
  ! grep -q '"synced": *false' "$dir/nan/step4/train_state.json" || fail "resume after nan: step 4 not synced"
  echo "ok   nan: resumed against an honest server, step 2 synced again, step 4 synced"
fi
