"""`spes generate`'s defaults from generation_config.json, against transformers' generate.

Usage: generate_defaults_check.py SPES_BIN WORK_DIR     (exit 0 = pass, 1 = fail)

transformers (5.23) takes every generate() setting it is not given from the model directory's
generation_config.json, and what the file lacks from GenerationConfig's global defaults
(do_sample false: greedy; temperature 1, top_k 50, top_p 1). A tiny random OLMoE (vocabulary 96,
the prompt "AB" as bytes), its generation_config.json rewritten per case (without eos_token_id,
so that nothing stops early). Checked, with no sampling flag given to spes:
  1. do_sample false, do_sample absent, and the file our export builds from config.json: greedy,
     equal to transformers' model.generate() token for token (spes sampled at temperature 0.8);
  2. do_sample true with top_k 1, or with top_p 0 (transformers keeps the most likely token
     alone; 0 is "no cut" for --top_p): deterministic, equal to transformers' generate;
  3. do_sample true with temperature/top_k/top_p: the stderr line names them, and the text is
     the one the same flags give beside no generation_config.json; do_sample true alone takes
     transformers' defaults (temperature 1, top_k 50, top_p 1), not ours;
  4. max_new_tokens, and max_length less the prompt, as transformers counts them;
  5. explicit flags win (--temperature 0 over do_sample true; --top_k 1 over the file's top_k);
  6. without generation_config.json the old defaults stay (0.8 / 50 / 0.95) and nothing is said;
  7. do_sample true with temperature 0, and a max_length the prompt fills, are refused naming the
     file, as transformers refuses them;
  8. repetition_penalty (over the prompt and the tokens so far, greedy decoding too) and min_p
     (after top_k / top_p) from the file or --repetition_penalty / --min_p: greedy with a penalty
     equals transformers' token for token, min_p 1 samples transformers' (greedy) text (both used
     to be ignored); keys that would make transformers decode otherwise and that we do not
     implement (num_beams, no_repeat_ngram_size; typical_p when sampling) are named on stderr.
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from lm_eval_check import tiny_olmoe  # noqa: E402  (the tiny OLMoE of the eval checks)
from ref_checks import check, summary  # noqa: E402

VOCAB = 96
PROMPT = "AB"   # bytes 65, 66 with --tokenizer bytes
NEW = 16
def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    return res.returncode, res.stdout, res.stderr


def build_model(path):
    tiny_olmoe(VOCAB, 64, 5).save_pretrained(path)


def set_gen(model_dir, gen):
    path = os.path.join(model_dir, "generation_config.json")
    if gen is None:
        if os.path.exists(path):
            os.remove(path)
    else:
        json.dump(gen, open(path, "w"))


def theirs(model_dir, **kwargs):
    """transformers' generate on the directory, given only kwargs (the rest from its files)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = torch.tensor([list(PROMPT.encode())])
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
    return out[0, prompt.shape[1]:].tolist()


def ours(spes, model_dir, *flags):
    """(new token ids, the stderr line about generation_config.json or None, exit code, stderr)."""
    code, out, err = run([spes, "generate", "--model", model_dir, "--tokenizer", "bytes", "--prompt", PROMPT,
                          "--print_ids", *flags])
    ids = [int(x) for x in out.split()] if code == 0 else None
    line = next((l for l in err.splitlines() if "generation_config.json:" in l), None)
    return ids, line, code, err


