"""`spes eval` on requests with an empty context, against lm-evaluation-harness (HF backend).

Usage: lm_eval_empty_context.py SPES_BIN WORK_DIR TOKENIZER_JSON   (exit 0 = pass, 1 = fail)

lm_eval (0.4.13, HFLM.prefix_token_id) conditions a request whose context is "" on the
tokenizer's BOS token, or its EOS when it has no BOS, never on the model config's
eos_token_id; a continuation whose first token is that token takes it as its context. The tiny
random OLMoE of lm_eval_check.py has eos_token_id 0 in config.json; its tokenizer directory
(the GPT-NeoX/OLMo tokenizer.json plus a tokenizer_config.json) names:
  - eos_token <|endoftext|> (50279) alone: the prefix is 50279;
  - bos_token <|padding|> (1) too: the prefix is 1.
Requests: empty contexts with ordinary continuations, empty contexts with a continuation that
starts with <|endoftext|>, an ordinary context, and contexts ending in whitespace beyond ASCII's
(a no-break space, an em space then a newline), which Python's rstrip() moves to the
continuation as it does a space (ours moved ASCII whitespace alone). Every choice's
log-likelihood: ours vs lm_eval's HFLM.loglikelihood within 1e-6 relative, and the tokens each
side saw agree (ours used config.json's eos 0 whatever the tokenizer said). A tokenizer naming
neither is refused.

A context of whitespace alone (" ", "\n", "  ") is not "": lm_eval's _encode_pair moves it all to
the continuation, leaving no context token, and _loglikelihood_tokens then fails (assert
len(context_enc) > 0). Ours refuses such a request, naming it (it used to condition it on the
prefix token, as an empty context, scoring what lm_eval never scores).
"""
import json
import os
import shutil
import sys

import torch
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_eval_check import build_model   # noqa: E402  (the same tiny OLMoE, eos_token_id 0)
from ref_checks import check, run, summary  # noqa: E402

DOCS = [("", [" the cat sat", " a dog ran"]),
        ("", ["<|endoftext|> yes", "<|endoftext|> no, never"]),
        ("Question: which is larger, 2 or 3?\nAnswer:", [" 2", " 3"]),
        ("Question: is it?\nAnswer:\u00a0", ["yes", "no"]),
        ("Question: is it?\nAnswer:\u2003\n", ["yes", "no"])]
WHITESPACE_ONLY = [" ", "\n", "  "]
def write_requests(path, docs):
    with open(path, "w") as f:
        for doc_id, (context, choices) in enumerate(docs):
            for idx, cont in enumerate(choices):
                f.write(json.dumps({"doc_id": doc_id, "idx": idx, "label": 0,
                                    "request": {"context": context, "continuation": cont}}) + "\n")


def ours(spes, model_dir, requests, work):
    scores = os.path.join(work, "scores.jsonl")
    code, log = run([spes, "eval", "--model", model_dir, "--tokenizer", model_dir, "--task", requests,
                     "--output_requests", scores, "--no_progress"])
    if code != 0:
        return None, log
    return {(s["doc_id"], s["idx"]): s["sum_logprob"] for s in map(json.loads, open(scores))}, log


def lm_eval_model(model_dir):
    from lm_eval.models.huggingface import HFLM
    return HFLM(pretrained=model_dir, dtype="float32", device="cpu", batch_size=4)


def theirs(lm, docs):
    from lm_eval.api.instance import Instance
    keys, instances = [], []
    for doc_id, (context, choices) in enumerate(docs):
        for idx, cont in enumerate(choices):
            keys.append((doc_id, idx))
            instances.append(Instance(request_type="loglikelihood", doc={}, arguments=(context, cont), idx=idx))
    scores = lm.loglikelihood(instances, disable_tqdm=True)
    return dict(zip(keys, (float(s[0]) for s in scores)))


