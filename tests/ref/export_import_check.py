"""`spes export` / import against Hugging Face transformers, on tiny random models of both
formats (OlmoeForCausalLM: QK-norm full; Qwen3MoeForCausalLM: QK-norm per head).

Usage: export_import_check.py SPES_BIN WORK_DIR     (exit 0 = pass, 1 = fail)

For each format:
 1. a random model (tests/ref/model_vs_hf.py's build_model) saved by save_pretrained stands in
    for a checkpoint: config.json + model.safetensors;
 2. `spes export` writes it as fp32 (one file), fp32 sharded (--max_shard_size 20KB: index +
    many shards) and bf16;
 3. transformers' AutoModelForCausalLM.from_pretrained loads each export; its fp32 logits
    must equal the source model's within 1e-5 of the logit scale (fp32: the weights are
    bit-identical, only rms_norm_eps differs by its fp32 rounding; bf16: against the source
    with its weights rounded to bf16); config.json
    fields must carry everything (eps, rope theta, norm_topk_prob, head_dim, sizes, ids);
 4. ours: `spes debug-step` on the export gives logits within 1e-4 (of the logit scale)
    of transformers' on the same tokens, and `spes eval --tokens` gives the same mean loss
    as transformers over the same windows (1e-5 relative);
 5. import of directories written by transformers itself: save_pretrained sharded
    (max_shard_size 20KB) and in bfloat16: `spes eval` loads them (loss as transformers' on
    the bf16-rounded weights), and `spes export` of the bf16 one reproduces its values
    exactly in fp32;
 6. a directory with a missing and a mis-shaped tensor is refused with both named.
"""
import copy
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_vs_hf import USED_TOKENS, build_model  # noqa: E402
from ref_checks import check, run, summary  # noqa: E402

FORMATS = [
    ("olmoe", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                   norm_topk_prob=True, rope_theta=5000.0, rms_norm_eps=1e-5)),
    ("qwen3_moe", dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       moe_intermediate_size=32, norm_topk_prob=False, rope_theta=2500.0, rms_norm_eps=1e-6,
                       decoder_sparse_step=1, mlp_only_layers=[])),
]
SEQ = 16
def hf_logits(model_dir_or_model, tokens):
    model = model_dir_or_model
    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.double().numpy()


def hf_window_loss(model, stream):
    """Mean CE over spes eval's windows: tokens[w*SEQ .. w*SEQ+SEQ], every token but the first
    predicted once (the last window shorter)."""
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, SEQ):
        window = stream[start:start + SEQ + 1]
        logits = torch.as_tensor(hf_logits(model, window[None, :-1])[0])
        targets = torch.as_tensor(window[1:], dtype=torch.long)
        total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
    return total / count


def spes_eval_loss(spes, model_dir, token_path):
    code, out = run([spes, "eval", "--model", model_dir, "--tokens", token_path, "--dtype", "uint16", "--seq",
                     str(SEQ), "--batch", "2", "--no_progress"])
    if code != 0:
        return None, out
    line = [ln for ln in out.splitlines() if ln.startswith("perplexity:")][0]
    return float(line.split("loss=")[1].split()[0]), out


def bf16_rounded(model):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return m


