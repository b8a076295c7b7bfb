"""The EOS `spes tokenize` appends against the one transformers' AutoTokenizer picks, for tokenizer
directories (../shared/data's gpt-neox-olmo.json as tokenizer.json) whose tokenizer_config.json and
special_tokens_map.json disagree, are missing, or are broken.

Usage: tokenizer_eos_files.py SPES_BIN WORK_DIR TOKENIZER_JSON     (exit 0 = pass, 1 = fail)

Per case: transformers' eos_token_id (or its error) and ours (the last id of the one document, or
a refusal): the same id; None <-> refused for naming no EOS (the message naming both files); an
error <-> refused naming the file. `spes tokenize --help` names both files too.
Where neither file names an EOS, transformers has none and we pick one by convention: not a case here.

Then special tokens the files name and tokenizer.json lacks: transformers appends each as a new
special token with the next id (bos, eos, unk, sep, pad, cls, mask, then the additional / extra
ones) and encodes it wherever a text holds it. Per case the whole id sequence `spes tokenize`
writes for a text holding those tokens against transformers' encoding + its EOS.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from ref_checks import check, summary  # noqa: E402

A, B = "<|padding|>", "<|endoftext|>"
ATD = {"1": {"content": A, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}}
CASES = {   # name: (tokenizer_config.json, special_tokens_map.json); None = no file, str = raw text
    "config only": ({"eos_token": A}, None),
    "map only": (None, {"eos_token": A}),
    "legacy config without eos_token, map": ({"model_max_length": 8}, {"eos_token": A}),
    "legacy config and map both": ({"eos_token": B}, {"eos_token": {"content": A, "special": True}}),
    "legacy config, map null": ({"eos_token": A}, {"eos_token": None}),
    "config with added_tokens_decoder and map": ({"eos_token": A, "added_tokens_decoder": ATD}, {"eos_token": B}),
    "config with added_tokens_decoder, map broken": ({"eos_token": A, "added_tokens_decoder": ATD}, '{"eos_token": '),
    "legacy config, map broken": ({"eos_token": A}, '{"eos_token": '),
    "config broken": ('{"eos_token": ', {"eos_token": A}),
}
MISSING = {   # name: tokenizer_config.json (no special_tokens_map.json)
    "eos missing": {"eos_token": "<|my_eos|>"},
    "bos and eos missing": {"eos_token": "<|my_eos|>", "bos_token": "<|my_bos|>"},
    "eos missing, pad and extras missing, mask present": {
        "eos_token": "<|my_eos|>", "pad_token": "<|my_pad|>", "unk_token": "<|my_unk|>", "mask_token": B,
        "additional_special_tokens": ["<|x1|>", A], "added_tokens_decoder": {}},
    "eos present, named extra missing": {"eos_token": B, "extra_special_tokens": {"image_token": "<|img|>"}},
}
MISSING_TEXT = "hello<|my_pad|> world<|my_eos|> <|x1|><|img|> and<|my_bos|>"


def write(path, value):
    if value is not None:
        with open(path, "w") as f:
            f.write(value if isinstance(value, str) else json.dumps(value))


def main():
    spes, work, tokenizer_json = sys.argv[1], sys.argv[2], sys.argv[3]
    hf_logging.set_verbosity_error()
    text = os.path.join(work, "doc.txt")
    with open(text, "w") as f:
        f.write("hello world")
    for i, (name, (config, special_map)) in enumerate(CASES.items()):
        d = os.path.join(work, f"tok{i}")
        os.makedirs(d)
        shutil.copy(tokenizer_json, os.path.join(d, "tokenizer.json"))
        write(os.path.join(d, "tokenizer_config.json"), config)
        write(os.path.join(d, "special_tokens_map.json"), special_map)
        try:
            theirs = AutoTokenizer.from_pretrained(d).eos_token_id
        except Exception as e:   # noqa: BLE001 (any refusal)
            theirs = "error"
        prefix = os.path.join(work, f"out{i}_")
        res = subprocess.run([spes, "tokenize", "--file_glob", text, "--tokenizer_name_or_path", d, "--output_prefix",
                              prefix], capture_output=True, text=True)
        log = (res.stdout + res.stderr).strip()
        if res.returncode == 0:
            ours = int(np.fromfile(sorted(glob.glob(prefix + "*.npy"))[-1], dtype="<u4")[-1])
        elif "names no EOS" in log:
            ours = None
            # The refusal names both files that can give the EOS (it named tokenizer_config.json alone).
            check("special_tokens_map.json" in log and "tokenizer_config.json" in log,
                  f"{name}: the refusal names both files: {log.splitlines()[-1]}")
        elif "invalid JSON" in log:
            ours = "error"
        else:
            ours = "unexpected: " + log.splitlines()[-1]
        check(ours == theirs, f"{name}: ours {ours}, transformers {theirs}")
    with open(text, "w") as f:
        f.write(MISSING_TEXT)
    for i, (name, config) in enumerate(MISSING.items()):
        d = os.path.join(work, f"missing{i}")
        os.makedirs(d)
        shutil.copy(tokenizer_json, os.path.join(d, "tokenizer.json"))
        write(os.path.join(d, "tokenizer_config.json"), config)
        tok = AutoTokenizer.from_pretrained(d)
        theirs = tok(MISSING_TEXT, add_special_tokens=False).input_ids + [tok.eos_token_id]
        prefix = os.path.join(work, f"missing_out{i}_")
        res = subprocess.run([spes, "tokenize", "--file_glob", text, "--tokenizer_name_or_path", d, "--output_prefix",
                              prefix], capture_output=True, text=True)
        if res.returncode != 0:
            check(False, f"{name}: spes tokenize failed: {(res.stdout + res.stderr).strip().splitlines()[-1]}")
            continue
        ours = np.fromfile(sorted(glob.glob(prefix + "*.npy"))[-1], dtype="<u4").tolist()
        check(ours == theirs, f"{name}: ours {ours}, transformers {theirs}")
    res = subprocess.run([spes, "tokenize", "--help"], capture_output=True, text=True)
    check("special_tokens_map.json" in res.stdout and "tokenizer_config.json" in res.stdout,
          "spes tokenize --help names both files the EOS comes from")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
