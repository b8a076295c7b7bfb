"""`spes upcycle` of a tiny dense Qwen3ForCausalLM written by transformers.

Usage: upcycle_check.py SPES_BIN WORK_DIR     (exit 0 = pass, 1 = fail)

The dense model ties its embeddings (tie_word_embeddings true, no lm_head tensor in the
file) and sets head_dim explicitly (16, with hidden 48 and 4 heads). For every router init
(zeros, normal, scaled_normal, mlp_based), with zero noise:
  - transformers loads the result as Qwen3MoeForCausalLM and its logits equal the dense
    model's (within 1e-5 of the logit scale): every expert is the dense MLP and
    norm_topk_prob makes the top-k weights sum to 1, so the MoE layer is the dense MLP;
  - our own forward (`spes eval` loss on a token file) equals the dense model's loss.
With noise (std 0.02 on half the elements): the experts differ from the dense MLP in about
half of their elements, differ from each other, and the logits move away from the dense ones.
A Llama-style dense model (no QK-norm) upcycles but cannot be written as an HF MoE: refused
with a clear message. And: mlp_based routers are the mean of E disjoint gate_proj row groups.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from ref_checks import check, run, summary  # noqa: E402

SEQ = 12
E, K = 4, 2
def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    model.eval()
    return model


def logits_of(model, tokens):
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.double().numpy()


def window_loss(model, stream):
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, SEQ):
        w = stream[start:start + SEQ + 1]
        logits = torch.as_tensor(logits_of(model, w[None, :-1])[0])
        total += float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(w[1:], dtype=torch.long), reduction="sum"))
        count += len(w) - 1
    return total / count


def main():
    spes, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cfg = Qwen3Config(hidden_size=48, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_hidden_layers=2, vocab_size=96, max_position_embeddings=64, rope_theta=3000.0,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=0, pad_token_id=1)
    dense = randomize(Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32), 3)
    assert dense.lm_head.weight.data_ptr() == dense.model.embed_tokens.weight.data_ptr()
    dense_dir = os.path.join(work, "dense")
    dense.save_pretrained(dense_dir)
    check("lm_head.weight" not in load_file(os.path.join(dense_dir, "model.safetensors")),
          "the dense checkpoint has no lm_head tensor (tied)")
    rng = np.random.default_rng(1)
    stream = rng.integers(0, 96, size=3 * SEQ + 4)
    token_path = os.path.join(work, "tokens.u16")
    stream.astype("<u2").tofile(token_path)
    tokens = stream[: 2 * SEQ].reshape(2, SEQ)
    ref = logits_of(dense, tokens)
    scale = np.abs(ref).max()
    ref_loss = window_loss(dense, stream)

    for router in ("zeros", "normal", "scaled_normal", "mlp_based"):
        out = os.path.join(work, f"moe_{router}")
        code, log = run([spes, "upcycle", "--dense", dense_dir, "--out", out, "--num_experts", str(E), "--top_k", str(K),
                         "--router_init", router, "--seed", "5"])
        check(code == 0, f"{router}: spes upcycle exits 0" + ("" if code == 0 else ": " + log))
        if code != 0:
            continue
        moe_cfg = json.load(open(os.path.join(out, "config.json")))
        check(moe_cfg["model_type"] == "qwen3_moe" and moe_cfg["norm_topk_prob"] is True
              and moe_cfg["moe_intermediate_size"] == 40 and moe_cfg["head_dim"] == 16
              and moe_cfg["tie_word_embeddings"] is False, f"{router}: config is qwen3_moe, norm_topk_prob, head_dim 16")
        moe = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        check(type(moe).__name__ == "Qwen3MoeForCausalLM", f"{router}: transformers loads {type(moe).__name__}")
        err = np.abs(logits_of(moe, tokens) - ref).max()
        check(err <= 1e-5 * scale, f"{router}: MoE logits (transformers) = dense logits, max diff {err / scale:.2e} of scale")
        code, log = run([spes, "eval", "--model", out, "--tokens", token_path, "--seq", str(SEQ), "--no_progress"])
        loss = float(log.split("loss=")[1].split()[0]) if code == 0 else None
        check(loss is not None and abs(loss - ref_loss) <= 1e-5 * ref_loss,
              f"{router}: our MoE loss {loss} = dense loss {ref_loss:.6f}" + ("" if code == 0 else ": " + log))
        w = load_file(os.path.join(out, "model.safetensors"))
        r = w["model.layers.0.mlp.gate.weight"]
        if router == "zeros":
            check(bool((r == 0).all()), "zeros: router all zero")
        elif router == "normal":
            check(abs(float(r.std()) - 0.02) < 0.006, f"normal: router std {float(r.std()):.4f} ~ 0.02")
        elif router == "scaled_normal":
            check(abs(float(r.std()) - 48 ** -0.5) < 0.04, f"scaled_normal: router std {float(r.std()):.4f} ~ 1/sqrt(48)")
        else:
            gate = load_file(os.path.join(dense_dir, "model.safetensors"))["model.layers.0.mlp.gate_proj.weight"].double()
            # Each router row is the mean of a group of gate rows; the groups partition the rows,
            # so the rows of the router sum (times the group size 10) to the sum of all gate rows.
            check(torch.allclose(r.double().sum(0) * 10, gate.sum(0), atol=1e-4),
                  "mlp_based: router rows = means of a partition of gate_proj rows")

    # Noise: about half the elements moved, experts differ, the function changes.
    out = os.path.join(work, "moe_noisy")
    code, log = run([spes, "upcycle", "--dense", dense_dir, "--out", out, "--num_experts", str(E), "--top_k", str(K),
                     "--noise_std", "0.02", "--noise_fraction", "0.5", "--seed", "9"])
    if code == 0:
        w = load_file(os.path.join(out, "model.safetensors"))
        d = load_file(os.path.join(dense_dir, "model.safetensors"))["model.layers.1.mlp.up_proj.weight"]
        e0, e1 = w["model.layers.1.mlp.experts.0.up_proj.weight"], w["model.layers.1.mlp.experts.1.up_proj.weight"]
        frac = float((e0 != d).float().mean())
        check(0.4 < frac < 0.6, f"noise: {frac:.2f} of expert 0's up_proj elements changed (fraction 0.5)")
        check(not torch.equal(e0, e1), "noise: experts differ from each other")
        moe = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        err = np.abs(logits_of(moe, tokens) - ref).max()
        check(err > 1e-4 * scale, f"noise: logits move away from the dense ones ({err / scale:.2e} of scale)")
    else:
        check(False, "noisy upcycle: " + log)

    # Llama: no QK-norm, so no HF MoE class can hold it.
    lcfg = LlamaConfig(hidden_size=32, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=1, vocab_size=64, max_position_embeddings=32, tie_word_embeddings=False)
    llama_dir = os.path.join(work, "llama")
    randomize(LlamaForCausalLM(lcfg), 4).save_pretrained(llama_dir)
    code, log = run([spes, "upcycle", "--dense", llama_dir, "--out", os.path.join(work, "llama_moe"),
                     "--num_experts", "2", "--top_k", "1"])
    check(code != 0 and "no QK-norm" in log, "llama: refused with a clear message: " + log.strip().splitlines()[-1])
    code, log = run([spes, "upcycle", "--dense", dense_dir, "--out", os.path.join(work, "x"), "--num_experts", "2",
                     "--top_k", "3"])
    check(code != 0 and "top_k" in log, "top_k > num_experts refused")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
