#!/usr/bin/env bash
# Overlapped sync end to end (spes_config.sync_overlap: true, docs/communication.md): a parameter
# server and 4 `spes train` peers, sync every 2 steps for 10 steps (merging on steps 4 and 8),
# once in F32, once with int8 and once with int4 payloads. Checked:
#  - every overlapped round (steps 2..8) is applied after its upload step and at the latest at the
#    next sync step, and the peer's weights after applying are exactly
#    aggregate + (trained - uploaded) in float32, recomputed with numpy from the peer's own audit
#    logs (weights at the upload, the aggregate, weights before and after applying);
#  - the last round (step 10, a checkpoint step) is blocking: all 4 peers end byte-identical,
#    equal to the aggregate.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv
dir0=$dir

reliability_data

for payload in f32 int8 int4; do
  echo "== payload $payload"
  dir="$dir0/$payload"
  mkdir -p "$dir"
  cp "$dir0/file_list.txt" "$dir/"
  reliability_server --merge_interval 4 --merge_alpha_start 0.5 --merge_decay_steps 100 --merge_topk 2
  reliability_run_peers "$dir" 10 10 --spes_config.sync_overlap=true --spes_config.payload_dtype=$payload
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""

  peers_match_aggregate "$dir" 4 10
  for peer in 0 1 2 3; do
    for step in 2 4 6 8; do
      at=$(sed -n "s/^.*sync step $step: .*overlapped: applied at step \([0-9]*\) .*$/\1/p" "$dir/peer$peer.log")
      [ -n "$at" ] && [ "$at" -gt "$step" ] && [ "$at" -le $((step + 2)) ] ||
        { echo "peer $peer: round $step applied at step '$at', expected in ($step, $((step + 2))]"; exit 1; }
    done
    grep -q "sync step 10: .*overlapped" "$dir/peer$peer.log" && { echo "peer $peer: the last round overlapped"; exit 1; }
  done
  grep "sync step" "$dir/peer0.log" | sed 's/^.*sync step/  sync step/'
  "$SPES_VENV_PY" - "$dir/sync" <<'PY'
import sys, numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
for p in range(4):
    for step in (2, 4, 6, 8):
        down = load_file(f"{d}/down_s{step}_p{p}.safetensors")
        local = load_file(f"{d}/local_s{step}_p{p}.safetensors")
        applied = load_file(f"{d}/applied_s{step}_p{p}.safetensors")
        uploaded = load_file(f"{d}/uploaded_s{step}_p{p}.safetensors")   # the weights snapshotted at the upload
        for k in down:
            want = (down[k] + (local[k] - uploaded[k])).astype(np.float32)
            assert np.array_equal(want, applied[k]), f"peer {p} round {step}: {k} != aggregate + (trained - uploaded)"
    print(f"peer {p}: every overlapped round applied as aggregate + (trained - uploaded)")
PY
done
echo "sync overlap e2e: all checks passed"
