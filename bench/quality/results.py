"""Reading bench/quality's results files and pairing their rows with the centralised run, for
seeds.py, solo.py, sums_vs_loss.py, efficiency.py and report.py. Python standard library only.

A results file (run.py's results.jsonl, collect.py's output) holds one JSON object a line: a
first {"meta": ...} line where run.py wrote one, then one row per run (corpus, method, variant,
seed, val_loss, ...). A row is compared with the centralised `main` run of its corpus and seed.
"""
import json


def read(paths, with_loss=True):
    """The rows of one results file or a list of them, in file order, without the meta line and
    blank lines. with_loss: only the rows that hold a validation loss; False keeps the others too
    (seeds.py and solo.py never skipped them: such a row stops them where it is used)."""
    rows = []
    for p in [paths] if isinstance(paths, str) else paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "meta" not in r and (not with_loss or "val_loss" in r)]


def is_central(r, method="centralised"):
    """r is `method`'s `main` run: the reference other rows are paired with (report.py also pairs
    with SPES's)"""
    return r.get("method") == method and r.get("variant") == "main"


def central(rows, method="centralised"):
    """seed -> the centralised `main` row of that seed, from the rows of one corpus; where a seed
    has several (files merged by hand), the last one read counts"""
    return {r["seed"]: r for r in rows if is_central(r, method)}
