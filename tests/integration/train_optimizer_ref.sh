#!/usr/bin/env bash
# AdamW + clipping against torch.optim.AdamW / clip_grad_norm_ (tests/ref/adamw_ref.py), and
# the learning-rate schedules against OLMo's formulas evaluated in Python (tests/ref/schedule_ref.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 tests/ref/schedule_ref.py > "$tmp/schedule_cases.txt"
python3 tests/ref/schedule_ref.py loop > "$tmp/schedule_loop.txt"
SPES_SCHEDULE_REF="$tmp/schedule_cases.txt" SPES_SCHEDULE_LOOP_REF="$tmp/schedule_loop.txt" \
  "$SPES_BUILD/tests/test_train_schedule" 2>&1 | tee "$tmp/sched.log"
grep -q "schedule cases agree with Python" "$tmp/sched.log"
grep -q "scheduler.units steps agree with Python" "$tmp/sched.log"
if grep -q "FAILED" "$tmp/sched.log"; then exit 1; fi

if [ ! -x "${SPES_VENV_PY:-}" ]; then
  echo "schedules checked; AdamW part skipped: no test virtualenv (run tests/setup_venv.sh)"
  exit 77
fi
"$SPES_VENV_PY" tests/ref/adamw_ref.py "$tmp/adamw_ref.safetensors"
SPES_ADAMW_REF="$tmp/adamw_ref.safetensors" "$SPES_BUILD/tests/test_train_optimizer" 2>&1 | tee "$tmp/adamw.log"
grep -q "vs torch" "$tmp/adamw.log"
if grep -q "FAILED" "$tmp/adamw.log"; then exit 1; fi
