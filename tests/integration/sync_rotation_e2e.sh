#!/usr/bin/env bash
# Expert rotation end to end (spes server --expert_rotation_steps, issue #28): a parameter server
# and 4 `spes train` peers with int8 delta payloads, 5 sync rounds (steps 2..10), experts rotating
# on steps 4 and 8. Checked:
#  - after every sync all peers hold byte-identical weights, equal to the server's aggregate;
#  - the rotated aggregates (steps 4, 8) go down whole, the others as int8 deltas without the
#    peer's own experts: a rotation never rounds a moved expert;
#  - in the aggregate of step 4, each expert slot e+1 holds what its owner of the round before
#    trained at slot e (the peers' own reconstructed uploads of step 4, from the audit logs), and
#    router row e+1 the mean router's row e: peer p now trains what peer p-1 did.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv

reliability_data

reliability_server --state_dir "$dir/state" --keep_steps 10 --expert_rotation_steps 4

reliability_run_peers "$dir" 10 2 --spes_config.payload_dtype=int8

peers_match_aggregate "$dir" 4 2 4 6 8 10
server_matches_peers "$dir" 2 4 6 8 10

view() { peer_view "$dir" "$@"; }
for peer in 0 1 2 3; do
  for step in 2 4 8; do
    [ "$(view $step $peer)" = "" ] || { echo "peer $peer step $step: expected the whole aggregate, got '$(view $step $peer)'"; exit 1; }
  done
  for step in 6 10; do
    [ "$(view $step $peer)" = "int8-delta+omit-own-experts" ] || { echo "peer $peer step $step: got '$(view $step $peer)'"; exit 1; }
  done
done
rotated=$(sed -n 's/^.*server: step \([0-9]*\): experts rotated.*$/\1/p' "$dir/server.log" | tr '\n' ' ')
[ "$rotated" = "4 8 " ] || { echo "the server rotated at steps '$rotated', expected 4 8"; exit 1; }
echo "rotated aggregates went down whole at steps 4 and 8, deltas without own experts otherwise"

"$SPES_VENV_PY" - "$dir" <<'PY'
# Step 4's aggregate against the round's inputs: each peer's upload as the server reconstructs it
# (the aggregate of step 2 + the int8 delta, in float32), experts then moved one slot on.
import re, sys, numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
prev = load_file(f"{d}/state/aggregate_s2.safetensors")
agg = load_file(f"{d}/state/aggregate_s4.safetensors")
E = P = 4
ups = []
for p in range(P):
    up = load_file(f"{d}/sync/up_s4_p{p}.safetensors")
    rec = {}
    for name, q in up.items():
        if name.endswith(".scale"): continue
        scale = up[name + ".scale"].astype(np.float32)
        n = prev[name].size
        s = np.repeat(scale, 256)[:n].reshape(prev[name].shape)
        rec[name] = (prev[name].astype(np.float32) + q.astype(np.float32) * s).astype(np.float32)
    ups.append(rec)
checked = 0
for name in agg:
    m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(.+)$", name)
    if m:
        l, e, rest = m.group(1), int(m.group(2)), m.group(3)
        src = f"model.layers.{l}.mlp.experts.{(e - 1) % E}.{rest}"
        want = ups[(e - 1) % E][src]
        assert np.array_equal(agg[name], want), f"{name}: not peer {(e - 1) % E}'s upload of {src}"
        checked += 1
    elif name.endswith("mlp.gate.weight"):
        mean = sum(u[name] for u in ups) / np.float32(P)
        assert np.array_equal(agg[name], np.roll(mean, 1, axis=0)), f"{name}: router rows not moved with their experts"
        checked += 1
layers = {n.split(".")[2] for n in agg if n.endswith("mlp.gate.weight")}
assert layers and checked == len(layers) * (3 * E + 1), (checked, layers)
print(f"step 4: {checked} expert and router tensors moved one peer on, bit for bit")
PY
echo "sync_rotation_e2e: OK"
