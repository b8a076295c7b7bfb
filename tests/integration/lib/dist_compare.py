#!/usr/bin/env python3
"""Compares two training runs (save_folder A and B, both at step S) for the data-parallel tests.

usage: dist_compare.py A B STEP [--tol T] [--exact-steps K] [--norm-tol N]

- metrics.jsonl: every step's loss terms and grad norm agree within relative T, and the first K
  steps' loss terms agree exactly (bit-identical JSON numbers: the first step's losses do not
  depend on how gradients were summed; its grad norm does); the grad norm within relative N
  (default T: a norm summed from shards may differ in its last double bits from one summed whole);
- stepS/model.safetensors and stepS/train_state.safetensors: the same tensors, every value within
  T absolute + T relative; train_state.json step, tokens seen and data position equal.
Prints the largest differences and whether they are bitwise equal. Pure Python (no numpy).
"""
import json, math, struct, sys

def read_st(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        out[name] = (info["shape"], struct.unpack("<%df" % (len(raw) // 4), raw))
    return out

def metrics(path):
    rows = {}
    with open(path) as f:
        for line in f:
            if '"step"' in line and '"loss"' in line:
                d = json.loads(line)
                rows[d["step"]] = d
    return rows

def main():
    a, b, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tol, exact, norm_tol = 1e-5, 0, None
    args = sys.argv[4:]
    while args:
        k = args.pop(0)
        if k == "--tol": tol = float(args.pop(0))
        elif k == "--exact-steps": exact = int(args.pop(0))
        elif k == "--norm-tol": norm_tol = float(args.pop(0))
    bad = []
    ma, mb = metrics(a + "/metrics.jsonl"), metrics(b + "/metrics.jsonl")
    if sorted(ma) != sorted(mb) or not ma:
        bad.append("metrics steps differ: %s vs %s" % (sorted(ma), sorted(mb)))
    worst = 0.0
    for s in sorted(set(ma) & set(mb)):
        for key in ("loss", "ce", "lm_z", "lb", "router_z", "grad_norm"):
            x, y = ma[s].get(key), mb[s].get(key)
            if x is None and y is None: continue
            if s <= exact and key != "grad_norm" and x != y:   # the norm sums gradients: order-dependent
                bad.append("step %d %s: %r vs %r, expected bit-identical" % (s, key, x, y))
            rel = abs(x - y) / max(abs(x), 1e-12)
            worst = max(worst, rel)
            limit = norm_tol if key == "grad_norm" and norm_tol is not None else tol
            if not rel <= limit:
                bad.append("step %d %s: %r vs %r (rel %.3g > %g)" % (s, key, x, y, rel, limit))
    print("metrics: %d steps, largest relative difference %.3g" % (len(ma), worst))
    for f in ("model.safetensors", "train_state.safetensors"):
        ta, tb = read_st("%s/step%d/%s" % (a, step, f)), read_st("%s/step%d/%s" % (b, step, f))
        if sorted(ta) != sorted(tb):
            bad.append("%s: tensor names differ" % f)
            continue
        dmax, bitwise = 0.0, True
        for name in ta:
            sa, va = ta[name]
            sb, vb = tb[name]
            if sa != sb:
                bad.append("%s %s: shape %s vs %s" % (f, name, sa, sb))
                continue
            for x, y in zip(va, vb):
                if x != y:
                    bitwise = False
                    d = abs(x - y)
                    dmax = max(dmax, d)
                    if not d <= tol + tol * abs(x) or math.isnan(d):
                        bad.append("%s %s: %r vs %r" % (f, name, x, y))
                        break
        print("%s: %d tensors, %s, largest difference %.3g" % (f, len(ta), "bitwise equal" if bitwise else "not bitwise", dmax))
    sa, sb = (json.load(open("%s/step%d/train_state.json" % (d, step))) for d in (a, b))
    for key in ("step", "tokens_seen"):
        if sa.get(key) != sb.get(key):
            bad.append("train_state.json %s: %r vs %r" % (key, sa.get(key), sb.get(key)))
    if json.dumps(sa.get("data"), sort_keys=True) != json.dumps(sb.get("data"), sort_keys=True):
        bad.append("train_state.json data: %r vs %r" % (sa.get("data"), sb.get("data")))
    for line in bad[:20]:
        print("MISMATCH", line)
    sys.exit(1 if bad else 0)

main()
