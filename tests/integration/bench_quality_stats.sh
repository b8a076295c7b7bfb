#!/usr/bin/env bash
# The figures docs/quality.md quotes from bench/quality's statistics scripts, on a synthetic
# results file whose answers are known by construction:
#  - seeds.py: the per-seed loss ratio's mean, the held-out sums gap, and the goal's verdict;
#  - sums_vs_loss.py: settings whose sums gap is exactly 10 points per 1% of loss gap give the
#    slope 10.00 with zero residuals; beside them a setting 6 points worse than that line sits
#    above the fitted line and they below it; too few paired runs are refused;
#  - efficiency.py: the centralised tokens to a row's loss, interpolated in log(tokens);
#  - results.py, through which they read the files and pair a row with its seed's centralised
#    `main` run: also on its own, for what the files above do not hold;
#  - report.py --main: a stored experiment reported as the SPES row, with its verdict.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Seeds 0-5. Centralised: loss 0.3, sums 80%. "online" (on the line): loss gap 1, 2, 3, 1, 2, 3 %
# and a sums gap of 10 points per 1%. "worse": loss gap 2% on every seed, sums gap 26 (+6).
python3 - "$dir/results.jsonl" <<'PY'
import json, sys
rows = [{"meta": {"steps": 1000}}]
for s in range(6):
    rows.append({"corpus": "demo", "method": "centralised", "variant": "main", "seed": s, "steps": 1000,
                 "val_loss": 0.3, "arithmetic_acc": 0.80})
    g = [1, 2, 3, 1, 2, 3][s]
    rows.append({"corpus": "demo", "method": "spes", "variant": "online", "seed": s, "steps": 1000,
                 "val_loss": 0.3 * (1 + g / 100), "arithmetic_acc": 0.80 - 0.10 * g})
    rows.append({"corpus": "demo", "method": "spes", "variant": "worse", "seed": s, "steps": 1000,
                 "val_loss": 0.3 * 1.02 + 1e-4 * s, "arithmetic_acc": 0.80 - 0.26 - 0.001 * s})
with open(sys.argv[1], "w") as f:
    f.write("\n".join(json.dumps(r) for r in rows) + "\n")
PY

python3 bench/quality/seeds.py "$dir/results.jsonl" online >"$dir/seeds"
grep -q "^online / centralised *mean 1.0200 " "$dir/seeds" || { cat "$dir/seeds"; echo "seeds.py: mean ratio not 1.0200"; exit 1; }
grep -q "^sums gap (centralised - run), pts *mean 20.0 " "$dir/seeds" || { cat "$dir/seeds"; echo "seeds.py: sums gap not 20.0"; exit 1; }
grep -q "goal sums gap <= 10 points: not met" "$dir/seeds" || { cat "$dir/seeds"; echo "seeds.py: sums verdict"; exit 1; }

# A corpus without held-out sums (Tiny Shakespeare): the loss criterion only, no traceback.
python3 - "$dir/results.jsonl" "$dir/nosums.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    r.pop("arithmetic_acc", None)
open(sys.argv[2], "w").write("\n".join(json.dumps(r) for r in rows) + "\n")
PY
python3 bench/quality/seeds.py "$dir/nosums.jsonl" online >"$dir/nosums" 2>&1 || { cat "$dir/nosums"; echo "seeds.py failed without sums"; exit 1; }
grep -q "(no held-out sums on this corpus)" "$dir/nosums" || { cat "$dir/nosums"; echo "seeds.py: no-sums line"; exit 1; }

# Only the on-the-line setting: slope exactly 10, residual 0, 10 points at a loss gap of 1.00%.
grep -v '"worse"' "$dir/results.jsonl" >"$dir/online.jsonl"
python3 bench/quality/sums_vs_loss.py "$dir/online.jsonl" >"$dir/line"
grep -q "^6 runs of 1 settings" "$dir/line" || { cat "$dir/line"; echo "sums_vs_loss: run count"; exit 1; }
grep -q "^sums gap = 10.00 ± 0.00 points per 1% of loss gap; correlation 1.000" "$dir/line" ||
  { cat "$dir/line"; echo "sums_vs_loss: slope not 10"; exit 1; }
