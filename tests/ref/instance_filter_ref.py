"""Cases for OLMo's instance filter, computed by OLMo's own code (tests/unit/test_data_instance_filter.c
reads them when SPES_INSTANCE_FILTER_REF names this script's output).

OLMo's find_periodic_sequences lives in olmo/data/util.py of the ai2-olmo package (installed
without its dependencies by tests/setup_venv.sh). That file needs only numpy and torch, so it is
loaded by path, without running the package's __init__ (which imports all of OLMo's stack).
The decision rule is MemMapDataset._validate_instance's: an instance is masked when a yielded
repetition has times >= repetition_max_count.

Output, one case per three lines:
  case MIN_PERIOD MAX_PERIOD MAX_COUNT N id_0 ... id_{N-1}
  reps K start end period times (K times)
  keep 0|1
"""
import importlib.util
import os
import sys

import numpy as np


def load_olmo_util():
    spec = importlib.util.find_spec("olmo")   # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "util.py")
    if not os.path.exists(path):
        return None
    mod_spec = importlib.util.spec_from_file_location("olmo_data_util", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def planted(rng, n, vocab):
    """Random background with one or two runs of a short pattern pasted in (whole or cut)."""
    ids = rng.integers(0, vocab, size=n)
    for _ in range(rng.integers(1, 3)):
        period = int(rng.integers(1, 16))
        length = int(rng.integers(period, max(period + 1, n)))
        start = int(rng.integers(0, max(1, n - length)))
        pattern = rng.integers(0, vocab, size=period)
        run = np.resize(pattern, length)
        ids[start:start + length] = run[: n - start]
    return ids


def cases(rng):
    settings = [(1, 13, 32), (1, 13, 3), (2, 5, 4), (1, 1, 10), (3, 20, 6), (4, 4, 3), (1, 30, 2)]
    for i in range(1500):
        n = int(rng.choice([1, 2, 3, 5, 8, 12, 13, 26, 39, 40, 64, 100, 255, 256, 300]))
        kind = i % 4
        if kind == 0:
            ids = rng.integers(0, 3, size=n)            # tiny vocabulary: natural repeats
        elif kind == 1:
            ids = rng.integers(0, 50000, size=n)        # almost no repeats
        elif kind == 2:
            ids = planted(rng, n, 1000)
        else:
            ids = np.full(n, int(rng.integers(0, 100)))  # one token throughout
            if n > 4 and rng.integers(0, 2):
                ids[int(rng.integers(0, n))] = 7777      # ... broken once
        yield settings[i % len(settings)], ids.astype(np.int64)


def main():
    util = load_olmo_util()
    if util is None:
        print("instance_filter_ref: ai2-olmo is not installed (tests/setup_venv.sh)", file=sys.stderr)
        return 77
    rng = np.random.default_rng(20261126)
    out = []
    for (min_p, max_p, max_count), ids in cases(rng):
        reps = list(util.find_periodic_sequences(ids, max_period=max_p, min_period=min_p))
        keep = not any(r.times >= max_count for r in reps)
        out.append("case %d %d %d %d %s" % (min_p, max_p, max_count, len(ids), " ".join(str(int(x)) for x in ids)))
        out.append("reps %d %s" % (len(reps), " ".join("%d %d %d %d" % (r.start, r.end, r.period, r.times) for r in reps)))
        out.append("keep %d" % int(keep))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
