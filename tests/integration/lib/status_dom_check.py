#!/usr/bin/env python3
"""Checks the status page's DOM as a browser rendered it (chromium_dom.sh's --dump-dom output)
against expectations, using the element ids docs/status.md promises:

    status_dom_check.py DOM_FILE EXPECTATION...

  peers=N          N rows in table#peers (tr.peer)
  state:P=S        peer P's row has data-state S (alive, late, missing, unseen)
  curve:P          peer P's loss curve (polyline#loss-peer-P in svg#loss-curves) has 2+ points
  curves=N         N polylines in svg#loss-curves
  bars=N, bars>=N  bars (rect.bar) in svg#round-times
  rounds>=N        rows in table#rounds (tr.round)
  partial=STEP     the rounds table marks STEP partial (data-partial="true")
  partial          some round is marked partial

Exit 0 when all hold, 1 naming each that does not. Standard library only."""
import re
import sys
from html.parser import HTMLParser


class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack = []          # open elements' ids, innermost last
        self.peers = {}          # peer id -> data-state
        self.curves = {}         # polyline id -> point count
        self.bars = 0
        self.rounds = {}         # step -> partial ("true"/"false")
        self.in_svg = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "svg":
            self.in_svg = a.get("id")
        elif tag == "tr" and "peer" in cls:
            self.peers[a.get("data-peer")] = a.get("data-state")
        elif tag == "tr" and "round" in cls:
            self.rounds[a.get("data-step")] = a.get("data-partial")
        elif tag == "polyline" and self.in_svg == "loss-curves":
            pts = re.findall(r"-?[\d.]+,-?[\d.]+", a.get("points") or "")
            self.curves[a.get("id")] = len(pts)
        elif tag == "rect" and "bar" in cls and self.in_svg == "round-times":
            self.bars += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self.in_svg = None


def compare(value, op, want):
    return value >= want if op == ">=" else value == want


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    dom = Dom()
    with open(sys.argv[1], encoding="utf-8") as f:
        dom.feed(f.read())
    failed = []
    for e in sys.argv[2:]:
        m = re.fullmatch(r"(peers|curves|bars|rounds)(=|>=)(\d+)", e)
        if m:
            value = {"peers": len(dom.peers), "curves": len(dom.curves), "bars": dom.bars,
                     "rounds": len(dom.rounds)}[m[1]]
            ok, got = compare(value, m[2], int(m[3])), value
        elif m := re.fullmatch(r"state:(\d+)=(\w+)", e):
            got = dom.peers.get(m[1])
            ok = got == m[2]
        elif m := re.fullmatch(r"curve:(\d+)", e):
            got = dom.curves.get(f"loss-peer-{m[1]}", "no curve")
            ok = got != "no curve" and got >= 2
        elif m := re.fullmatch(r"partial=(\d+)", e):
            got = dom.rounds.get(m[1], "no such round")
            ok = got == "true"
        elif e == "partial":
            got = sorted(s for s, p in dom.rounds.items() if p == "true")
            ok = bool(got)
        else:
            print(f"status_dom_check: unknown expectation '{e}'")
            return 2
        print(("ok   " if ok else "FAIL ") + f"{e} (found: {got})")
        if not ok:
            failed.append(e)
    if failed:
        print(f"the page's DOM does not show: {' '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
