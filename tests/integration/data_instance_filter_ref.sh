#!/usr/bin/env bash
# The instance filter against OLMo's own find_periodic_sequences and decision rule, run in the
# test virtualenv's ai2-olmo (tests/ref/instance_filter_ref.py writes the cases).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x "${SPES_VENV_PY:-}" ]; then
  echo "skipped: no test virtualenv (run tests/setup_venv.sh)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
"$SPES_VENV_PY" tests/ref/instance_filter_ref.py > "$tmp/cases.txt" || rc=$?
if [ "$rc" = 77 ]; then echo "skipped: ai2-olmo is not in the virtualenv (tests/setup_venv.sh)"; exit 77; fi
[ "$rc" = 0 ] || exit 1
SPES_INSTANCE_FILTER_REF="$tmp/cases.txt" "$SPES_BUILD/tests/test_data_instance_filter" 2>&1 | tee "$tmp/log"
grep -q "instance filter cases agree with OLMo" "$tmp/log"
if grep -q "FAILED" "$tmp/log"; then exit 1; fi
