#!/usr/bin/env python3
"""Plots train and validation cross-entropy from a `spes train` metrics.jsonl as a
self-contained SVG (no plotting library needed).

usage: plot_loss.py METRICS.jsonl --out PLOT.svg [--unigram H] [--title TEXT] [--smooth N]
Train ce is drawn per step (light) and as a moving average over N steps (default 20);
validation ce (lines with "eval") as points joined by a line; --unigram adds a dashed
reference line at the unigram entropy.
"""
import argparse
import json
import math
from html import escape

W, H = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 40, 52


def nice_ticks(lo, hi, n=8):
    span = hi - lo
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=mag * 10)
    t = math.ceil(lo / step) * step
    out = []
    while t <= hi + 1e-9:
        out.append(round(t, 10))
        t += step
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--out", required=True)
    ap.add_argument("--unigram", type=float)
    ap.add_argument("--title", default="spes train: cross-entropy")
    ap.add_argument("--smooth", type=int, default=20)
    a = ap.parse_args()

    train, val = [], []
    for line in open(a.metrics):
        r = json.loads(line)
        if r.get("ce") is None:
            continue
        (val if "eval" in r else train).append((r["step"], r["ce"]))
    if not train:
        raise SystemExit(f"{a.metrics}: no step lines with ce")
    smooth = []
    for i in range(len(train)):
        window = train[max(0, i - a.smooth + 1): i + 1]
        smooth.append((train[i][0], sum(c for _, c in window) / len(window)))

    xs = [s for s, _ in train] + [s for s, _ in val]
    ys = [c for _, c in train] + [c for _, c in val] + ([a.unigram] if a.unigram else [])
    x0, x1 = 0, max(xs)
    y0, y1 = max(0.0, min(ys) - 0.1), max(ys) + 0.1

    def px(x):
        return LEFT + (x - x0) / (x1 - x0 or 1) * (W - LEFT - RIGHT)

    def py(y):
        return TOP + (y1 - y) / (y1 - y0 or 1) * (H - TOP - BOTTOM)

    def path(points):
        return " ".join(("M" if i == 0 else "L") + f"{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(points))

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{escape(a.title)}</text>']
    for t in nice_ticks(y0, y1):
        svg.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e5e5"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in nice_ticks(x0, x1):
        svg.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#f0f0f0"/>')
        svg.append(f'<text x="{px(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{t:g}</text>')
    svg.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
               f'fill="none" stroke="#888"/>')
    svg.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">optimizer step</text>')
    svg.append(f'<text x="16" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2})">cross-entropy (nats/token)</text>')
    legend = []
    if a.unigram:
        svg.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(a.unigram):.1f}" y2="{py(a.unigram):.1f}" '
                   f'stroke="#999" stroke-dasharray="6,4"/>')
        legend.append(("#999", f"unigram entropy {a.unigram:.2f}", "6,4"))
    svg.append(f'<path d="{path(train)}" fill="none" stroke="#9ecae1" stroke-width="1"/>')
    svg.append(f'<path d="{path(smooth)}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    legend.append(("#1f77b4", f"train (mean of {a.smooth} steps) {smooth[-1][1]:.3f}", ""))
    if val:
        svg.append(f'<path d="{path(val)}" fill="none" stroke="#d62728" stroke-width="2"/>')
        for x, y in val:
            svg.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="#d62728"/>')
        legend.append(("#d62728", f"validation (held out) {val[-1][1]:.3f}", ""))
    for i, (color, text, dash) in enumerate(legend):
        y = TOP + 16 + 18 * i
        x = W - RIGHT - 260
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        svg.append(f'<line x1="{x}" x2="{x + 24}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2"{extra}/>')
        svg.append(f'<text x="{x + 30}" y="{y}">{escape(text)}</text>')
    svg.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {a.out}: {len(train)} train steps, {len(val)} validation points")


if __name__ == "__main__":
    main()
