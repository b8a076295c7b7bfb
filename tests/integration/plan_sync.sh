#!/usr/bin/env bash
# `spes plan`'s sync bytes against a real parameter server's counters (docs/plan.md): 4 `spes
# train` peers of configs/tiny_shakespeare.yaml (1 expert each of 4, sync every 2 steps, 6 steps:
# 3 rounds, no expert merging) in bf16, int8 and int4. The server's closing line ("N bytes in,
# M bytes out": every upload it took and every download it served) must equal the plan's
# run_bytes_in / run_bytes_out for 3 rounds exactly in bf16 and int8 (round 1 of a delta run goes
# in F32 both ways, later rounds as deltas without the peer's own experts); in int4 the plan is
# an upper bound (each zstd frame at its worst case) that the real bytes stay under, the codes of
# real deltas compressing (within 60% of the bound: the plan is not a loose bound either). Then
# int8 again with expert replicas (a 2-expert model: every expert owned by 2 of the 4 peers, whose
# downloads then carry their own experts too), exact as well.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin

reliability_data

for case in bf16 int8 int4 int8-replicas; do
  dtype=${case%%-*} extra=()
  [ "$case" = int8-replicas ] && extra=(--model.moe_num_experts=2)
  reliability_server
  reliability_wait_log "listening on" "$dir/server.log"
  pids=()
  for peer in 0 1 2 3; do
    reliability_peer $peer "$port" 6 "$dir/$case/peer$peer" "$dir/$case.peer$peer.log" 6 --spes_config.payload_dtype=$dtype \
      "${extra[@]}"
    pids+=("$last_pid")
  done
  for i in 0 1 2 3; do wait "${pids[$i]}" || { echo "FAIL: $case peer $i:"; tail -20 "$dir/$case.peer$i.log"; exit 1; }; done
  kill -INT "$server_pid"
  wait "$server_pid" || true
  server_pid=""
  line=$(grep "spes server: stopped after" "$dir/server.log") || { echo "FAIL: no closing line"; tail "$dir/server.log"; exit 1; }
  # The plan for the same config and overrides as peer 0 (every peer's bytes are summed).
  "$SPES" plan configs/tiny_shakespeare.yaml --data.paths="[$dir/file_list.txt]" --using_spes=true \
    --spes_config.num_peers=4 --spes_config.peer_id=0 --spes_config.num_train_experts_per_node=1 \
    --spes_config.sync_steps=2 --max_duration=6 --spes_config.payload_dtype=$dtype --rounds 3 --json "${extra[@]}" \
    >"$dir/plan_$case.json" 2>/dev/null
  python3 - "$dtype" "$line" "$dir/plan_$case.json" "$case" <<'PY'
import json, re, sys
dtype, line, path, case = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
m = re.search(r"stopped after (\d+) rounds .* (\d+) bytes in, (\d+) bytes out", line)
rounds, got_in, got_out = int(m.group(1)), int(m.group(2)), int(m.group(3))
plan = json.load(open(path))["sync"][dtype]
want_in, want_out = plan["run_bytes_in"], plan["run_bytes_out"]
print(f"{case}: server {rounds} rounds, in {got_in} out {got_out}; planned in {want_in} out {want_out}"
      f" ({got_in / want_in:.4f}, {got_out / want_out:.4f})")
if rounds != 3:
    sys.exit(f"FAIL: {dtype}: {rounds} rounds, expected 3")
if dtype == "int4":
    # round 1 goes in F32 (exact); the delta rounds are bounded
    if not (got_in <= want_in and got_out <= want_out and got_in >= 0.6 * want_in and got_out >= 0.6 * want_out):
        sys.exit(f"FAIL: int4: the server's bytes are not within [0.6, 1] of the plan's bound")
elif (got_in, got_out) != (want_in, want_out):
    sys.exit(f"FAIL: {dtype}: the server counted {got_in} / {got_out} bytes, the plan says {want_in} / {want_out}")
PY
done