def main():
    spes, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    rng = np.random.default_rng(0)
    stream = rng.integers(0, USED_TOKENS, size=3 * SEQ + 6).astype(np.int64)
    token_path = os.path.join(work, "tokens.u16")
    stream.astype("<u2").tofile(token_path)
    tokens = stream[: 2 * (SEQ + 1)].reshape(2, SEQ + 1)

    for fmt, extra in FORMATS:
        src = os.path.join(work, f"{fmt}_src")
        model = build_model(fmt, extra, 7)
        model.save_pretrained(src)
        ref = hf_logits(model, tokens[:, :-1])
        scale = np.abs(ref).max()
        src_cfg = json.load(open(os.path.join(src, "config.json")))

        for tag, args in [("f32", []), ("sharded", ["--max_shard_size", "20KB"]), ("bf16", ["--dtype", "bf16"])]:
            out = os.path.join(work, f"{fmt}_{tag}")
            code, log = run([spes, "export", "--checkpoint", src, "--out", out, "--format", fmt] + args)
            check(code == 0, f"{fmt}/{tag}: spes export exits 0" + ("" if code == 0 else f": {log}"))
            if code != 0:
                continue
            files = sorted(os.listdir(out))
            if tag == "sharded":
                index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
                shards = {f for f in files if f.startswith("model-") and f.endswith(".safetensors")}
                check(len(shards) > 1 and set(index["weight_map"].values()) == shards,
                      f"{fmt}/sharded: {len(shards)} shards, all in the index")
            else:
                check("model.safetensors" in files, f"{fmt}/{tag}: single model.safetensors")
            check("generation_config.json" in files, f"{fmt}/{tag}: generation_config.json written")
            cfg = json.load(open(os.path.join(out, "config.json")))
            # rms_norm_eps travels as our fp32 value (1e-5 -> 9.99999975e-06): equal within fp32 rounding.
            check(abs(cfg["rms_norm_eps"] - src_cfg["rms_norm_eps"]) <= 1e-7 * src_cfg["rms_norm_eps"],
                  f"{fmt}/{tag}: config rms_norm_eps = {cfg['rms_norm_eps']!r}")
            for key in ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
                        "num_hidden_layers", "vocab_size", "norm_topk_prob", "num_experts_per_tok",
                        "max_position_embeddings", "eos_token_id", "pad_token_id",
                        "moe_intermediate_size" if fmt == "qwen3_moe" else "intermediate_size"):
                check(cfg.get(key) == src_cfg.get(key), f"{fmt}/{tag}: config {key} = {cfg.get(key)!r}")
            check(cfg.get("tie_word_embeddings") is False, f"{fmt}/{tag}: tie_word_embeddings false")
            check(abs(cfg["rope_parameters"]["rope_theta"] - src_cfg["rope_parameters"]["rope_theta"]) < 1e-3,
                  f"{fmt}/{tag}: rope_theta")
            check(cfg.get("torch_dtype") == ("bfloat16" if tag == "bf16" else "float32"), f"{fmt}/{tag}: torch_dtype")
            got = hf_logits(out, tokens[:, :-1])
            want = ref if tag != "bf16" else hf_logits(bf16_rounded(model), tokens[:, :-1])
            err = np.abs(got - want).max()
            check(err <= 1e-5 * scale,
                  f"{fmt}/{tag}: transformers loads the export, logits vs source max diff {err:.2e}")

        out = os.path.join(work, f"{fmt}_f32")
        # Ours vs transformers on the export: debug-step logits and eval loss.
        dbg = os.path.join(work, f"{fmt}_debug.safetensors")
        code, log = run([spes, "debug-step", "--model", out, "--tokens", token_path, "--batch", "2", "--seq",
                         str(SEQ), "--out", dbg])
        if code == 0:
            ours = load_numpy(dbg)["logits"].astype(np.float64)
            err = np.abs(ours - ref).max()
            check(err <= 1e-4 * scale, f"{fmt}: our logits vs transformers on the export: {err / scale:.2e} of scale")
        else:
            check(False, f"{fmt}: spes debug-step on the export: {log}")
        loss, log = spes_eval_loss(spes, out, token_path)
        want = hf_window_loss(model, stream)
        check(loss is not None and abs(loss - want) <= 1e-5 * want,
              f"{fmt}: spes eval loss {loss} vs transformers {want:.6f}" + ("" if loss is not None else log))

        # Import of what transformers writes: sharded, and bf16.
        hf_sharded = os.path.join(work, f"{fmt}_hf_sharded")
        model.save_pretrained(hf_sharded, max_shard_size="20KB")
        loss, log = spes_eval_loss(spes, hf_sharded, token_path)
        check(loss is not None and abs(loss - want) <= 1e-5 * want,
              f"{fmt}: import of transformers' sharded save ({len(os.listdir(hf_sharded)) - 2} files): loss {loss}"
              + ("" if loss is not None else log))
        hf_bf16 = os.path.join(work, f"{fmt}_hf_bf16")
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(hf_bf16)
        want16 = hf_window_loss(bf16_rounded(model), stream)
        loss, log = spes_eval_loss(spes, hf_bf16, token_path)
        check(loss is not None and abs(loss - want16) <= 1e-5 * want16,
              f"{fmt}: import of transformers' bf16 save: loss {loss} vs {want16:.6f}" + ("" if loss is not None else log))
        back = os.path.join(work, f"{fmt}_bf16_to_f32")
        code, log = run([spes, "export", "--checkpoint", hf_bf16, "--out", back])
        if code == 0:
            a, b = load_file(os.path.join(hf_bf16, "model.safetensors")), load_file(os.path.join(back, "model.safetensors"))
            same = set(a) == set(b) and all(torch.equal(a[k].float(), b[k]) for k in a)
            check(same, f"{fmt}: bf16 import -> f32 export keeps every value exactly")
        else:
            check(False, f"{fmt}: export of the bf16 import: {log}")

    # Missing and mis-shaped tensors are named.
    bad = os.path.join(work, "broken")
    os.makedirs(bad)
    src = os.path.join(work, "olmoe_f32")
    tensors = load_file(os.path.join(src, "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:, :-1].contiguous()
    save_file(tensors, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(bad, "config.json"), "w") as g:
        g.write(f.read())
    code, log = spes_eval_loss(spes, bad, token_path)
    check(code is None and "model.layers.1.mlp.experts.3.up_proj.weight" in log and "1 missing tensor" in log
          and "model.layers.0.self_attn.k_proj.weight is [32, 63], expected [32, 64]" in log,
          "broken directory refused, naming the missing and the mis-shaped tensor: " + log.strip().splitlines()[-1])

    return summary()


if __name__ == "__main__":
    sys.exit(main())
