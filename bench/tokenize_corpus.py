"""Benchmark corpora: Tiny Shakespeare repeated to about MB megabytes, and a Unicode-heavy text
of a quarter of that made of the parity test's multi-script snippets (documents of 20 snippets
separated by blank lines).

usage: tokenize_corpus.py SHAKESPEARE OUT_DIR MB
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from tokenizer_parity import STRESS_PIECES  # noqa: E402


def main():
    src, out, mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
    target = int(mb * 1e6)
    base = open(src, encoding="utf-8", newline="").read()
    with open(os.path.join(out, "shakespeare.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(base * max(1, target // len(base.encode("utf-8"))))
    rng = random.Random(7)
    docs, size = [], 0
    while size < target // 4:
        d = "".join(rng.choice(STRESS_PIECES) for _ in range(20)).replace("\n\n", "\n")
        docs.append(d)
        size += len(d.encode("utf-8")) + 2
    with open(os.path.join(out, "unicode.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("\n\n".join(docs))


if __name__ == "__main__":
    main()