def main():
    spes, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = os.path.join(work, "model")
    build_model(model)
    new = ["--max_new_tokens", str(NEW)]
    plain = os.path.join(work, "plain")   # the same weights, no generation_config.json
    shutil.copytree(model, plain)
    set_gen(plain, None)

    set_gen(model, {"do_sample": False})
    greedy = theirs(model, max_new_tokens=NEW)
    check(len(greedy) == NEW, f"transformers' greedy run has {NEW} tokens: {greedy}")
    sampled, _, _, _ = ours(spes, plain, *new)
    check(sampled != greedy, f"the old default (temperature 0.8) differs from greedy here: {sampled}")

    # 1. Greedy: do_sample false, absent, and our export's file built from config.json.
    for name, gen in [("do_sample false", {"do_sample": False}), ("do_sample absent", {"top_k": 20})]:
        set_gen(model, gen)
        hf = theirs(model, max_new_tokens=NEW)
        ids, line, code, err = ours(spes, model, *new)
        check(hf == greedy, f"{name}: transformers is greedy: {hf}")
        check(ids == hf, f"{name}: spes generate equals transformers: {ids}" + ("" if code == 0 else ": " + err))
        check(line is not None and "greedy (do_sample " + ("false)" if "false" in name else "absent") in line,
              f"{name}: stderr says greedy: {line}")
    set_gen(model, None)
    exported = os.path.join(work, "exported")
    code, out, err = run([spes, "export", "--checkpoint", model, "--out", exported])
    check(code == 0, "spes export" + ("" if code == 0 else ": " + err))
    gen = json.load(open(os.path.join(exported, "generation_config.json")))
    check("do_sample" not in gen, f"our export's generation_config.json has no do_sample: {gen}")
    hf = theirs(exported, max_new_tokens=NEW)
    ids, line, _, err = ours(spes, exported, *new)
    check(ids == hf, f"our export's file: spes generate equals transformers' greedy: {ids} vs {hf}")

    # 2. do_sample true cut to one token: deterministic, transformers' greedy text.
    for name, gen in [("top_k 1", {"do_sample": True, "temperature": 0.7, "top_k": 1}),
                      ("top_p 0", {"do_sample": True, "top_p": 0.0})]:
        set_gen(model, gen)
        hf = theirs(model, max_new_tokens=NEW)
        ids, line, code, err = ours(spes, model, *new, "--seed", "3")
        check(hf == greedy, f"{name}: transformers samples the greedy text: {hf}")
        check(ids == hf, f"{name}: spes generate equals it: {ids}" + ("" if code == 0 else ": " + err))
        print("     " + str(line))

    # 3. Sampling settings taken (the same text as the same flags beside no file), and
    # transformers' defaults for the keys the file lacks.
    set_gen(model, {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9})
    ids, line, _, _ = ours(spes, model, *new, "--seed", "7")
    check(line is not None and line.endswith("do_sample true, temperature 0.7, top_k 20, top_p 0.9"),
          f"stderr names the file's settings: {line}")
    same, _, _, _ = ours(spes, plain, *new, "--seed", "7", "--temperature", "0.7", "--top_k", "20", "--top_p", "0.9")
    check(ids is not None and ids == same, f"and samples as those flags do: {ids} vs {same}")
    set_gen(model, {"do_sample": True})
    ids, line, _, _ = ours(spes, model, *new, "--seed", "7")
    same, _, _, _ = ours(spes, plain, *new, "--seed", "7", "--temperature", "1", "--top_k", "50", "--top_p", "1")
    check(ids is not None and ids == same, f"do_sample true alone: temperature 1, top_k 50, top_p 1: {ids} vs {same}")
    check(line is not None and "temperature 1 (transformers' default" in line and
          "top_p 1 (transformers' default" in line, f"stderr says which are transformers' defaults: {line}")

    # 4. Lengths.
    set_gen(model, {"do_sample": False, "max_new_tokens": 5})
    hf, (ids, line, _, _) = theirs(model), ours(spes, model)
    check(hf == greedy[:5] and ids == hf, f"max_new_tokens 5: {ids}, transformers {hf}")
    set_gen(model, {"do_sample": False, "max_length": 9})
    hf, (ids, line, _, _) = theirs(model), ours(spes, model)
    check(hf == greedy[:7] and ids == hf, f"max_length 9 with a 2-token prompt: {ids}, transformers {hf}")
    check(line is not None and "max_new_tokens 7 (max_length 9 less the prompt's 2 tokens)" in line,
          f"stderr says so: {line}")

    # 5. Explicit flags win.
    set_gen(model, {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "max_new_tokens": 5})
    ids, line, _, _ = ours(spes, model, "--temperature", "0", "--max_new_tokens", str(NEW))
    check(ids == greedy and line is None, f"--temperature 0 and --max_new_tokens win, nothing taken: {ids}, {line}")
    ids, line, _, _ = ours(spes, model, "--top_k", "1", "--seed", "9", *new)
    check(ids == greedy and line is not None and "top_k" not in line, f"--top_k 1 wins: {ids}, {line}")

    # 6. No generation_config.json: the old defaults, nothing said.
    ids, line, _, _ = ours(spes, plain, *new, "--seed", "4")
    same, _, _, _ = ours(spes, plain, *new, "--seed", "4", "--temperature", "0.8", "--top_k", "50", "--top_p", "0.95")
    check(ids is not None and ids == same and line is None, f"no file: temperature 0.8, top_k 50, top_p 0.95: {ids}")

    # 7. Refusals, as transformers refuses.
    for name, gen, needle in [("temperature 0 with do_sample true", {"do_sample": True, "temperature": 0.0},
                               '"temperature" 0 with "do_sample" true'),
                              ("max_length the prompt fills", {"max_length": 2}, '"max_length" 2 leaves no room')]:
        set_gen(model, gen)
        try:
            theirs(model)
            hf_refuses = False
        except ValueError:
            hf_refuses = True
        ids, _, code, err = ours(spes, model)
        last = err.strip().splitlines()[-1] if err.strip() else "(no output)"
        check(hf_refuses, f"{name}: transformers refuses it")
        check(code != 0 and "model/generation_config.json" in err and needle in err, f"{name}: refused: {last}")

    # 8. repetition_penalty and min_p, from the file and from the flags.
    for penalty in (2.0, 0.7):
        set_gen(model, {"do_sample": False, "repetition_penalty": penalty})
        hf = theirs(model, max_new_tokens=NEW)
        ids, line, code, err = ours(spes, model, *new)
        check(hf != greedy, f"repetition_penalty {penalty}: transformers' greedy text changes: {hf}")
        check(ids == hf, f"repetition_penalty {penalty}: spes generate equals it: {ids}" + ("" if code == 0 else err))
        check(line is not None and f"repetition_penalty {penalty:g}" in line, f"stderr names it: {line}")
        flag_ids, _, _, _ = ours(spes, plain, *new, "--temperature", "0", "--repetition_penalty", str(penalty))
        check(flag_ids == hf, f"--repetition_penalty {penalty} beside no file: the same: {flag_ids}")
    set_gen(model, {"do_sample": True, "min_p": 1.0})
    hf = theirs(model, max_new_tokens=NEW)
    ids, line, _, _ = ours(spes, model, *new, "--seed", "5")
    check(hf == greedy and ids == hf, f"min_p 1 keeps the most likely token alone, as in transformers: {ids}, {hf}")
    check(line is not None and "min_p 1" in line, f"stderr names it: {line}")
    flag_ids, _, _, _ = ours(spes, plain, *new, "--seed", "5", "--temperature", "1", "--min_p", "1")
    check(flag_ids == greedy, f"--min_p 1: the same: {flag_ids}")
    set_gen(model, {"do_sample": True, "min_p": 1.0, "top_k": 0, "repetition_penalty": 2.0})
    hf = theirs(model, max_new_tokens=NEW)
    ids, _, _, _ = ours(spes, model, *new, "--seed", "5")
    check(ids == hf, f"the penalty before the cut, as transformers orders them: {ids}, {hf}")
    set_gen(model, {"do_sample": False, "num_beams": 4, "no_repeat_ngram_size": 3, "typical_p": 0.5,
                    "length_penalty": 1.0})
    ids, _, code, err = ours(spes, model, *new)
    said = [l for l in err.splitlines() if "not implemented here" in l]
    check(code == 0 and ids == greedy, f"unimplemented keys: still decoded (greedy): {ids}")
    check(len(said) == 1 and "num_beams 4 (one sequence, no beam search)" in said[0]
          and "no_repeat_ngram_size 3" in said[0] and "typical_p" not in said[0] and "length_penalty" not in said[0],
          f"num_beams and no_repeat_ngram_size named once (typical_p acts only when sampling): {said}")
    ids, _, code, err = ours(spes, model, *new, "--temperature", "1")
    said = [l for l in err.splitlines() if "not implemented here" in l]
    check(code == 0 and len(said) == 1 and "typical_p 0.5" in said[0], f"sampling: typical_p named too: {said}")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
