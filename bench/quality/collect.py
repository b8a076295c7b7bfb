#!/usr/bin/env python3
"""Merges the results.jsonl of several bench/quality/run.py output folders (an experiment per
folder, e.g. one `--variant` run each) into one results file that report.py reads, and prints
one line per (method, variant): seeds, validation loss, ratio to the same seed's centralised
run, held-out sums, recall, sync MB per peer and rounds. Runs still in progress count from
their results.jsonl.tmp. Python standard library only.

usage: collect.py OUT.jsonl DIR [DIR...]   (--md: the lines as markdown table rows)
"""
import json
import os
import statistics
import sys


def main():
    args = sys.argv[1:]
    md = "--md" in args
    args = [x for x in args if x != "--md"]
    # An option or a missing folder is a usage error, not a file name to write the results to.
    if len(args) < 2 or any(x.startswith("-") for x in args):
        sys.exit(__doc__.strip().splitlines()[-1])
    out, dirs = args[0], args[1:]
    meta, runs = None, []
    for d in dirs:
        for name in ("results.jsonl", "results.jsonl.tmp"):
            p = os.path.join(d, name)
            if not os.path.exists(p):
                continue
            with open(p) as f:
                for line in f:
                    r = json.loads(line)
                    if "meta" in r:
                        meta = meta or r
                    else:
                        runs.append(r)
            break
    # One run per (corpus, method, variant, seed): a folder rerun for other seeds may still hold
    # an earlier copy of one; the last read wins.
    runs = list({(r["corpus"], r["method"], r["variant"], r["seed"]): r for r in runs}.values())
    with open(out, "w") as f:
        f.write(json.dumps(meta) + "\n")
        for r in runs:
            f.write(json.dumps(r) + "\n")
    central = {(r["corpus"], r["seed"]): r for r in runs if r["method"] == "centralised" and r["variant"] == "main"}
    keys = []
    for r in runs:
        k = (r["corpus"], r["method"], r["variant"])
        if k not in keys:
            keys.append(k)
    for corpus, method, variant in keys:
        g = sorted((r for r in runs if (r["corpus"], r["method"], r["variant"]) == (corpus, method, variant)),
                   key=lambda r: r["seed"])
        ratios = [r["val_loss"] / central[(corpus, r["seed"])]["val_loss"] for r in g if (corpus, r["seed"]) in central]
        sums = [100 * r["arithmetic_acc"] for r in g if "arithmetic_acc" in r]
        mb = [r["bytes_per_peer"] / 1e6 for r in g if "bytes_per_peer" in r]
        if md:
            flags = " ".join(g[0].get("peer_flags", []) + g[0].get("server_flags", []))
            flags = flags.replace("--spes_config.", "").replace("--optimizer.", "")
            print(f"| {method} {variant} | {g[0].get('sync_steps') or ''} | {g[0].get('merge_interval', '')} | "
                  f"{flags} | {','.join(str(r['seed']) for r in g)} | "
                  f"{statistics.fmean(r['val_loss'] for r in g):.4f} | "
                  f"{statistics.fmean(ratios) if ratios else float('nan'):.4f} | "
                  f"{statistics.fmean(sums) if sums else float('nan'):.1f}% | "
                  f"{statistics.fmean(mb) if mb else 0:.0f} ({max((r.get('rounds', 0) for r in g), default=0)}) |")
            continue
        print(f"{corpus} {method:11s} {variant:22s} seeds {','.join(str(r['seed']) for r in g):6s} "
              f"loss {statistics.fmean(r['val_loss'] for r in g):.4f} "
              f"ratio {statistics.fmean(ratios) if ratios else float('nan'):.4f} "
              f"({' '.join(f'{x:.4f}' for x in ratios)}) "
              f"sums {statistics.fmean(sums) if sums else float('nan'):.1f}% ({' '.join(f'{x:.1f}' for x in sums)}) "
              f"MB/peer {statistics.fmean(mb) if mb else 0:.0f} rounds {max((r.get('rounds', 0) for r in g), default=0)}")


if __name__ == "__main__":
    main()
