"""A dense model's generation_config.json through upcycle, training and export, against transformers.

Usage: generation_config_check.py SPES_BIN WORK_DIR     (exit 0 = pass, 1 = fail)

A tiny dense Qwen3 shaped like the real ones: config.json has eos_token_id x alone, its
generation_config.json eos_token_id [x, t] (Qwen3: 151645 in config.json, [151645, 151643]
there) plus sampling settings (do_sample, temperature, top_k, top_p). Checked:
  1. `spes upcycle` writes that generation_config.json byte for byte (it used to build one from
     config.json: eos x alone, the sampling settings gone), and so does `spes export` of it;
  2. `spes train` with load_path = the upcycled directory keeps a copy in each checkpoint, a
     resumed run keeps it after load_path has been moved away (from the checkpoint it resumed),
     and `spes export` of the save_folder writes it;
  3. transformers' generate (greedy) stops after t, generation_config.json's id (config.json's x
     alone would let it run on), and `spes generate` stops there too (it stopped at config.json's
     ids only); beside a generation_config.json without eos_token_id, config.json's id stops
     neither;
  4. a generation_config.json naming an eos id outside the vocabulary is refused by upcycle,
     naming the file and the key.
"""
import json
import os
import shutil
import struct
import sys

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from ref_checks import check, run, must, summary, stop_and_unused  # noqa: E402

VOCAB = 96
PROMPT = "AB"   # bytes 65, 66: ids inside the vocabulary with --tokenizer bytes
NEW = 12
def dense_model(path, eos):
    cfg = Qwen3Config(hidden_size=48, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
                      bos_token_id=eos[1], eos_token_id=eos[0], pad_token_id=eos[1])
    torch.manual_seed(3)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0 + 0.2 * torch.randn(p.shape))
    model.save_pretrained(path)
    return model


def greedy(model_or_dir):
    model = model_or_dir if not isinstance(model_or_dir, str) else \
        AutoModelForCausalLM.from_pretrained(model_or_dir, dtype=torch.float32)
    prompt = torch.tensor([list(PROMPT.encode())])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=NEW, do_sample=False)
    return out[0, prompt.shape[1]:].tolist()


def spes_generate(spes, model_dir):
    code, log = run([spes, "generate", "--model", model_dir, "--tokenizer", "bytes", "--prompt", PROMPT,
                     "--temperature", "0", "--max_new_tokens", str(NEW), "--print_ids"])
    check(code == 0, f"spes generate on {os.path.basename(model_dir)} exits 0" + ("" if code == 0 else ": " + log))
    return [int(x) for x in log.splitlines()[0].split()] if code == 0 else []


def train_yaml(work, tokens, load_path):
    path = os.path.join(work, "train.yaml")
    with open(path, "w") as f:
        f.write(f"""run_name: genconfig
seed: 1
load_path: {load_path}
model:
  d_model: 48
  n_heads: 4
  n_kv_heads: 2
  head_dim: 16
  n_layers: 2
  mlp_hidden_size: 80
  max_sequence_length: 32
  vocab_size: {VOCAB}
  embedding_size: {VOCAB}
  eos_token_id: 0
  pad_token_id: 1
  attention_layer_norm: true
  attention_layer_norm_over_head: true
  moe_num_experts: 4
  moe_top_k: 2
  moe_normalize_expert_weights: true
optimizer:
  name: adamw
  learning_rate: 1.0e-4
scheduler:
  name: constant
global_train_batch_size: 4
device_train_microbatch_size: 4
save_interval_unsharded: 2
console_log_interval: 1
data:
  paths: [{tokens}]
  memmap_dtype: uint16
""")
    return path


