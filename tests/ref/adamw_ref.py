"""Reference for src/train/optimizer.c: torch.optim.AdamW with OLMo's two weight-decay
groups and torch.nn.utils.clip_grad_norm_ over the trainable tensors, for a few steps.

Writes OUT.safetensors holding, for every tensor NAME of a small OLMoE-like table,
  init.NAME, grad.S.NAME (the raw gradient of step S, before clipping),
  final.NAME, exp_avg.NAME, exp_avg_sq.NAME (trainable tensors only),
and __metadata__ with the hyper-parameters, per-step lr and pre-clip grad norms.
Usage: adamw_ref.py OUT.safetensors
"""
import json
import sys

import torch
from safetensors.torch import save_file

torch.manual_seed(1234)
V, H, I = 11, 8, 6
# name, shape, kind (as ParamKind in src/model/param_table.h), trainable
TABLE = [
    ("model.embed_tokens.weight", (V, H), "embed", True),
    ("model.layers.0.input_layernorm.weight", (H,), "norm", True),
    ("model.layers.0.self_attn.q_proj.weight", (H, H), "linear", True),
    ("model.layers.0.mlp.gate.weight", (3, H), "linear", True),
    ("model.layers.0.mlp.experts.0.gate_proj.weight", (I, H), "linear", False),
    ("model.layers.0.mlp.experts.1.gate_proj.weight", (I, H), "linear", True),
    ("model.norm.weight", (H,), "norm", True),
    ("lm_head.weight", (V, H), "linear", True),
]
HP = dict(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, decay_norm_and_bias=False,
          decay_embeddings=False, max_grad_norm=1.0, steps=6)
LRS = [1e-3, 3e-3, 2e-3, 5e-4, 4e-3, 1e-2]
GRAD_SCALES = [0.05, 3.0, 0.2, 10.0, 0.01, 1.0]   # some steps clip, some do not


def decays(kind):
    if kind == "embed":
        return HP["decay_embeddings"]
    if kind == "norm":
        return HP["decay_norm_and_bias"]
    return True


out = {}
params = {}
for name, shape, kind, trainable in TABLE:
    p = torch.randn(shape) * 0.5 + (1.0 if kind == "norm" else 0.0)
    out["init." + name] = p.clone()
    params[name] = torch.nn.Parameter(p, requires_grad=trainable)

trainable = [(n, k) for n, _, k, t in TABLE if t]
groups = [
    {"params": [params[n] for n, k in trainable if decays(k)]},
    {"params": [params[n] for n, k in trainable if not decays(k)], "weight_decay": 0.0},
]
opt = torch.optim.AdamW(groups, lr=LRS[0], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"],
                        weight_decay=HP["weight_decay"], foreach=False)
norms = []
for s in range(HP["steps"]):
    for name, _, _, t in TABLE:
        if not t:
            continue
        g = torch.randn(params[name].shape) * GRAD_SCALES[s]
        out[f"grad.{s}.{name}"] = g.clone()
        params[name].grad = g
    norm = torch.nn.utils.clip_grad_norm_([params[n] for n, _ in trainable], HP["max_grad_norm"])
    norms.append(float(norm))
    for group in opt.param_groups:
        group["lr"] = LRS[s]
    opt.step()

for name, _, _, t in TABLE:
    out["final." + name] = params[name].detach().clone()
    if t:
        out["exp_avg." + name] = opt.state[params[name]]["exp_avg"].clone()
        out["exp_avg_sq." + name] = opt.state[params[name]]["exp_avg_sq"].clone()

meta = {"hp": json.dumps(HP), "lrs": json.dumps(LRS), "norms": json.dumps(norms),
        "table": json.dumps([[n, k, t] for n, _, k, t in TABLE])}
save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1], metadata=meta)
print(f"adamw_ref: {len(out)} tensors, grad norms {['%.4f' % n for n in norms]}")
