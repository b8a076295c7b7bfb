#!/usr/bin/env python3
"""Token efficiency: how many tokens the centralised run needs to reach a run's validation loss,
against the tokens the run took, from results files holding centralised `main` runs of several
lengths (bench/quality/run.py --methods centralised --steps N; each a full run with its own
schedule) and the rows to rate.

Per seed, the centralised final losses at their token budgets form a curve; a row's loss L at
T tokens is placed on it by linear interpolation in log(tokens) between the two centralised runs
whose losses bracket L, giving t*, the centralised tokens to the same loss, and the row's token
efficiency t*/T (1: as good as centralised per token; 0.5: centralised needs half the tokens).
A loss outside the centralised runs' range is reported as a bound (< the shortest's, > the
longest's). Printed per row: the seeds, mean ± standard error of the efficiency, and its
inverse, "x tokens": how many times centralised's tokens the row needs for its loss. Python
standard library only.

usage: efficiency.py RESULTS.jsonl [MORE.jsonl ...] [--variants a,b,...] [--corpus demo]
"""
import argparse
import collections
import math
import statistics
import sys

sys.dont_write_bytecode = True   # no __pycache__ beside the scripts
import results  # noqa: E402  (results.py beside this script: its folder is first on sys.path)


def central_curves(rows):
    """seed -> [(tokens, loss)] of the centralised main runs (the full batch), by tokens"""
    curves = collections.defaultdict(dict)
    for r in rows:
        if results.is_central(r) and r.get("batch") is None:
            curves[r["seed"]][r["tokens"]] = r["val_loss"]
    return {s: sorted(c.items()) for s, c in curves.items()}


def equivalent_tokens(curve, loss):
    """(t*, bound): t* with the curve's loss equal to `loss`; bound '<' / '>' outside its range.
    The losses fall with tokens; where two runs bracket the loss, interpolate in log(tokens)."""
    if loss >= curve[0][1]:
        return curve[0][0], "<"
    if loss <= curve[-1][1]:
        return curve[-1][0], ">"
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        lo, hi = min(l0, l1), max(l0, l1)
        if lo <= loss <= hi and l0 != l1:
            f = (loss - l0) / (l1 - l0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0))), ""
    return float("nan"), "?"   # a curve that is not monotone around this loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--variants", default="", help="comma list (default: every row that is not centralised main)")
    ap.add_argument("--corpus", default="demo")
    a = ap.parse_args()
    rows = [r for r in results.read(a.results) if r.get("corpus") == a.corpus]
    curves = central_curves(rows)
    want = set(v for v in a.variants.split(",") if v)
    groups = collections.defaultdict(list)
    for r in rows:
        if results.is_central(r):
            continue
        if want and r["variant"] not in want:
            continue
        curve = curves.get(r["seed"], [])
        if len(curve) < 2:
            continue
        t, bound = equivalent_tokens(curve, r["val_loss"])
        groups[(r["variant"], r["method"], r["tokens"])].append((r["seed"], t / r["tokens"], bound))
    if not groups:
        raise SystemExit("efficiency: no row has a seed with 2 or more centralised runs of different lengths")
    print("centralised runs per seed (tokens: loss): " + "; ".join(
        f"{s}: " + ", ".join(f"{t / 1e6:.2f}M {l:.4f}" for t, l in c) for s, c in sorted(curves.items())))
    print(f"{'row':22s} {'method':11s} {'tokens':>7s} {'seeds':>5s} {'efficiency':>16s} {'x tokens':>8s}  per seed")
    for (variant, method, tokens), xs in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][0])):
        effs = [e for _, e, _ in xs]
        bounds = {b for _, _, b in xs if b}
        per = " ".join(f"{b}{e:.3f}" for _, e, b in sorted(xs))
        if bounds:   # some seed's loss is outside its centralised runs' range: no mean to give
            eff = f"{''.join(sorted(bounds))} (bounds)"
            print(f"{variant:22s} {method:11s} {tokens / 1e6:6.2f}M {len(xs):5d} {eff:>16s} {'':8s}  {per}")
            continue
        m = statistics.fmean(effs)
        se = statistics.stdev(effs) / math.sqrt(len(effs)) if len(effs) > 1 else float("nan")
        print(f"{variant:22s} {method:11s} {tokens / 1e6:6.2f}M {len(xs):5d} {m:9.3f} ± {se:.3f} {1 / m:8.2f}  {per}")


if __name__ == "__main__":
    main()