def main():
    spes, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    # t: a token greedy decoding reaches after a few steps; x: one it never makes.
    probe = dense_model(os.path.join(work, "probe"), (0, 1))
    probe.generation_config.eos_token_id = None
    free_run = greedy(probe)
    tokens = stop_and_unused(free_run, VOCAB)
    if tokens is None:
        check(False, f"greedy run {free_run} has no new token after step 2 (pick another seed)")
        return 1
    t, x = tokens

    dense = os.path.join(work, "dense")
    dense_model(dense, (x, t))
    gen = {"bos_token_id": t, "do_sample": True, "eos_token_id": [x, t], "pad_token_id": t, "temperature": 0.6,
           "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}
    gen_text = json.dumps(gen, indent=2) + "\n"
    with open(os.path.join(dense, "generation_config.json"), "w") as f:
        f.write(gen_text)
    check(json.load(open(os.path.join(dense, "config.json")))["eos_token_id"] == x, f"dense config.json: eos {x} alone")

    def same_file(d, what):
        path = os.path.join(d, "generation_config.json")
        got = open(path).read() if os.path.exists(path) else "(none)"
        check(got == gen_text, f"{what}: generation_config.json is the dense model's, unchanged"
              + ("" if got == gen_text else f": {got}"))

    # 1. upcycle, export.
    up, ex = os.path.join(work, "moe"), os.path.join(work, "moe_export")
    must([spes, "upcycle", "--dense", dense, "--out", up, "--num_experts", "4", "--top_k", "2"], "spes upcycle")
    same_file(up, "upcycle")
    must([spes, "export", "--checkpoint", up, "--out", ex], "spes export of the upcycled model")
    same_file(ex, "export of the upcycled model")
    hf_gen = GenerationConfig.from_pretrained(ex)
    check((hf_gen.eos_token_id, hf_gen.do_sample, hf_gen.temperature, hf_gen.top_k, hf_gen.top_p) == ([x, t], True, 0.6, 20, 0.95),
          f"transformers reads eos [{x}, {t}] and the sampling settings from the export")

    # 2. training from load_path, resume without it, export of the save_folder.
    tokens = os.path.join(work, "tokens.npy")
    ids = [(i * 37 + 11) % VOCAB for i in range(16 * 32)]
    open(tokens, "wb").write(struct.pack("<%dH" % len(ids), *ids))
    moved = up + "_moved"
    yaml = train_yaml(work, tokens, up)
    save = os.path.join(work, "run")
    must([spes, "train", yaml, "--save_folder=" + save, "--max_duration=2"], "spes train from load_path")
    same_file(os.path.join(save, "step2"), "checkpoint step2")
    shutil.move(up, moved)
    must([spes, "train", yaml, "--save_folder=" + save, "--max_duration=4", "--resume"],
         "spes train --resume with load_path moved away")
    same_file(os.path.join(save, "step4"), "checkpoint step4 (resumed)")
    trained = os.path.join(work, "trained_export")
    must([spes, "export", "--checkpoint", save, "--out", trained], "spes export of the save_folder")
    same_file(trained, "export of the trained checkpoint")

    # 2b. a source "generation_config.json" that is no file (a directory) is none, as
    # transformers' from_pretrained takes it (it builds one from config.json): the run goes on and
    # its checkpoints have none.
    odd = os.path.join(work, "moe_odd")
    shutil.copytree(moved, odd)
    os.remove(os.path.join(odd, "generation_config.json"))
    os.mkdir(os.path.join(odd, "generation_config.json"))
    save_odd = os.path.join(work, "run_odd")
    must([spes, "train", train_yaml(work, tokens, odd), "--save_folder=" + save_odd, "--max_duration=2"],
         "spes train from a load_path whose generation_config.json is a directory")
    check(not os.path.exists(os.path.join(save_odd, "step2", "generation_config.json")), "and step2 has none")

    # 3. generation stops at generation_config.json's ids, in transformers and in spes (a copy of
    # the export, so that this holds whatever the export wrote); a generation_config.json without
    # eos_token_id stops nowhere, config.json's id notwithstanding, in both.
    gen_dir = os.path.join(work, "gen_dir")
    shutil.copytree(ex, gen_dir)
    with open(os.path.join(gen_dir, "generation_config.json"), "w") as f:
        f.write(gen_text)
    theirs = greedy(gen_dir)
    check(theirs == free_run[:free_run.index(t) + 1], f"transformers stops after {t} (generation_config.json's): {theirs}")
    ours = spes_generate(spes, gen_dir)
    check(ours == theirs, f"spes generate stops there too: {ours}")
    config = json.load(open(os.path.join(gen_dir, "config.json")))
    json.dump(dict(config, eos_token_id=t), open(os.path.join(gen_dir, "config.json"), "w"), indent=2)
    json.dump({"do_sample": False}, open(os.path.join(gen_dir, "generation_config.json"), "w"))
    theirs = greedy(gen_dir)
    check(theirs == free_run, f"transformers: config.json's eos {t} unused beside a generation_config.json without one")
    ours = spes_generate(spes, gen_dir)
    check(ours == theirs, f"spes generate runs on too: {ours}")

    # 4. a broken generation_config.json is refused, naming it.
    with open(os.path.join(dense, "generation_config.json"), "w") as f:
        json.dump(dict(gen, eos_token_id=[x, VOCAB + 5]), f)
    bad = os.path.join(work, "bad")
    code, log = run([spes, "upcycle", "--dense", dense, "--out", bad, "--num_experts", "4", "--top_k", "2"])
    last = log.strip().splitlines()[-1] if log.strip() else "(no output)"
    check(code != 0 and "dense/generation_config.json" in log and "eos_token_id[1]" in log,
          f"an eos id outside the vocabulary is refused: {last}")
    check(not os.path.exists(bad), "and nothing is written")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
