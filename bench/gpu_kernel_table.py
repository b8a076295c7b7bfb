#!/usr/bin/env python3
"""Where one training step's device time goes, kernel by kernel.

Reads the CSV Nsight Compute wrote for the step `bench/gpu_train_step --profile-step` runs
between cudaProfilerStart and cudaProfilerStop (scripts/gpu_check.sh's profile stage:
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv ...)
and prints the launches grouped by kernel (the name without its template arguments), then the
heaviest kernels with their template arguments, each with its launches, total milliseconds, share
of the sum and mean microseconds.

ncu runs the kernels one at a time, so the sum is the step's device time without any overlap
(the experts' side streams, host gaps): compare its parts with each other and with their floors
(docs/gpu_perf_notes.md), not the sum with the bench's step time.

Both of ncu's CSV layouts are read: the details page (one row per kernel and metric, with
"Metric Name", "Metric Unit" and "Metric Value" columns) and the raw page (one row per kernel,
a column per metric, units in the row under the header). Python standard library only.

usage: gpu_kernel_table.py NCU_CSV [--top N]
"""
import argparse
import csv
import sys

METRIC = "gpu__time_duration.sum"
TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}


def fail(msg):
    sys.exit("gpu_kernel_table: " + msg)


def number(text, where):
    try:
        return float(text.replace(",", ""))   # the details page may group thousands
    except ValueError:
        fail(f"{where}: '{text}' is not a number")


def microseconds(value, unit, where):
    if unit not in TO_US:
        fail(f"{where}: unknown time unit '{unit}' (known: {', '.join(sorted(TO_US))})")
    return value * TO_US[unit]


def read_durations(path):
    """[(kernel name, microseconds)] in launch order."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    # ncu's own messages (==PROF==, ==WARNING==) may come before the table.
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    if head is None:
        fail(f"{path}: no ncu CSV header (a row with 'ID' and 'Kernel Name') in {len(rows)} rows")
    cols = {name: i for i, name in enumerate(rows[head])}
    body = [r for r in rows[head + 1:] if len(r) == len(cols)]
    out = []
    if "Metric Name" in cols:   # details page
        for n, r in enumerate(body):
            if r[cols["Metric Name"]] != METRIC:
                continue
            where = f"{path}: kernel ID {r[cols['ID']]}"
            out.append((r[cols["Kernel Name"]],
                        microseconds(number(r[cols["Metric Value"]], where), r[cols["Metric Unit"]], where)))
    elif METRIC in cols:        # raw page: the units row has no ID
        unit = None
        for r in body:
            if not r[cols["ID"]].strip():
                unit = r[cols[METRIC]]
                continue
            where = f"{path}: kernel ID {r[cols['ID']]}"
            if unit is None:
                fail(f"{where}: no units row before it")
            out.append((r[cols["Kernel Name"]], microseconds(number(r[cols[METRIC]], where), unit, where)))
    else:
        fail(f"{path}: neither a details page (Metric Name) nor a raw page with a {METRIC} column")
    if not out:
        fail(f"{path}: no {METRIC} values: did the profiled step (cudaProfilerStart .. Stop) run any kernel?")
    return out


def full_name(name):
    """The demangled name without its argument list and a leading return type."""
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    return name[5:] if name.startswith("void ") else name


def base_name(name):
    return full_name(name).split("<", 1)[0]


def table(title, durations, key, top, total):
    groups = {}
    for name, us in durations:
        k = key(name)
        n, t = groups.get(k, (0, 0.0))
        groups[k] = (n + 1, t + us)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][1], kv[0]))
    print(f"\n{title}")
    print(f"{'launches':>8} {'total ms':>9} {'share':>6} {'mean us':>9}  kernel")
    for k, (n, t) in ordered[:top]:
        print(f"{n:8d} {t / 1e3:9.3f} {100 * t / total:5.1f}% {t / n:9.1f}  {k}")
    if len(ordered) > top:
        rest = ordered[top:]
        n = sum(v[0] for _, v in rest)
        t = sum(v[1] for _, v in rest)
        print(f"{n:8d} {t / 1e3:9.3f} {100 * t / total:5.1f}% {t / n:9.1f}  ({len(rest)} more)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu's CSV of the profiled step")
    ap.add_argument("--top", type=int, default=30, help="rows of each table (default 30)")
    a = ap.parse_args()
    if a.top < 1:
        fail("--top must be at least 1")
    d = read_durations(a.csv)
    total = sum(us for _, us in d)
    print(f"kernels of the profiled step: {len(d)} launches, {total / 1e3:.3f} ms in all "
          f"(each run alone under ncu: no overlap)")
    table("by kernel:", d, base_name, a.top, total)
    table("by kernel and template arguments:", d, full_name, a.top, total)


if __name__ == "__main__":
    main()
