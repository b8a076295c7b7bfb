"""Special token ids of an upcycled model through `spes train` checkpoints and `spes export`.

Usage: upcycle_train_token_ids_check.py SPES_BIN WORK_DIR     (exit 0 = pass, 1 = fail)

A tiny dense Qwen3 shaped like the real ones (config.json: bos_token_id B, an eos_token_id list
[X, B], no pad_token_id key; Qwen3: bos 151643, eos 151645 / [151645, 151643]), upcycled, then
trained from load_path with a YAML that sets no model.eos_token_id / model.pad_token_id:
  1. every checkpoint's config.json carries the source's ids (bos, the list, pad left out), also
     after a resume with load_path moved away, and so does the export of the save_folder:
     AutoConfig reads the same ids as from the upcycled model (the checkpoint used to take the
     YAML's ids: its defaults eos 50256 and pad 50256, GPT-2's, and no bos);
  2. a YAML eos among the source's list keeps the list, silently;
  3. a YAML eos and pad the source does not have win (the YAML is what the user said), and the
     eos that contradicts the source's is said once on stderr, naming both.
"""
import json
import os
import shutil
import struct
import sys

import torch
from transformers import AutoConfig, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from ref_checks import check, must, summary  # noqa: E402

VOCAB = 50304   # above the YAML's default eos / pad (50256), which config validation checks against it
BOS, EOS_LIST = 50301, [50300, 50301]


def dense_model(path):
    cfg = Qwen3Config(hidden_size=32, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      num_hidden_layers=1, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.save_pretrained(path)
    config_path = os.path.join(path, "config.json")
    config = json.load(open(config_path))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config.pop(key, None)
    config.update(bos_token_id=BOS, eos_token_id=EOS_LIST)
    json.dump(config, open(config_path, "w"), indent=2)


def train_yaml(work, tokens, load_path):
    path = os.path.join(work, "train.yaml")
    with open(path, "w") as f:
        f.write(f"""run_name: token_ids
seed: 1
load_path: {load_path}
model:
  d_model: 32
  n_heads: 4
  n_kv_heads: 2
  head_dim: 8
  n_layers: 1
  mlp_hidden_size: 64
  max_sequence_length: 32
  vocab_size: {VOCAB}
  embedding_size: {VOCAB}
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
global_train_batch_size: 2
device_train_microbatch_size: 2
save_interval_unsharded: 2
console_log_interval: 1
data:
  paths: [{tokens}]
  memmap_dtype: uint16
""")
    return path


def ids_in(model_dir):
    """The three keys of config.json as written ("absent" for a missing one), and as AutoConfig reads them."""
    config = json.load(open(os.path.join(model_dir, "config.json")))
    hf = AutoConfig.from_pretrained(model_dir)
    return ({k: config.get(k, "absent") for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
            (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id))


def main():
    spes, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    dense, up = os.path.join(work, "dense"), os.path.join(work, "moe")
    dense_model(dense)
    must([spes, "upcycle", "--dense", dense, "--out", up, "--num_experts", "4", "--top_k", "2"], "spes upcycle")
    source = ids_in(up)
    check(source == ({"bos_token_id": BOS, "eos_token_id": EOS_LIST, "pad_token_id": "absent"}, (BOS, EOS_LIST, None)),
          f"the upcycled model has the dense model's ids: {source}")

    tokens = os.path.join(work, "tokens.npy")
    ids = [(i * 37 + 11) % 200 for i in range(8 * 32)]
    open(tokens, "wb").write(struct.pack("<%dH" % len(ids), *ids))
    yaml = train_yaml(work, tokens, up)

    # 1. The YAML sets no ids: the source's, through checkpoints, a resume without load_path, export.
    save = os.path.join(work, "run")
    must([spes, "train", yaml, "--save_folder=" + save, "--max_duration=2"], "spes train from load_path")
    got = ids_in(os.path.join(save, "step2"))
    check(got == source, f"checkpoint step2 has the source's ids, not the YAML's defaults: {got}")
    moved = up + "_moved"
    shutil.move(up, moved)
    must([spes, "train", yaml, "--save_folder=" + save, "--max_duration=4", "--resume"],
         "spes train --resume with load_path moved away")
    got = ids_in(os.path.join(save, "step4"))
    check(got == source, f"checkpoint step4 (resumed, load_path gone) too: {got}")
    exported = os.path.join(work, "export")
    must([spes, "export", "--checkpoint", save, "--out", exported], "spes export of the save_folder")
    got = ids_in(exported)
    check(got == source, f"the export reads in AutoConfig as the upcycled model did: {got}")
    shutil.move(moved, up)

    # 2. A YAML eos among the source's list: the list stays, nothing said.
    save = os.path.join(work, "run_in_list")
    log = must([spes, "train", yaml, "--save_folder=" + save, "--max_duration=2",
                f"--model.eos_token_id={EOS_LIST[1]}"], "spes train with the YAML's eos among the source's")
    got = ids_in(os.path.join(save, "step2"))
    check(got == source, f"the source's list is kept: {got}")
    check("special token ids" not in log, "and no warning")

    # 3. A YAML eos the source contradicts and a pad it lacks: the YAML's, the eos said once.
    save = os.path.join(work, "run_yaml")
    log = must([spes, "train", yaml, "--save_folder=" + save, "--max_duration=4", "--model.eos_token_id=7",
                "--model.pad_token_id=9"], "spes train with the YAML's own eos and pad")
    for step in ("step2", "step4"):
        got = ids_in(os.path.join(save, step))
        check(got == ({"bos_token_id": BOS, "eos_token_id": 7, "pad_token_id": 9}, (BOS, 7, 9)),
              f"{step}: the YAML's eos and pad, the source's bos: {got}")
    warnings = [line for line in log.splitlines() if "special token ids" in line]
    check(len(warnings) == 1 and "command line: model.eos_token_id 7" in warnings[0]
          and str(EOS_LIST).replace(" ", "") in warnings[0].replace(" ", "") and "pad_token_id" not in warnings[0],
          f"one warning names the YAML's eos and the source's list (the pad contradicts nothing): {warnings}")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