def main():
    spes, work, tokenizer_json = sys.argv[1:4]
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    vocab = max(json.load(open(tokenizer_json))["model"]["vocab"].values()) + 1
    src = build_model((vocab + 63) // 64 * 64, work)
    requests = os.path.join(work, "requests.jsonl")
    write_requests(requests, DOCS)

    cases = [("eos only", {"eos_token": "<|endoftext|>"}, 50279),
             ("bos and eos", {"bos_token": "<|padding|>", "eos_token": "<|endoftext|>"}, 1)]
    for name, special, prefix in cases:
        tok_dir = os.path.join(work, "tok_" + name.replace(" ", "_"))
        os.makedirs(tok_dir)
        shutil.copy(tokenizer_json, os.path.join(tok_dir, "tokenizer.json"))
        json.dump(dict(special, tokenizer_class="PreTrainedTokenizerFast"), open(os.path.join(tok_dir, "tokenizer_config.json"), "w"))
        model_dir = os.path.join(work, "model_" + name.replace(" ", "_"))
        code, log = run([spes, "export", "--checkpoint", src, "--out", model_dir, "--tokenizer", tok_dir])
        if code != 0:
            check(False, f"{name}: export: {log}")
            continue
        check(json.load(open(os.path.join(model_dir, "config.json")))["eos_token_id"] == 0,
              f"{name}: config.json's eos_token_id is 0, not the tokenizer's")
        mine, log = ours(spes, model_dir, requests, work)
        if mine is None:
            check(False, f"{name}: spes eval: {log}")
            continue
        lm_model = lm_eval_model(model_dir)
        lm = theirs(lm_model, DOCS)
        check(lm_model.prefix_token_id == prefix, f"{name}: lm_eval's prefix token is {prefix}: {lm_model.prefix_token_id}")
        check(set(mine) == set(lm), f"{name}: same {len(lm)} requests scored by both")
        for key in sorted(lm):
            if key not in mine:
                continue
            rel = abs(mine[key] - lm[key]) / max(1.0, abs(lm[key]))
            check(rel <= 1e-6, f"{name}: doc {key[0]} choice {key[1]} (context {DOCS[key[0]][0][:12]!r}): "
                  f"ours {mine[key]:.6f}, lm_eval {lm[key]:.6f}")

    # A context of whitespace alone: lm_eval fails on it, ours refuses it, naming the request.
    lm_model = lm_eval_model(os.path.join(work, "model_eos_only"))
    for context in WHITESPACE_ONLY:
        docs = [(context, [" the cat sat", " a dog ran"])]
        try:
            theirs(lm_model, docs)
            fails = False
        except AssertionError:
            fails = True
        check(fails, f"context {context!r}: lm_eval fails (assert len(context_enc) > 0)")
        one = os.path.join(work, "whitespace.jsonl")
        write_requests(one, docs)
        code, log = run([spes, "eval", "--model", os.path.join(work, "model_eos_only"), "--tokenizer",
                         os.path.join(work, "model_eos_only"), "--task", one, "--no_progress"])
        last = (log.strip().splitlines() or ["(no output)"])[-1]
        check(code != 0 and "doc_id 0 idx 0: the context" in log and "whitespace only" in log,
              f"context {context!r}: spes eval refuses it: {last}")

    # Neither named (a tokenizer_config.json with "eos_token": null): refused, naming the request.
    tok_dir = os.path.join(work, "tok_none")
    os.makedirs(tok_dir)
    shutil.copy(tokenizer_json, os.path.join(tok_dir, "tokenizer.json"))
    json.dump({"eos_token": None}, open(os.path.join(tok_dir, "tokenizer_config.json"), "w"))
    code, log = run([spes, "eval", "--model", os.path.join(work, "model_eos_only"), "--tokenizer", tok_dir,
                     "--task", requests, "--no_progress"])
    check(code != 0 and "doc_id 0: empty context" in log and "no BOS or EOS" in log,
          "a tokenizer naming no BOS or EOS is refused: " + (log.strip().splitlines() or ["(no output)"])[-1])

    return summary()


if __name__ == "__main__":
    sys.exit(main())
