#!/usr/bin/env bash
# `make bench-quality` at toy size (bench/quality/run.sh --smoke: 6 steps, both corpora, the
# three methods on 2 seeds, every ablation on seed 0). Checks, independently of the report
# code, that every run is there with the same token budget and sane scores, that the peers
# really synced (and fedavg really ran as fedavg), that the report's ratios are the per-seed
# ratios recomputed from the results, and that the SVG is well-formed: per corpus one loss
# curve per method and one ratio curve each for SPES and fedavg, inside the drawing.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPES=${SPES_BIN:-$PWD/build/spes}
DATA=${SPES_TEST_DATA:-$PWD/../shared/data}
[ -x "$SPES" ] || { echo "SKIPPED: no $SPES (build first)"; exit 77; }
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt (set SPES_TEST_DATA)"; exit 77; }
# 20 short trainings of up to 5 processes each: minutes under ASan, and the same server, peer
# and eval code runs under ASan in demo_smoke.sh and spes_train_e2e.sh.
if [ -n "${SPES_ASAN:-}" ]; then echo "SKIPPED under ASan: a benchmark of 20 trainings (demo_smoke covers the code)"; exit 77; fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
QUALITY_OUT="$out/q" SPES_BIN="$SPES" SPES_TEST_DATA="$DATA" bash bench/quality/run.sh --smoke >"$out/log" 2>&1 ||
  { tail -40 "$out/log"; exit 1; }
echo "bench-quality --smoke took $(( $(date +%s) - start ))s"
tail -1 "$out/log"
grep -q "^bench-quality: demo_spes_ratio=" "$out/log" || { echo "no final line"; exit 1; }
# A verdict per corpus, and met= is yes only when every corpus's is.
last=$(tail -1 "$out/log")
[[ $last =~ demo_met=(yes|no).*shakespeare_met=(yes|no).*\ met=(yes|no)$ ]] || { echo "no verdict per corpus: $last"; exit 1; }
want=$([ "${BASH_REMATCH[1]}${BASH_REMATCH[2]}" = yesyes ] && echo yes || echo no)
[ "${BASH_REMATCH[3]}" = "$want" ] || { echo "met=${BASH_REMATCH[3]} with demo ${BASH_REMATCH[1]}, shakespeare ${BASH_REMATCH[2]}"; exit 1; }
# Every peer of a SPES run took part in the last sync; the fedavg server ran in fedavg mode.
for p in 0 1 2 3; do
  grep -q "sync step 6" "$out/q/runs/demo_spes_main_s0/peer$p.log" || { echo "peer $p never synced step 6"; exit 1; }
done
grep -q "mode fedavg" "$out/q/runs/shakespeare_fedavg_main_s1/server.log" || { echo "fedavg server not in fedavg mode"; exit 1; }

python3 - "$out/q" "$out/log" <<'EOF'
import json, math, re, statistics, sys
import xml.etree.ElementTree as ET
d, logf = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in open(f"{d}/results.jsonl")]
meta = lines[0]["meta"]
runs = lines[1:]
budget = meta["steps"] * meta["peers"] * meta["batch"] * meta["seq"]
assert meta["tokens"] == budget == 6 * 4 * 2 * 128, meta
main = {("centralised", "main"), ("spes", "main"), ("fedavg", "main")}
ablations = {("spes", "no_merge"), ("spes", "no_decayed_aux"), ("spes", "sync2"), ("spes", "sync6"),
             ("spes", "lr_scale1"), ("spes", "beta1_central"), ("spes", "before28"), ("spes", "rotate_experts")}
if meta["outer_measured"]:                                   # spes server takes --outer_lr
    ablations.add(("spes", "outer_nesterov"))
for corpus in ("demo", "shakespeare"):
    for seed, want in ((0, main | ablations), (1, main)):
        got = {(r["method"], r["variant"]) for r in runs if r["corpus"] == corpus and r["seed"] == seed}
        assert got == want, (corpus, seed, got ^ want)
for r in runs:
    assert r["tokens"] == budget, r                         # equal token budget for every method
    assert 0 < r["val_loss"] < math.log(257) + 1, r         # a finite loss near or below uniform bytes
    assert r["val_tokens"] > 1000, r
    if r["corpus"] == "demo":
        for q in ("recall_acc", "arithmetic_acc"):
            assert 0 <= r[q] <= 1, r
    else:
        assert "recall_acc" not in r, r
    # Every run with peers counted its sync traffic from their logs: the rounds its schedule has.
    if r["method"] == "centralised":
        assert "bytes_per_peer" not in r, r
    else:
        k = r["sync_steps"]
        assert r["rounds"] == meta["steps"] // k and r["bytes_per_peer"] > 0, r
    # The main runs logged a validation curve ending at the full budget.
    if r["variant"] == "main":
        assert len(r["curve"]) >= 2 and r["curve"][-1][0] == budget, r["curve"]
# Settings change the outcome (the runs are real): a different sync interval, a different loss.
def val(corpus, method, variant, seed):
    return next(r["val_loss"] for r in runs if (r["corpus"], r["method"], r["variant"], r["seed"]) ==
                (corpus, method, variant, seed))
assert val("demo", "spes", "sync2", 0) != val("demo", "spes", "main", 0)
assert val("demo", "spes", "main", 0) != val("demo", "centralised", "main", 0)
assert val("demo", "spes", "main", 0) != val("demo", "spes", "main", 1)

# The final line's ratios: the mean over seeds of (method / same seed's centralised).
final = dict(kv.split("=", 1) for kv in open(logf).read().strip().splitlines()[-1].split()[1:])
for corpus in ("demo", "shakespeare"):
    for method in ("spes", "fedavg"):
        ratios = [val(corpus, method, "main", s) / val(corpus, "centralised", "main", s) for s in (0, 1)]
        got = float(final[f"{corpus}_{method}_ratio"])
        assert abs(got - statistics.fmean(ratios)) < 6e-5, (corpus, method, got, ratios)
    central = statistics.fmean(val(corpus, "centralised", "main", s) for s in (0, 1))
    assert f"{central:.4f}" in open(f"{d}/quality.md").read(), corpus
assert final["met"] in ("yes", "no")

# The SVG: well-formed, one mean curve per method and corpus, every point inside the drawing.
root = ET.parse(f"{d}/quality.svg").getroot()
ns = "{http://www.w3.org/2000/svg}"
w, h = float(root.get("width")), float(root.get("height"))
paths = [p for p in root.iter(ns + "path") if p.get("class") == "mean"]
assert sorted(p.get("data-method") for p in paths) == sorted(["centralised", "spes", "fedavg"] * 2), paths
ratios = [p for p in root.iter(ns + "path") if p.get("class") == "ratio"]
assert sorted(p.get("data-method") for p in ratios) == sorted(["spes", "fedavg"] * 2), ratios
for p in paths + ratios:
    pts = [tuple(map(float, m.split(","))) for m in re.findall(r"[ML]([-\d.]+,[-\d.]+)", p.get("d"))]
    assert len(pts) >= 2, p.get("d")
    assert all(0 <= x <= w and 0 <= y <= h for x, y in pts), pts
    assert all(a[0] < b[0] for a, b in zip(pts, pts[1:])), "tokens must increase along a curve"
print(f"bench-quality smoke: {len(runs)} runs, report and SVG consistent")
EOF
