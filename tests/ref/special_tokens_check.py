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
3. An OLMoE config.json without the three keys (and no generation_config.json): AutoConfig fills
   in OlmoeConfig's eos 50279 and pad 1 (an explicit null stays None), but transformers' generate
   reads config.json's keys as they are (GenerationConfig.from_pretrained(config_file_name=
   "config.json")) and runs past 50279. The export leaves the keys out again, so AutoConfig reads
   the same ids from it (it used to write null: None), and generates as the source does, in
   transformers and in `spes generate`.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoConfig, AutoModelForCausalLM, GenerationConfig, OlmoeConfig, OlmoeForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)
from transformers.utils import logging as hf_logging

from ref_checks import check, must, run, summary, stop_and_unused  # noqa: E402

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


OLMOE_VOCAB = 50304   # OLMoE-1B-7B's: OlmoeConfig's default eos 50279 is one of its tokens


def olmoe_model(work, name, **ids):
    """A tiny random OLMoE saved by transformers; config.json holds exactly `ids` of the three keys."""
    cfg = OlmoeConfig(hidden_size=32, intermediate_size=16, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, vocab_size=OLMOE_VOCAB, num_experts=4, num_experts_per_tok=2,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(5)
    model = OlmoeForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
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
    os.remove(os.path.join(path, "generation_config.json"))   # transformers then builds it from config.json
    return path


def swap_tokens(model_dir, a, b):
    """Swaps tokens a and b in the embedding and lm_head: the same model under renamed tokens, so a
    greedy run that made a makes b there instead."""
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = tensors[name]
        w[[a, b]] = w[[b, a]]
    save_file(tensors, path, metadata={"format": "pt"})


def hf_ids(model_dir):
    hf = AutoConfig.from_pretrained(model_dir)
    return hf.bos_token_id, hf.eos_token_id, hf.pad_token_id


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

    # 3. OLMoE without the keys: OlmoeConfig's defaults eos 50279 and pad 1 in AutoConfig, none in generate.
    olmoe_eos = 50279
    src = olmoe_model(work, "olmoe_absent")
    check(hf_ids(src) == (None, olmoe_eos, 1), f"transformers reads an OLMoE config without the keys as bos None, "
          f"eos {olmoe_eos}, pad 1: {hf_ids(src)}")
    olmoe_run = spes_generate(spes, src, stop=False)
    tokens = stop_and_unused(olmoe_run, 1)
    if tokens is None or olmoe_eos in olmoe_run:
        check(False, f"greedy run {olmoe_run} has no new token after step 2, or makes {olmoe_eos} (pick another seed)")
        return summary()
    t = tokens[0]
    swap_tokens(src, t, olmoe_eos)   # the run now makes 50279 where it made t
    expected = [olmoe_eos if i == t else i for i in olmoe_run]
    theirs = hf_generate(src)
    check(theirs == expected, f"transformers' generate runs past {olmoe_eos} (config.json has no eos key): {theirs}")
    check(spes_generate(spes, src, stop=True) == theirs, "spes generate too")
    ex = os.path.join(work, "olmoe_absent_export")
    must([spes, "export", "--checkpoint", src, "--out", ex], "spes export of the OLMoE without the keys")
    config = json.load(open(os.path.join(ex, "config.json")))
    check(hf_ids(ex) == (None, olmoe_eos, 1), f"the export reads in AutoConfig as the source did: {hf_ids(ex)} "
          f"(its config.json: {ids_of(config)})")
    hf_gen = GenerationConfig.from_pretrained(ex)
    check((hf_gen.eos_token_id, hf_gen.pad_token_id) == (None, None),
          f"its generation_config.json has the ids transformers' generate took from the source's config.json "
          f"(none): {hf_gen.eos_token_id}, {hf_gen.pad_token_id}")
    check(hf_generate(ex) == theirs and spes_generate(spes, ex, stop=True) == theirs,
          "the export generates as the source did, in transformers and in spes generate")
    # An explicit null is None in transformers, whatever OlmoeConfig's default: no stop, null exported.
    nulls = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    null_src = os.path.join(work, "olmoe_null")
    shutil.copytree(src, null_src)
    json.dump(dict(json.load(open(os.path.join(src, "config.json"))), **nulls),
              open(os.path.join(null_src, "config.json"), "w"), indent=2)
    ex = os.path.join(work, "olmoe_null_export")
    must([spes, "export", "--checkpoint", null_src, "--out", ex], "spes export of the OLMoE with null ids")
    check(hf_ids(null_src) == hf_ids(ex) == (None, None, None), f"null ids stay None: {hf_ids(ex)}")
    check(len(spes_generate(spes, ex, stop=True)) == NEW, "with eos null, spes generate runs all the new tokens")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
