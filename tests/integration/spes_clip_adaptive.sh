#!/usr/bin/env bash
# max_grad_norm_ratio on SPES peers (a server and 4 `spes train` peers on 127.0.0.1, each
# training the shared tensors and 1 of 4 experts per layer, syncing every 2 steps): adaptive
# clipping covers the trainable tensors only (the frozen experts have no gradient), so each
# peer's checkpoint holds a grad_norm_exp_avg for exactly its trainable tensors; after every
# sync the peers hold the same weights; a peer stopped after step 4 resumes to the same step-6
# checkpoint (its averages restored) as when it ran straight through. A peer's averages are its
# own (of its gradients; never synced), as the rest of its optimizer state.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv
reliability_data
reliability_server
reliability_run_peers "$dir" 6 2 --max_grad_norm_ratio=1.05
peers_match_aggregate "$dir" 4 2 4 6
grep -q "adaptive clipping, each tensor to 1.05" "$dir/peer0.log" || { echo "FAIL: adaptive clipping not on"; exit 1; }
"$SPES_VENV_PY" - "$dir" <<'PY'
import sys
from safetensors.numpy import load_file
d = sys.argv[1]
for peer in range(4):
    st = load_file(f"{d}/peer{peer}/step6/train_state.safetensors")
    moments = {k[len("exp_avg."):] for k in st if k.startswith("exp_avg.")}
    avgs = {k[len("grad_norm_exp_avg."):] for k in st if k.startswith("grad_norm_exp_avg.")}
    assert moments and avgs == moments, (peer, sorted(moments ^ avgs)[:5])
    experts = {k.split(".experts.")[1].split(".")[0] for k in avgs if ".experts." in k}
    assert experts == {str(peer)}, (peer, experts)   # its own expert only
    assert all(float(st["grad_norm_exp_avg." + k][0]) > 0 for k in avgs)
print(f"each peer's averages cover exactly its {len(avgs)} trainable tensors (shared + own expert)")
PY
# The job again, stopped after step 4 and resumed on a new server: the same step-6 checkpoints.
stop_server() { kill "$server_pid"; wait "$server_pid" || true; server_pid=""; }
stop_server
run2="$dir/again"
reliability_server
RELIABILITY_PEER_ARGS="--max_grad_norm_ratio=1.05 --stop_at=4" reliability_run_peers "$run2" 6 2
[ -d "$run2/peer0/step4" ] && [ ! -d "$run2/peer0/step6" ] || { echo "FAIL: stop_at=4 did not stop at step 4"; exit 1; }
stop_server
reliability_server
RELIABILITY_PEER_ARGS="--max_grad_norm_ratio=1.05 --resume" reliability_run_peers "$run2" 6 2
grep -q "resumed from .*step4" "$run2/peer0.log" || { echo "FAIL: peer 0 did not resume from step 4"; exit 1; }
for peer in 0 1 2 3; do
  for f in model.safetensors train_state.safetensors; do
    cmp "$dir/peer$peer/step6/$f" "$run2/peer$peer/step6/$f" ||
      { echo "FAIL: peer $peer step6/$f differs after a stop at step 4 and a resume"; exit 1; }
  done
done
echo "SPES peers with max_grad_norm_ratio: trainable tensors only, synced, resumed bit-exactly"
