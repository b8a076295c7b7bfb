"""Independent check of a sync run's logged uploads and downloads (tests/unit/test_sync_e2e.c).

For every step: all peers downloaded byte-identical aggregates; shared tensors equal the fp32
mean of the uploads (peers summed in order, then divided); experts equal their owner's upload,
or on merge steps theta_i + alpha * mean_{j in N_i}(theta_j - theta_i) with N_i the top-k
experts by cosine of gate_proj (ties to the lower index), computed here with numpy.
Usage: check_sync_e2e.py DIR PEERS M MERGE_INTERVAL ALPHA_START DECAY_STEPS TOPK STEP...
"""
import re
import sys

import numpy as np
from safetensors.numpy import load_file

EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def main():
    d, P, m, interval, alpha0, decay, topk = sys.argv[1], *map(int, sys.argv[2:4]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    steps = [int(s) for s in sys.argv[8:]]
    for step in steps:
        downs = [open(f"{d}/down_s{step}_p{p}.safetensors", "rb").read() for p in range(P)]
        assert all(x == downs[0] for x in downs), f"step {step}: peers downloaded different aggregates"
        agg = load_file(f"{d}/down_s{step}_p0.safetensors")
        ups = [load_file(f"{d}/up_s{step}_p{p}.safetensors") for p in range(P)]
        alpha = alpha0 * (1 - min(step / decay, 1)) if interval > 0 and step % interval == 0 else 0.0
        experts = {}  # (layer, e, proj) -> owner's upload
        for name, value in agg.items():
            mt = EXPERT.match(name)
            if not mt:
                s = ups[0][name].astype(np.float32).copy()
                for p in range(1, P):
                    s += ups[p][name]
                want = s / np.float32(P)
                assert np.array_equal(value, want), f"step {step}: {name} is not the mean of the uploads"
            else:
                l, e, proj = int(mt[1]), int(mt[2]), mt[3]
                experts[(l, e, proj)] = ups[e // m][name]
        E = 1 + max(e for (_, e, _) in experts)
        for l in sorted({k[0] for k in experts}):
            g = np.stack([experts[(l, e, "gate")].astype(np.float64).ravel() for e in range(E)])
            n = np.linalg.norm(g, axis=1)
            cos = (g @ g.T) / np.outer(n, n)
            k = min(topk, E - 1)
            for i in range(E):
                others = [j for j in range(E) if j != i]
                nbr = sorted(others, key=lambda j: (-cos[i, j], j))[:k]
                for proj in ("gate", "up", "down"):
                    name = f"model.layers.{l}.mlp.experts.{i}.{proj}_proj.weight"
                    own = experts[(l, i, proj)]
                    if alpha > 0:
                        want = own + alpha * np.mean([experts[(l, j, proj)] - own for j in nbr], axis=0)
                        assert np.allclose(agg[name], want, rtol=1e-5, atol=1e-6), f"step {step}: merged {name} differs"
                        assert not np.array_equal(agg[name], own), f"step {step}: {name} was not merged"
                    else:
                        assert np.array_equal(agg[name], own), f"step {step}: {name} is not its owner's upload"
        print(f"step {step}: {len(agg)} tensors ok (alpha {alpha:g})")
    print("sync e2e: all checks passed")


if __name__ == "__main__":
    main()
