#!/usr/bin/env bash
# Expert replicas end to end (sync/expert_owners.h): a parameter server and 4 `spes train` peers
# of a 2-expert model, each peer owning 1 expert, so every expert has 2 owners (expert 0: peers 0
# and 2; 1: peers 1 and 3); 3 sync rounds (steps 2, 4, 6), once with f32 payloads and once with
# int8 deltas. Checked:
#  - each peer trains and uploads its group's expert (the server refuses any other);
#  - after every sync all peers hold byte-identical weights, equal to the server's aggregate;
#  - no download leaves the peer's own experts out (an expert is its owners' mean, not the upload):
#    f32 rounds come down whole, int8 rounds as deltas of every tensor;
#  - f32: the aggregate of step 4 is, bit for bit, each expert the mean of its two owners' uploads
#    and each shared tensor the mean of all four (peer order, float32).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv

reliability_data

# run_case PAYLOAD: the server and the 4 peers in $dir/PAYLOAD, checks common to both payloads.
run_case() {
  local run="$dir/$1"
  mkdir -p "$run"
  reliability_server --state_dir "$run/state" --keep_steps 10   # 4 peers x 1 expert
  mv "$dir/server.log" "$run/server.log" 2>/dev/null || true
  reliability_run_peers "$run" 6 2 --spes_config.payload_dtype="$1" --model.moe_num_experts=2
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
  grep -q "every expert has 2 owners" "$run/peer0.log" || { echo "$1: peer 0 did not state the replicas"; exit 1; }
  peers_match_aggregate "$run" 4 2 4 6
  server_matches_peers "$run" 2 4 6
}

view_is() {   # view_is RUN WANT STEP...: every peer's download view at each STEP is WANT
  local run=$1 want=$2 step peer
  shift 2
  for step in "$@"; do
    for peer in 0 1 2 3; do
      [ "$(peer_view "$run" "$step" "$peer")" = "$want" ] ||
        { echo "peer $peer step $step: view '$(peer_view "$run" "$step" "$peer")', expected '$want'"; exit 1; }
    done
  done
}

run_case f32
view_is "$dir/f32" "" 2 4 6
run_case int8
view_is "$dir/int8" "" 2
view_is "$dir/int8" "int8-delta" 4 6
echo "downloads: whole in f32 rounds, int8 deltas of every tensor after the first round"

"$SPES_VENV_PY" - "$dir/f32" <<'PY'
import re, sys, numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
agg = load_file(f"{d}/state/aggregate_s4.safetensors")
P, E = 4, 2
ups = [load_file(f"{d}/sync/up_s4_p{p}.safetensors") for p in range(P)]
experts = shared = 0
for name in agg:
    m = re.match(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.", name)
    if m:
        e = int(m.group(1))
        owners = [p for p in range(P) if p % E == e]
        for p in range(P):
            assert (name in ups[p]) == (p in owners), f"{name}: uploaded by peer {p}?"
        want = (ups[owners[0]][name] + ups[owners[1]][name]) / np.float32(2)
        assert np.array_equal(agg[name], want), f"{name}: not the mean of peers {owners}"
        experts += 1
    else:
        want = (((ups[0][name] + ups[1][name]) + ups[2][name]) + ups[3][name]) / np.float32(P)
        assert np.array_equal(agg[name], want), f"{name}: not the mean of the 4 peers"
        shared += 1
assert experts > 0 and shared > 0, (experts, shared)
print(f"step 4: {experts} expert tensors the mean of their 2 owners, {shared} shared tensors the mean of 4, bit for bit")
PY
echo "sync_replicas_e2e: OK"
