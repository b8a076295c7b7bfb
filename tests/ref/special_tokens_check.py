"""Special token ids (bos, eos, pad) through `spes upcycle` and `spes export`, against transformers.

Usage: special_tokens_check.py SPES_BIN WORK_DIR     (exit 0 = pass, 1 = fail)

1. A dense Qwen3 whose config.json has no bos/eos/pad key (Qwen3Config's default for each is
   None): the upcycled model and its export say "none" as transformers writes it (null), not
   invented ids (eos 0, pad 1 used to be written), in config.json and generation_config.json;
   transformers loads both with None.
2. A dense Qwen3 with bos_token_id, an eos_token_id list [x, t] and pad_token_id: both files
   carry the three as given (the list used to shrink to x, bos to be dropped); transformers
   loads them; greedy generation stops after t (which the model produces, x it never does)
   in transformers and in `spes generate`, with the same tokens.
"""
import json
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from ref_checks import check, run, summary, stop_and_unused  # noqa: E402

VOCAB = 96
PROMPT = "AB"   # bytes 65, 66: ids inside the vocabulary with --tokenizer bytes
NEW = 12
def ids_of(config):
    return {k: config.get(k, "absent") for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def dense_model(work, name, **ids):
    """A tiny random dense Qwen3 saved by transformers; its config.json then holds exactly `ids`."""
    cfg = Qwen3Config(hidden_size=48, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0 + 0.2 * torch.randn(p.shape))
    path = os.path.join(work, name)
    model.save_pretrained(path)
    config_path = os.path.join(path, "config.json")
    config = json.load(open(config_path))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config.pop(key, None)
    config.update(ids)
    json.dump(config, open(config_path, "w"), indent=2)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)   # the ids under test are config.json's
    return path


def upcycle_and_export(spes, work, dense, name):
    up, ex = os.path.join(work, name + "_moe"), os.path.join(work, name + "_export")
    code, log = run([spes, "upcycle", "--dense", dense, "--out", up, "--num_experts", "4", "--top_k", "2",
                     "--router_init", "normal"])
    check(code == 0, f"{name}: spes upcycle exits 0" + ("" if code == 0 else ": " + log))
    code, log = run([spes, "export", "--checkpoint", up, "--out", ex])
    check(code == 0, f"{name}: spes export exits 0" + ("" if code == 0 else ": " + log))
    return up, ex


def spes_generate(spes, model_dir, stop):
    code, log = run([spes, "generate", "--model", model_dir, "--tokenizer", "bytes", "--prompt", PROMPT,
                     "--temperature", "0", "--max_new_tokens", str(NEW), "--print_ids"] + ([] if stop else ["--no_stop"]))
    check(code == 0, f"spes generate on {os.path.basename(model_dir)} exits 0" + ("" if code == 0 else ": " + log))
    return [int(x) for x in log.splitlines()[0].split()] if code == 0 else []


def hf_generate(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = torch.tensor([list(PROMPT.encode())])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW, do_sample=False)
    return out[0, prompt.shape[1]:].tolist()


def main():
    spes, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    # 1. No ids at all.
    dense = dense_model(work, "none")
    for d in upcycle_and_export(spes, work, dense, "none"):
        base = os.path.basename(d)
        config = json.load(open(os.path.join(d, "config.json")))
        gen = json.load(open(os.path.join(d, "generation_config.json")))
        check(config.get("eos_token_id") is None and config.get("pad_token_id") is None
              and config.get("bos_token_id") is None, f"{base}: config.json invents no id: {ids_of(config)}")
        check(gen["eos_token_id"] is None and gen["pad_token_id"] is None and gen["bos_token_id"] is None,
              f"{base}: generation_config.json invents no id: {ids_of(gen)}")
        hf, hf_gen = AutoConfig.from_pretrained(d), GenerationConfig.from_pretrained(d)
        check((hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (None, None, None)
              and (hf_gen.bos_token_id, hf_gen.eos_token_id, hf_gen.pad_token_id) == (None, None, None),
              f"{base}: transformers reads bos, eos, pad None (as from the dense config)")
    free_run = spes_generate(spes, os.path.join(work, "none_moe"), stop=True)
    check(len(free_run) == NEW, f"no eos: spes generate runs the {NEW} tokens: {free_run}")

    # 2. bos, an eos list and pad. t: a token greedy decoding reaches after a few steps; x: one it never makes.
    tokens = stop_and_unused(free_run, VOCAB)
    if tokens is None:
        check(False, f"greedy run {free_run} has no new token after step 2 (pick another seed)")
        return 1
    t, x = tokens
    ids = {"bos_token_id": 5, "eos_token_id": [x, t], "pad_token_id": 7}
    dense = dense_model(work, "list", **ids)
    up, ex = upcycle_and_export(spes, work, dense, "list")
    for d in (up, ex):
        base = os.path.basename(d)
        config = json.load(open(os.path.join(d, "config.json")))
        gen = json.load(open(os.path.join(d, "generation_config.json")))
        check(ids_of(config) == ids, f"{base}: config.json carries {ids}: {ids_of(config)}")
        check(ids_of(gen) == ids, f"{base}: generation_config.json carries {ids}: {ids_of(gen)}")
        hf, hf_gen = AutoConfig.from_pretrained(d), GenerationConfig.from_pretrained(d)
        check((hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (5, [x, t], 7) and hf_gen.eos_token_id == [x, t],
              f"{base}: transformers reads them back")
    theirs = hf_generate(ex)
    ours = spes_generate(spes, ex, stop=True)
    check(theirs == free_run[:free_run.index(t) + 1], f"transformers stops after eos {t} (the list's second id): {theirs}")
    check(ours == theirs, f"spes generate stops there too: {ours}")
    check(spes_generate(spes, ex, stop=False) == free_run, "--no_stop: the full run again")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
