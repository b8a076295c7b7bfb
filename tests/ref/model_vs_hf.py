"""Compares `spes debug-step` with Hugging Face transformers' own OlmoeForCausalLM (QK-norm
over the full projection) and Qwen3MoeForCausalLM (QK-norm per head) on tiny random models:
logits, each loss term and EVERY parameter gradient.

Usage: model_vs_hf.py SPES_BIN WORK_DIR      (exit 0 = all match, 1 = mismatch, 2 = setup error)

For each config below it builds the HF model in fp32 with random weights, saves it with
save_pretrained (config.json + model.safetensors, per-expert HF tensor names) plus a raw
token file, runs `SPES_BIN debug-step`, and compares against torch autograd through the same
HF model cast to float64 (the reference).

Tolerance, per tensor (logits [B,T,V], every grad.<name>, every scalar loss):
    max|ours - ref| <= RTOL * max|ref|,   RTOL = 1e-5
i.e. the error is measured against the tensor's own scale. Element-wise relative error is
not usable: gradients have many entries near zero whose absolute error is set by the
cancellation of much larger terms in the dot products that produce them. Norm-wise fp32
accumulation error over our tiny dims (dot products of <= 256 terms) is ~1e-7..1e-6 of the
largest entry, so 1e-5 leaves ~10x headroom while catching any real bug (a wrong sign,
a missing term, a transposed weight or an off-by-one gives errors of 1e-3..1). A tensor
whose reference is all zeros (an expert no token reached) must be exactly zero.
The reference is float64 because fp32 torch itself sits at ~1e-7..1e-6 of the scale: the
script prints that noise floor (HF fp32 vs HF fp64) next to our error for every failure.
Note HF computes RMSNorm, attention softmax and router softmax in fp32 even in a float64
model (explicit casts in modeling_olmoe.py/modeling_qwen3_moe.py), so the reference carries
fp32 rounding there (~1e-7 relative), far below RTOL.

Routing is discontinuous: a token whose k-th and (k+1)-th router probabilities nearly tie
could route differently in fp32. Each config's seed is checked so that the smallest such gap
is >= 1e-4 (fp32 noise in the probabilities is ~1e-7); if not, the next seed is used.
"""
import copy
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy
from transformers import OlmoeConfig, OlmoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_losses import moe_losses  # noqa: E402

RTOL = 1e-5
MIN_ROUTING_GAP = 1e-4

# Shared shape of every tiny model: 2 layers, 8 experts top-2, 96 embedding rows of which
# the tokens use only the first 80 (padded rows), non-default rope_theta.
COMMON = dict(num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, vocab_size=96,
              max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
              attention_dropout=0.0)
USED_TOKENS = 80
# pad_token_id becomes nn.Embedding(padding_idx=...), whose row HF never gives a gradient;
# putting it on a padded row that no token uses keeps that HF quirk out of the comparison.
PAD_TOKEN = 95

CONFIGS = [
    # name, model type, extra config, batch, seq, token dtype
    ("olmoe_gqa_topknorm", "olmoe",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
          norm_topk_prob=True, rope_theta=5000.0, rms_norm_eps=1e-5), 2, 16, "uint16"),
    ("olmoe_mha_plain", "olmoe",
     dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, intermediate_size=24,
          norm_topk_prob=False, rope_theta=123456.0, rms_norm_eps=1e-6), 3, 12, "uint32"),
    # Qwen3: head_dim set so that n_heads*head_dim != hidden_size (64 vs 48).
    ("qwen3_gqa_plain", "qwen3_moe",
     dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
          moe_intermediate_size=32, norm_topk_prob=False, rope_theta=2500.0, rms_norm_eps=1e-6,
          decoder_sparse_step=1, mlp_only_layers=[]), 2, 16, "uint16"),
    ("qwen3_mha_topknorm", "qwen3_moe",
     dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, head_dim=12,
          moe_intermediate_size=24, norm_topk_prob=True, rope_theta=40000.0, rms_norm_eps=1e-5,
          decoder_sparse_step=1, mlp_only_layers=[]), 2, 12, "uint32"),
    # T = 150 spans several query blocks of the tiled attention (64 rows) with a partial last
    # one, rope at larger positions, and hundreds of tokens per expert.
    ("olmoe_gqa_longseq", "olmoe",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, intermediate_size=32,
          norm_topk_prob=True, rope_theta=10000.0, rms_norm_eps=1e-5), 2, 150, "uint16"),
]
# (lm_z_mult, lb_weight, router_z_weight): every config runs MIXED; the first config also
# runs each auxiliary term alone (and CE alone), so a failure names the loss that causes it.
MIXED = (0.1, 0.5, 0.2)
ISOLATED = [(0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)]
FROZEN_EXPERTS = (2, 5)   # --trainable_experts run on the first config