grep -Eq "^online +6 +2.00 +20.0 +\+0.0 ± 0.0 +-1.000" "$dir/line" || { cat "$dir/line"; echo "sums_vs_loss: online row"; exit 1; }
grep -q "reaches a sums gap of 10 points at a loss gap of 1.00%" "$dir/line" || { cat "$dir/line"; echo "sums_vs_loss: threshold"; exit 1; }

# Both settings: "worse" sits above the fitted line, "online" below it (the fit takes some of
# worse's excess), by the fit's own arithmetic: slope = sum(xy) / sum(xx).
python3 bench/quality/sums_vs_loss.py "$dir/results.jsonl" >"$dir/both"
python3 - "$dir/both" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
xs = [1, 2, 3, 1, 2, 3] + [2.0 + 1e-4 * s / 0.3 * 100 for s in range(6)]
ys = [10 * x for x in xs[:6]] + [26 + 0.1 * s for s in range(6)]
slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
got = float(re.search(r"sums gap = ([0-9.]+) ±", text).group(1))
assert abs(got - slope) < 0.006, (got, slope, text)
worse = float(re.search(r"^worse .* ([+-][0-9.]+) ±", text, re.M).group(1))
online = float(re.search(r"^online .* ([+-][0-9.]+) ±", text, re.M).group(1))
assert worse > 2 and online < 0, text
PY

# Fewer than 3 paired runs: a clear refusal, not a traceback.
head -3 "$dir/online.jsonl" >"$dir/short.jsonl"
if python3 bench/quality/sums_vs_loss.py "$dir/short.jsonl" >"$dir/short" 2>&1; then
  echo "sums_vs_loss accepted 1 paired run"; exit 1
fi
grep -q "need 3" "$dir/short" || { cat "$dir/short"; echo "sums_vs_loss: no reason given"; exit 1; }
# efficiency.py: centralised runs of 1M, 2M and 4M tokens at losses 0.4, 0.3, 0.2 (0.1 a doubling),
# so a loss of 0.3 is 2M centralised tokens and 0.25 is 2^1.5 M. Rows: "half" (0.3 at 4M tokens:
# efficiency 0.5, 2x the tokens), "better" (0.25 at 2M: 1.414), "short" (0.45: below the range).
python3 - "$dir/eff.jsonl" <<'PY'
import json, sys
rows = []
for s in range(2):
    for t, l in ((1e6, 0.4), (2e6, 0.3), (4e6, 0.2)):
        rows.append({"corpus": "demo", "method": "centralised", "variant": "main", "seed": s, "tokens": t, "val_loss": l})
    rows.append({"corpus": "demo", "method": "spes", "variant": "half", "seed": s, "tokens": 4e6, "val_loss": 0.3})
    rows.append({"corpus": "demo", "method": "spes", "variant": "better", "seed": s, "tokens": 2e6, "val_loss": 0.25})
    rows.append({"corpus": "demo", "method": "spes", "variant": "short", "seed": s, "tokens": 1e6, "val_loss": 0.45})
with open(sys.argv[1], "w") as f:
    f.write("\n".join(json.dumps(r) for r in rows) + "\n")
PY
python3 bench/quality/efficiency.py "$dir/eff.jsonl" >"$dir/eff"
grep -Eq "^half +spes +4.00M +2 +0.500 ± 0.000 +2.00 " "$dir/eff" || { cat "$dir/eff"; echo "efficiency: half"; exit 1; }
grep -Eq "^better +spes +2.00M +2 +1.414 ± 0.000 +0.71 " "$dir/eff" || { cat "$dir/eff"; echo "efficiency: better"; exit 1; }
grep -Eq "^short +spes +1.00M +2 +< \(bounds\)" "$dir/eff" || { cat "$dir/eff"; echo "efficiency: bound"; exit 1; }

