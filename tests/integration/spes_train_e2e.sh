#!/usr/bin/env bash
# SPES end to end with the real trainer: a parameter server and 4 `spes train` peer
# processes on 127.0.0.1, each owning 1 of 4 experts per layer, 3 sync rounds (steps 2, 4, 6,
# expert merging on step 4). Checked independently of the code under test:
#  - after every sync all peers hold byte-identical weights (their checkpoints of that step);
#  - shared tensors are the mean of the uploads, experts their owners' uploads (merged on
#    merge steps), recomputed with numpy from the peers' audit logs (SPES_SYNC_LOG_DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv

reliability_data

reliability_server --merge_interval 4 --merge_alpha_start 0.5 --merge_decay_steps 100 --merge_topk 2

reliability_run_peers "$dir" 6 2   # 6 steps, save every 2

peers_match_aggregate "$dir" 4 2 4 6
grep -q "sync step 6" "$dir/peer0.log" || { echo "peer 0 never reported sync step 6"; exit 1; }
# Download only what changed: on steps without merging a peer's own experts stay out of its
# download (its audit log holds the aggregate it completed itself, checked byte for byte below);
# on the merge step (4) they changed and come down.
down_mb() { sed -n "s/^.*sync step $1: .* down \([0-9.]*\) MB.*$/\1/p" "$dir/peer0.log"; }
echo "peer 0 downloads: step 2 $(down_mb 2) MB, step 4 (merge) $(down_mb 4) MB"
awk -v a="$(down_mb 2)" -v b="$(down_mb 4)" 'BEGIN { exit !(a > 0 && a < b) }' ||
  { echo "step 2's download should leave out peer 0's own experts (smaller than step 4's)"; exit 1; }
# Mean / ownership / merge maths from the audit logs (4 peers, 1 expert each, merge every 4, alpha 0.5, top-2).
"$SPES_VENV_PY" tests/ref/check_sync_e2e.py "$dir/sync" 4 1 4 0.5 100 2 2 4 6