def build_model(model_type, extra, seed):
    """A random fp32 HF model (eager attention, eager experts) with weights scaled so that
    activations are O(1), norms are not all ones and routing is far from uniform."""
    cfg_args = dict(COMMON, pad_token_id=PAD_TOKEN, eos_token_id=0, bos_token_id=0, **extra)
    if model_type == "olmoe":
        config, cls = OlmoeConfig(**cfg_args), OlmoeForCausalLM
    else:
        config, cls = Qwen3MoeConfig(**cfg_args), Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="eager", experts_implementation="eager",
                             dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):   # router: peaky probabilities
                p.copy_(3.0 / p.shape[-1] ** 0.5 * torch.randn(p.shape, generator=gen))
            else:                                    # [.., out, in] linear weights
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "lm_head tied"
    model.eval()   # no dropout anywhere (all dropout probabilities are 0 as well)
    return model


def by_checkpoint_name(model, tensor_of):
    """{HF checkpoint name: tensor_of(parameter)}. transformers 5 keeps each layer's experts as
    fused 3-D parameters (gate_up_proj [E,2I,H] = gate rows then up rows, down_proj [E,H,I])
    and splits them back into experts.{e}.{gate,up,down}_proj.weight when saving."""
    out = {}
    for name, p in model.named_parameters():
        out.update(split_experts(name, tensor_of(p).detach()))
    return out


def hf_named_grads(model):
    grads = by_checkpoint_name(model, lambda p: p.grad if p.grad is not None else torch.zeros_like(p))
    return {k: v.double().numpy() for k, v in grads.items()}


def split_experts(name, tensor):
    prefix = name.rsplit(".", 1)[0]
    if name.endswith("experts.gate_up_proj"):
        inter = tensor.shape[1] // 2
        res = {}
        for e in range(tensor.shape[0]):
            res[f"{prefix}.{e}.gate_proj.weight"] = tensor[e, :inter]
            res[f"{prefix}.{e}.up_proj.weight"] = tensor[e, inter:]
        return res
    if name.endswith("experts.down_proj"):
        return {f"{prefix}.{e}.down_proj.weight": tensor[e] for e in range(tensor.shape[0])}
    return {name: tensor}


def check_saved_layout(model, path):
    """The saved file must hold exactly our per-expert split of the parameters (guards the
    gate/up order assumption in split_experts)."""
    saved = load_numpy(path)
    mine = by_checkpoint_name(model, lambda p: p)
    if set(saved) != set(mine):
        raise RuntimeError(f"saved names differ: {sorted(set(saved) ^ set(mine))[:6]}")
    for k, v in mine.items():
        if not np.array_equal(saved[k], v.numpy()):
            raise RuntimeError(f"saved tensor {k} differs from the model parameter")


def reference_step(model, tokens, batch, seq, weights):
    """HF forward + autograd backward. Returns (logits, losses, grads, routing_gap)."""
    model.zero_grad(set_to_none=True)
    rows = torch.as_tensor(tokens[: batch * (seq + 1)].astype(np.int64)).view(batch, seq + 1)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    out = model(input_ids=inputs, output_router_logits=True, use_cache=False)
    losses = moe_losses(out.logits, targets, out.router_logits, model.config.num_experts_per_tok, *weights)
    losses["total"].backward()
    k = model.config.num_experts_per_tok
    gap = min(float((p[:, k - 1] - p[:, k]).min())
              for p in (torch.softmax(r.detach().double(), -1).sort(-1, descending=True).values
                        for r in out.router_logits))
    return (out.logits.detach().double().numpy(), {n: float(v.detach()) for n, v in losses.items()},
            hf_named_grads(model), gap)


def run_ours(spes_bin, model_dir, token_path, dtype, batch, seq, weights, out_path, trainable=None):
    cmd = [spes_bin, "debug-step", "--model", model_dir, "--tokens", token_path, "--dtype", dtype,
           "--batch", str(batch), "--seq", str(seq), "--lm_z_mult", repr(weights[0]),
           "--lb_weight", repr(weights[1]), "--router_z_weight", repr(weights[2]), "--out", out_path]
    if trainable:
        cmd += ["--trainable_experts", f"{trainable[0]}-{trainable[1]}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout}{res.stderr}")
    return load_numpy(out_path)