# results.py: the meta line, a blank line and a row without a loss left out (that row kept with
# with_loss=False), several files read one after the other, and of a seed's two centralised
# main runs the last one read.
printf '%s\n' '{"meta": {"steps": 1000}}' \
  '{"corpus": "demo", "method": "centralised", "variant": "main", "seed": 0, "val_loss": 0.5}' '' \
  '{"corpus": "demo", "method": "spes", "variant": "main", "seed": 0, "val_loss": 0.6}' \
  '{"corpus": "demo", "method": "spes", "variant": "failed", "seed": 0}' \
  '{"corpus": "demo", "method": "centralised", "variant": "main", "seed": 0, "val_loss": 0.4}' >"$dir/dup.jsonl"
python3 - "$dir/dup.jsonl" <<'PY'
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, "bench/quality")
import results
p = sys.argv[1]
rows = results.read(p)
assert [r["val_loss"] for r in rows] == [0.5, 0.6, 0.4], rows
assert len(results.read([p, p])) == 6 and len(results.read(p, with_loss=False)) == 4
assert results.central(rows)[0]["val_loss"] == 0.4 and results.central(rows, "spes")[0]["val_loss"] == 0.6
assert [results.is_central(r) for r in rows] == [True, False, True]
PY
# report.py --main: a stored SPES experiment reported as the SPES row (it became the defaults),
# the file's SPES main runs as `former_main`. Seeds 0-1: centralised 0.3 and 90% sums, SPES main
# 1.05x and 70%, "newdef" 1.01x and 85%: the verdict flips from no to yes.
python3 - "$dir/report.jsonl" <<'PY'
import json, sys
rows = [{"meta": {"steps": 10, "tokens": 1000, "peers": 4, "batch": 2, "seq": 8, "seeds": 2, "sync_steps": 5,
                  "merge": {"alpha": 0.3, "topk": 4}, "outer_measured": True}}]
for s in range(2):
    for method, variant, loss, sums in (("centralised", "main", 0.3, 0.9), ("spes", "main", 0.3 * 1.05, 0.7),
                                        ("spes", "newdef", 0.3 * 1.01, 0.85)):
        rows.append({"corpus": "demo", "method": method, "variant": variant, "seed": s, "val_loss": loss,
                     "recall_acc": 1.0, "arithmetic_acc": sums, "curve": [[500, loss + 0.1], [1000, loss]],
                     "train_seconds": 1.0})
with open(sys.argv[1], "w") as f:
    f.write("\n".join(json.dumps(r) for r in rows) + "\n")
PY
report() { python3 bench/quality/report.py "$dir/report.jsonl" --md "$dir/r.md" --svg "$dir/r.svg" "$@" | tail -1; }
[[ $(report) =~ demo_spes_ratio=1.0500\ .*demo_spes_sums=70.0\ .*\ met=no$ ]] || { report; echo "report: main row"; exit 1; }
[[ $(report --main newdef) =~ demo_spes_ratio=1.0100\ .*demo_spes_sums=85.0\ .*\ met=yes$ ]] ||
  { report --main newdef; echo "report --main: the variant is not the SPES row"; exit 1; }
grep -q "^| SPES (4 peers), the defaults these runs were made with" "$dir/r.md" || { cat "$dir/r.md"; echo "report --main: no former_main row"; exit 1; }
if report --main nosuch >"$dir/nosuch" 2>&1; then echo "report --main accepted a missing variant"; exit 1; fi
grep -q "no SPES runs of variant 'nosuch'" "$dir/nosuch" || { cat "$dir/nosuch"; echo "report --main: no reason"; exit 1; }
echo "bench-quality statistics: seeds.py, sums_vs_loss.py, efficiency.py, results.py and report.py --main give the constructed answers"
