#!/usr/bin/env python3
"""How the held-out sums follow the validation loss, from a results file
(bench/quality/results_1000steps.jsonl or collect.py's output): is a setting's held-out-sums gap
to centralised more than its loss gap predicts?

Every run of the demo corpus at the given length is paired with the centralised `main` run of its
seed: loss gap = (run / centralised - 1) in percent, sums gap = centralised - run in points. A
line through the origin, sums gap = slope x loss gap, is fitted over every paired run of every
setting (the slope with its standard error, and the correlation); then, per setting with at least
--min_seeds runs, the mean residual (sums gap - slope x loss gap) with its standard error, and
per setting the correlation of loss and sums across its own seeds. A setting that generalises
worse than its loss (the question issue #28 asks of SPES) shows a positive residual beyond its
standard error. The last line: the loss gap at which the fitted line reaches `--sums_goal` points
(issue #28: 10). Runs of another batch (one peer alone) are left out. Python standard library only.

usage: sums_vs_loss.py RESULTS.jsonl [--steps 1000] [--min_seeds 5] [--sums_goal 10]
"""
import argparse
import collections
import math
import statistics
import sys

sys.dont_write_bytecode = True   # no __pycache__ beside the scripts
import results  # noqa: E402  (results.py beside this script: its folder is first on sys.path)


def setting(r):
    """A run's setting: its variant; a main run of SPES or fedavg as spes_main / fedavg_main."""
    return r["variant"] if r["variant"] != "main" else r["method"] + "_main"


def paired_gaps(rows, steps):
    """(variant, loss gap %, sums gap points) for every non-centralised-main run with a main run
    of its seed; the main runs' own seeds."""
    rows = [r for r in rows if r.get("corpus", "demo") == "demo"
            and r.get("steps") == steps and r.get("batch") is None and r.get("arithmetic_acc") is not None]
    main = results.central(rows)
    out = []
    for r in rows:
        if results.is_central(r) or r["seed"] not in main:
            continue
        c = main[r["seed"]]
        out.append((setting(r), (r["val_loss"] / c["val_loss"] - 1) * 100,
                    (c["arithmetic_acc"] - r["arithmetic_acc"]) * 100))
    return out, rows


def fit_through_origin(xs, ys):
    """slope, its standard error"""
    sxx = sum(x * x for x in xs)
    b = sum(x * y for x, y in zip(xs, ys)) / sxx
    ssr = sum((y - b * x) ** 2 for x, y in zip(xs, ys))
    return b, math.sqrt(ssr / (len(xs) - 1) / sxx)


def correlation(xs, ys):
    """Pearson's r as text, '-' where either side does not vary"""
    if len(xs) < 2 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return "-"
    return f"{statistics.correlation(xs, ys):.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--min_seeds", type=int, default=5)
    ap.add_argument("--sums_goal", type=float, default=10.0)
    a = ap.parse_args()
    gaps, kept = paired_gaps(results.read(a.results), a.steps)
    if len(gaps) < 3:
        raise SystemExit(f"sums_vs_loss: {len(gaps)} paired runs at {a.steps} steps in {a.results}; need 3")
    xs, ys = [g[1] for g in gaps], [g[2] for g in gaps]
    slope, se = fit_through_origin(xs, ys)
    settings = sorted({g[0] for g in gaps})
    print(f"{len(gaps)} runs of {len(settings)} settings, each paired with its seed's centralised run ({a.steps} steps)")
    print(f"sums gap = {slope:.2f} ± {se:.2f} points per 1% of loss gap; correlation {correlation(xs, ys)}")
    by_setting = collections.defaultdict(list)   # setting -> [(loss gap, sums gap)]
    for v, x, y in gaps:
        by_setting[v].append((x, y))
    print(f"{'setting':24s} {'runs':>4s} {'loss gap %':>10s} {'sums gap':>9s} {'residual ± se':>15s} {'corr (own seeds)':>16s}")
    mean_loss_gap = {v: statistics.fmean(x for x, _ in xy) for v, xy in by_setting.items()}
    for v in sorted(by_setting, key=mean_loss_gap.get):
        xy = by_setting[v]
        if len(xy) < a.min_seeds:
            continue
        rs = [y - slope * x for x, y in xy]
        own = [r for r in kept if not results.is_central(r) and setting(r) == v]
        corr = correlation([r["val_loss"] for r in own], [r["arithmetic_acc"] for r in own])
        lg, sg = mean_loss_gap[v], statistics.fmean(y for _, y in xy)
        res = f"{round(statistics.fmean(rs), 1) + 0.0:+.1f} ± {statistics.stdev(rs) / math.sqrt(len(rs)):.1f}"
        print(f"{v:24s} {len(rs):4d} {lg:10.2f} {sg:9.1f} {res:>15s} {corr:>16s}")
    print(f"the fitted line reaches a sums gap of {a.sums_goal:g} points at a loss gap of {a.sums_goal / slope:.2f}% "
          f"({a.sums_goal / (slope + 2 * se):.2f}-{a.sums_goal / (slope - 2 * se):.2f}% at the slope ± 2 se)")


if __name__ == "__main__":
    main()
