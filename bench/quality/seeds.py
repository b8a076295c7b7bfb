#!/usr/bin/env python3
"""Seed statistics of one SPES row against the centralised runs of the same seeds, from a
results file (bench/quality/results_1000steps.jsonl or collect.py's output): per seed the loss
ratio (run / the same seed's centralised run) and both models' held-out sums, then the mean of
each over seeds with its standard deviation, its standard error (sd / sqrt(n)) and a 95% interval
(Student t, n-1 degrees of freedom), and what issue #28's goal (ratio <= 1.02, held-out sums
within 10 points of centralised) looks like against it: met (the whole interval inside the
goal), not met (the whole interval outside) or not decidable. Python standard library only.

usage: seeds.py RESULTS.jsonl [VARIANT (default final)] [--corpus demo]
"""
import math
import statistics
import sys

sys.dont_write_bytecode = True   # no __pycache__ beside the scripts
import results  # noqa: E402  (results.py beside this script: its folder is first on sys.path)

# two-sided 95% Student t quantiles, by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def summary(name, xs, fmt):
    n = len(xs)
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs) if n > 1 else float("nan")
    se = sd / math.sqrt(n)
    lo, hi = m - t95(n - 1) * se, m + t95(n - 1) * se
    print(f"{name:34s} mean {fmt(m)} sd {fmt(sd)} se {fmt(se)} 95% [{fmt(lo)}, {fmt(hi)}]  "
          f"per seed {' '.join(fmt(x) for x in xs)}")
    return m, se, lo, hi


def verdict(lo, hi, goal):
    return "met" if hi <= goal else "not met" if lo > goal else "not decidable"


def main():
    args = [x for x in sys.argv[1:]]
    corpus = "demo"
    if "--corpus" in args:
        i = args.index("--corpus")
        corpus = args[i + 1]
        del args[i:i + 2]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__.split("usage: ")[1].strip())
    path = args[0]
    variant = args[1] if len(args) > 1 else "final"
    runs = [r for r in results.read(path, with_loss=False) if r["corpus"] == corpus]
    central = results.central(runs)
    # a variant may itself be a centralised run (e.g. solo_lr0.7: one peer training alone)
    row = {r["seed"]: r for r in runs if r["variant"] == variant and not results.is_central(r)}
    seeds = sorted(s for s in row if s in central)
    if len(seeds) < 2:
        sys.exit(f"seeds.py: {variant}: {len(seeds)} seed(s) with a centralised run, need 2")
    print(f"{corpus} {variant}: seeds {','.join(map(str, seeds))} (n={len(seeds)})")
    f4 = lambda x: f"{x + 0.0:.4f}"
    f1 = lambda x: f"{round(x, 1) + 0.0:.1f}"
    ratio = [row[s]["val_loss"] / central[s]["val_loss"] for s in seeds]
    summary("centralised val loss", [central[s]["val_loss"] for s in seeds], f4)
    summary(f"{variant} val loss", [row[s]["val_loss"] for s in seeds], f4)
    _, _, rlo, rhi = summary(f"{variant} / centralised", ratio, f4)
    if any(central[s].get("arithmetic_acc") is None or row[s].get("arithmetic_acc") is None for s in seeds):
        # a corpus without the held-out sums (Tiny Shakespeare): the loss criterion only
        print(f"goal ratio <= 1.02: {verdict(rlo, rhi, 1.02)} (no held-out sums on this corpus)")
        return
    summary("centralised held-out sums %", [100 * central[s]["arithmetic_acc"] for s in seeds], f1)
    summary(f"{variant} held-out sums %", [100 * row[s]["arithmetic_acc"] for s in seeds], f1)
    _, _, glo, ghi = summary("sums gap (centralised - run), pts",
                             [100 * (central[s]["arithmetic_acc"] - row[s]["arithmetic_acc"]) for s in seeds], f1)
    print(f"goal ratio <= 1.02: {verdict(rlo, rhi, 1.02)}; goal sums gap <= 10 points: {verdict(glo, ghi, 10.0)}")


if __name__ == "__main__":
    main()
