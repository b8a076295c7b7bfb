#!/usr/bin/env bash
# tests/run_all.sh runs the unit programs the build defines ($BUILD/tests.list) and no other:
# in a fake build dir, a stale program left in tests/ (a deleted test's) is named and not run, a
# listed one runs, and a listed program that was not built fails; without tests.list it refuses.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $1"; cat "$tmp/out" 2>/dev/null | tail -30; exit 1; }

mkdir -p "$tmp/build/tests"
cat >"$tmp/build/tests/test_zz_listed" <<'EOF'
#!/usr/bin/env bash
echo "[  PASSED  ] 1 test(s)."
EOF
cat >"$tmp/build/tests/test_zz_stale" <<'EOF'
#!/usr/bin/env bash
echo "the stale program ran"
exit 1
EOF
chmod +x "$tmp/build/tests/test_zz_listed" "$tmp/build/tests/test_zz_stale"
printf '%s\n' test_zz_listed >"$tmp/build/tests.list"

# The regex selects only these fake programs (no integration script, so no recursion).
SPES_TEST_ONLY='^test_zz_' bash tests/run_all.sh "$tmp/build" >"$tmp/out" 2>&1 || fail "run_all failed"
grep -q "^ok   test_zz_listed (1 passed" "$tmp/out" || fail "the listed program did not run"
grep -q "the stale program ran\|test_zz_stale (" "$tmp/out" && fail "the stale program ran"
grep -q "^stale test_zz_stale:" "$tmp/out" || fail "the stale program is not named"
grep -q "^1 passed, 0 failed, 0 skipped$" "$tmp/out" || fail "wrong counts"

printf '%s\n' test_zz_listed test_zz_unbuilt >"$tmp/build/tests.list"
SPES_TEST_ONLY='^test_zz_' bash tests/run_all.sh "$tmp/build" >"$tmp/out" 2>&1 && fail "a listed program that was not built passed"
grep -q "^FAIL test_zz_unbuilt: .* was not built" "$tmp/out" || fail "the unbuilt program is not named"

rm "$tmp/build/tests.list"
bash tests/run_all.sh "$tmp/build" >"$tmp/out" 2>&1 && fail "ran without tests.list"
grep -q "tests.list is missing: build first" "$tmp/out" || fail "no message without tests.list"
echo "run_all: only the listed programs run; a stale one is named, an unbuilt one fails"
