#!/usr/bin/env python3
"""What SPES's collaboration buys over one peer training alone, per seed, from a results file
(bench/quality/results_1000steps.jsonl): the validation loss and held-out sums of one peer alone
(a centralised-method variant at one peer's batch, e.g. solo_lr0.7), of SPES (default: final) and of
the centralised run (main), and the fraction of the way from one peer alone to centralised that
SPES recovers: (solo - spes) / (solo - centralised) for the loss, (spes - solo) / (centralised -
solo) for the sums. Mean, standard error (sd / sqrt(n)) over seeds. Python standard library only.

usage: solo.py RESULTS.jsonl SOLO_VARIANT [SPES_VARIANT (default final)]
"""
import math
import statistics
import sys

sys.dont_write_bytecode = True   # no __pycache__ beside the scripts
import results  # noqa: E402  (results.py beside this script: its folder is first on sys.path)


def ms(xs):
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def main():
    path, solo_v = sys.argv[1], sys.argv[2]
    spes_v = sys.argv[3] if len(sys.argv) > 3 else "final"
    runs = [r for r in results.read(path, with_loss=False) if r["corpus"] == "demo"]
    central = results.central(runs)
    spes = {r["seed"]: r for r in runs if r["method"] == "spes" and r["variant"] == spes_v}
    solo = {r["seed"]: r for r in runs if r["variant"] == solo_v}
    seeds = sorted(set(central) & set(spes) & set(solo))
    cols = {k: [] for k in ("solo_loss", "spes_loss", "central_loss", "loss_rec", "solo_sums", "spes_sums",
                            "central_sums", "sums_rec", "solo_ratio")}
    print(f"{solo_v} against {spes_v} and centralised main, seeds {seeds}")
    print("seed  solo loss  spes loss  central loss  solo/central  recovered(loss)  "
          "solo sums  spes sums  central sums  recovered(sums)")
    for s in seeds:
        lo, ls, lc = solo[s]["val_loss"], spes[s]["val_loss"], central[s]["val_loss"]
        ao, as_, ac = (100 * x[s]["arithmetic_acc"] for x in (solo, spes, central))
        lr = (lo - ls) / (lo - lc)
        ar = (as_ - ao) / (ac - ao) if ac != ao else float("nan")
        for k, v in zip(cols, (lo, ls, lc, lr, ao, as_, ac, ar, lo / lc)):
            cols[k].append(v)
        print(f"{s:4d}  {lo:.4f}     {ls:.4f}     {lc:.4f}        {lo / lc:.4f}        {100 * lr:6.1f}%         "
              f"{ao:5.1f}      {as_:5.1f}      {ac:5.1f}         {100 * ar:6.1f}%")
    for k, xs in cols.items():
        xs = [x for x in xs if not math.isnan(x)]
        m, se = ms(xs)
        scale = 100 if k.endswith("_rec") else 1
        print(f"{k:13s} mean {scale * m:.4f} se {scale * se:.4f}" + (" (%)" if scale == 100 else ""))
    gap_o = [cols["spes_sums"][i] - cols["solo_sums"][i] for i in range(len(seeds))]
    m, se = ms([cols["central_sums"][i] - cols["solo_sums"][i] for i in range(len(seeds))])
    print(f"sums: centralised - solo {m:.1f} se {se:.1f} points; spes - solo {ms(gap_o)[0]:.1f} se {ms(gap_o)[1]:.1f} points")
    m, se = ms([cols["solo_loss"][i] - cols["spes_loss"][i] for i in range(len(seeds))])
    print(f"loss: solo - spes {m:.4f} se {se:.4f}")
    # ratio of means (less noisy than the mean of per-seed ratios when a seed's denominator is small)
    f = lambda a, b, c: (statistics.fmean(a) - statistics.fmean(b)) / (statistics.fmean(a) - statistics.fmean(c))
    print(f"recovered, from the means: loss {100 * f(cols['solo_loss'], cols['spes_loss'], cols['central_loss']):.1f}%, "
          f"sums {100 * f(cols['solo_sums'], cols['spes_sums'], cols['central_sums']):.1f}%")


if __name__ == "__main__":
    main()