def rel_error(ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return float("inf"), f"shape {ours.shape} vs reference {ref.shape}"
    diff = np.abs(ours - ref)
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    worst = int(diff.argmax()) if diff.size else 0
    where = f"worst at {tuple(int(i) for i in np.unravel_index(worst, ref.shape))}: ours {ours.flat[worst]:.9g} ref {ref.flat[worst]:.9g}"
    if scale == 0.0:
        return (0.0 if float(diff.max(initial=0.0)) == 0.0 else float("inf")), where
    return float(diff.max(initial=0.0)) / scale, where


class Report:
    def __init__(self):
        self.failures = []
        self.worst = (0.0, "")

    def compare(self, label, ours, ref, noise=None):
        """noise: a function giving HF fp32's own error on this tensor, called on failure."""
        err, where = rel_error(ours, ref)
        if err > self.worst[0] or not self.worst[1]:
            self.worst = (err, label)
        if not err <= RTOL:
            extra = f" (fp32 torch noise {noise():.2e})" if noise is not None else ""
            self.failures.append(f"{label}: rel err {err:.3e} > {RTOL:.0e}{extra}; {where}")


def compare_run(report, tag, ours, ref, noise, expected_grads):
    logits, losses, grads = ref
    report.compare(f"{tag} logits", ours.get("logits", np.zeros(0)), logits, lambda: noise()["logits"])
    for term, value in losses.items():
        report.compare(f"{tag} loss.{term}", ours.get(f"loss.{term}", np.full((), np.nan)), np.array(value))
    got = {k[5:] for k in ours if k.startswith("grad.")}
    missing, extra = sorted(expected_grads - got), sorted(got - expected_grads)
    if missing:
        report.failures.append(f"{tag}: {len(missing)} grads missing, e.g. {missing[:4]}")
    if extra:
        report.failures.append(f"{tag}: {len(extra)} unexpected grads (frozen?), e.g. {extra[:4]}")
    for name in sorted(expected_grads & got):
        report.compare(f"{tag} grad.{name}", ours[f"grad.{name}"], grads[name], lambda n=name: noise()[n])


def fp32_noise(model, tokens, batch, seq, weights, ref):
    """A function returning how far HF's own fp32 run is from the float64 reference, per
    tensor: what a correct fp32 implementation can be expected to reach. Computed on the
    first call only (failures need it; passing runs do not pay for it)."""
    cache = {}

    def noise():
        if not cache:
            logits, _, grads, _ = reference_step(model, tokens, batch, seq, weights)
            cache["logits"] = rel_error(logits, ref[0])[0]
            cache.update({n: rel_error(g, ref[2][n])[0] for n, g in grads.items()})
        return cache
    return noise


def check_loss_formulas():
    """Independent check of moe_losses against HF's own code and a plain per-token loop."""
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func
    from transformers.loss.loss_utils import ForCausalLMLoss
    g = torch.Generator().manual_seed(7)
    N, E, k, V = 40, 8, 2, 30
    logits = torch.randn(2, N // 2, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (2, N // 2), generator=g)
    router = tuple(2 * torch.randn(N, E, generator=g, dtype=torch.float64) for _ in range(3))
    got = moe_losses(logits, targets, router, k, 0.3, 0.7, 0.11)
    # CE against HF's causal-LM loss fed with already-shifted labels (HF upcasts to fp32).
    hf_ce = ForCausalLMLoss(logits, None, V, shift_labels=targets)
    assert abs(float(got["ce"]) - float(hf_ce)) < 1e-6 * float(hf_ce), (got["ce"], hf_ce)
    # With one layer, HF's Switch-style aux loss equals k times the MegaBlocks form.
    one = moe_losses(logits, targets, router[:1], k)
    hf_lb = load_balancing_loss_func(router[:1], E, k)
    assert abs(float(one["lb"]) * k - float(hf_lb)) < 1e-6, (one["lb"], hf_lb)
    # Plain loops for every term.
    lse = [float(torch.logsumexp(logits.reshape(-1, V)[i], 0)) for i in range(N)]
    lm_z = sum(v * v for v in lse) / N
    lb = router_z = 0.0
    for layer in router:
        counts = [0] * E
        for i in range(N):
            for e in torch.topk(torch.softmax(layer[i], 0), k).indices.tolist():
                counts[e] += 1
        probs = torch.softmax(layer, -1)
        lb += sum(counts[e] * float(probs[:, e].mean()) for e in range(E))
        router_z += sum(float(torch.logsumexp(layer[i], 0)) ** 2 for i in range(N)) / N
    lb *= E / (len(router) * N * k)
    for term, want in (("lm_z", lm_z), ("lb", lb), ("router_z", router_z)):
        assert abs(float(got[term]) - want) < 1e-9 * max(1.0, abs(want)), (term, got[term], want)
    total = float(got["ce"]) + 0.3 * lm_z + 0.7 * lb + 0.11 * router_z
    assert abs(float(got["total"]) - total) < 1e-9 * abs(total)
    # Gradients: lb differentiates only through the mean probabilities (counts constant),
    # so it matches finite differences wherever the top-k sets do not change.
    r = router[0][:12].clone().requires_grad_(True)

    def lb_only(x):
        return moe_losses(logits[:1, :2], targets[:1, :2], (x,), k)["lb"]
    assert torch.autograd.gradcheck(lb_only, (r,), eps=1e-7, atol=1e-8, fast_mode=True), "lb gradient"
    print("loss formulas: ok (CE vs HF ForCausalLMLoss, lb vs HF aux loss at L=1, loops, gradcheck)")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    spes_bin, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    hf_logging.disable_progress_bar()
    check_loss_formulas()
    report = Report()
    for index, (name, model_type, extra, batch, seq, dtype) in enumerate(CONFIGS):
        model_dir = os.path.join(work, name)
        seed = 1000 + index
        while True:   # first seed whose routing has no near-ties (see module docstring)
            model = build_model(model_type, extra, seed)
            rng = np.random.default_rng(seed)
            # Longer than needed: debug-step must use only the first B*(T+1) tokens.
            tokens = rng.integers(0, USED_TOKENS, size=batch * (seq + 1) + 37)
            ref64 = copy.deepcopy(model).double()
            gap = reference_step(ref64, tokens, batch, seq, MIXED)[3]
            if gap >= MIN_ROUTING_GAP:
                break
            seed += 100
        model.save_pretrained(model_dir, safe_serialization=True)
        check_saved_layout(model, os.path.join(model_dir, "model.safetensors"))
        token_path = os.path.join(model_dir, f"tokens.{dtype}")
        tokens.astype("<u2" if dtype == "uint16" else "<u4").tofile(token_path)
        all_grads = set(by_checkpoint_name(ref64, lambda p: p))

        runs = [("mixed", MIXED, None)]
        if index == 0:
            runs += [(f"lmz{w[0]:g}_lb{w[1]:g}_rz{w[2]:g}", w, None) for w in ISOLATED]
            runs += [("frozen", MIXED, FROZEN_EXPERTS)]
        for tag, weights, trainable in runs:
            label = f"{name}/{tag}"
            logits, losses, grads, gap = reference_step(ref64, tokens, batch, seq, weights)
            noise = fp32_noise(model, tokens, batch, seq, weights, (logits, losses, grads))
            expected = all_grads
            if trainable:
                expected = {n for n in all_grads
                            if ".experts." not in n or trainable[0] <= int(n.split(".experts.")[1].split(".")[0]) <= trainable[1]}
            out_path = os.path.join(model_dir, f"ours_{tag}.safetensors")
            try:
                ours = run_ours(spes_bin, model_dir, token_path, dtype, batch, seq, weights, out_path, trainable)
            except RuntimeError as err:
                report.failures.append(f"{label}: {err}")
                continue
            before = len(report.failures)
            compare_run(report, label, ours, (logits, losses, grads), noise, expected)
            if trainable:   # frozen experts must not change trainable gradients at all
                full = load_numpy(os.path.join(model_dir, "ours_mixed.safetensors"))
                for key in sorted(k for k in ours if k.startswith("grad.")):
                    if key in full and not np.array_equal(ours[key], full[key]):
                        report.failures.append(f"{label}: {key} not bitwise equal to the all-trainable run "
                                               f"(max diff {np.abs(ours[key] - full[key]).max():.3e})")
            status = "ok" if len(report.failures) == before else "MISMATCH"
            print(f"{label}: {status}  (routing gap {gap:.1e}, losses ce={losses['ce']:.6f} "
                  f"lm_z={losses['lm_z']:.4f} lb={losses['lb']:.6f} router_z={losses['router_z']:.4f})")
    print(f"worst relative error {report.worst[0]:.3e} ({report.worst[1]}), tolerance {RTOL:.0e}")
    for line in report.failures[:60]:
        print("FAIL " + line)
    if len(report.failures) > 60:
        print(f"... and {len(report.failures) - 60} more failures")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
