#!/usr/bin/env bash
# `make bench-quality`: training quality at an equal token budget (docs/quality.md).
#   bash bench/quality/run.sh [BUILD_DIR] [--smoke] [bench/quality/run.py options...]
# SPES (4 peers, `spes demo`'s settings: sync every 10 steps, int8 payloads, lr_scale 0.7, beta1 0.8),
# centralised training and the fedavg baseline, 3 seeds each, 2000 steps (the demo's length), on
# the demo corpus (written by `spes demo`) and Tiny Shakespeare ($SPES_TEST_DATA/tinyshakespeare.txt,
# default ../shared/data), then the ablations (expert merging off, decayed load-balancing off,
# sync_steps 5 and 25, the outer optimizer, the peers at the centralised learning rate or beta1, expert
# rotation at the merge cadence, the demo before issue #28). Writes $QUALITY_OUT (default output/bench-quality): results.jsonl (with each run's
# sync traffic per peer), quality.md (the tables), quality.svg (validation loss against tokens),
# runs/ (logs, metrics).
# Last line: "bench-quality: <corpus>_spes_ratio=... <corpus>_fedavg_ratio=... demo_spes_sums=...
# demo_central_sums=... demo_met=yes|no shakespeare_... goal=1.02 met=yes|no" (met: every corpus).
# --smoke: the same runs at toy size (6 steps, 2 seeds, ablations 1 seed), for tests/integration/bench_quality_smoke.sh.
# ~5 hours on an idle 2-core machine for the full run (peers 1 thread each, centralised 2);
# --steps 1000 --sync_steps 5 and --steps 300 give the shorter tables docs/quality.md keeps.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then BUILD=$1; shift; fi
SPES=${SPES_BIN:-$BUILD/spes}
DATA=${SPES_TEST_DATA:-../shared/data}
OUT=${QUALITY_OUT:-output/bench-quality}
[ -x "$SPES" ] || { echo "bench-quality: skipped (no $SPES; build first)"; exit 0; }
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "bench-quality: skipped (no $DATA/tinyshakespeare.txt; set SPES_TEST_DATA)"; exit 0; }
args=()
if [ "${1:-}" = "--smoke" ]; then
  shift
  args=(--seeds 2 --ablation_seeds 1 --steps 6 --batch 2 --sync_steps 3 --sync_ablation 2,3,6 --before_sync 6 --train_docs 300 --curve_points 2
        --curve_val_tokens 2048)
fi
python3 bench/quality/run.py --spes "$SPES" --data "$DATA" --out "$OUT" "${args[@]}" "$@"
python3 bench/quality/report.py "$OUT/results.jsonl" --md "$OUT/quality.md" --svg "$OUT/quality.svg"
