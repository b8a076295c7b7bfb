"""`spes eval` multiple-choice scoring against lm-evaluation-harness (lm_eval, HF backend).

Usage: lm_eval_check.py SPES_BIN WORK_DIR EVAL_DATA_DIR TOKENIZER_JSON   (exit 0 = pass, 1 = fail)

A tiny random OLMoE with the real GPT-NeoX/OLMo tokenizer's vocabulary is exported with
`spes export --tokenizer` (so both tools read the same directory). The questions are the
first documents of the ARC-Easy and PIQA request files in ../shared/data/eval. lm_eval runs
them as a task defined on local files (dataset_path: json, data_files: a jsonl we write;
nothing is downloaded): doc_to_text = the request context, doc_to_choice = the request
continuations (leading space included) with target_delimiter "", so lm_eval's request is
exactly context + continuation and its acc_norm divides by len(continuation) in characters,
which is our acc_per_char. Checked:
  - every choice's log-likelihood: ours vs lm_eval's within 1e-6 relative (values of
    ~-20..-2000: fp32 sums over tokens);
  - acc (ours acc_raw) and acc_norm (ours acc_per_char) identical.
"""
import gzip
import json
import os
import sys

import torch
from transformers import OlmoeConfig, OlmoeForCausalLM
from transformers.utils import logging as hf_logging

from ref_checks import check, run, summary  # noqa: E402

DOCS_PER_TASK = 12
TASKS = ("arc_easy_rc_0shot", "piqa_rc_0shot")
def tiny_olmoe(vocab, max_positions, seed):
    """A tiny OLMoE (eos 0, pad 1) with weights drawn from `seed`: norms near 1, the rest of
    unit scale per input, so its logits are far from uniform."""
    cfg = OlmoeConfig(hidden_size=32, intermediate_size=16, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, vocab_size=vocab, num_experts=4, num_experts_per_tok=2,
                      max_position_embeddings=max_positions, norm_topk_prob=False, eos_token_id=0, pad_token_id=1,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = OlmoeForCausalLM._from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model


def build_model(vocab, work):
    src = os.path.join(work, "src")
    tiny_olmoe(vocab, 512, 0).save_pretrained(src)
    return src


def main():
    spes, work, eval_dir, tokenizer_json = sys.argv[1:5]
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    vocab = max(json.load(open(tokenizer_json))["model"]["vocab"].values()) + 1
    vocab = (vocab + 63) // 64 * 64   # padded embedding rows, as OLMo does
    src = build_model(vocab, work)
    model_dir = os.path.join(work, "model")
    code, log = run([spes, "export", "--checkpoint", src, "--out", model_dir, "--tokenizer", tokenizer_json])
    if code != 0:
        print("FAIL export: " + log)
        return 1

    # Requests (conditional ones of the first documents) for us; docs for lm_eval.
    yaml_dir = os.path.join(work, "tasks")
    os.makedirs(yaml_dir)
    ours_requests = os.path.join(work, "requests.jsonl")
    task_names = []
    with open(ours_requests, "w") as req_out:
        for task in TASKS:
            docs = {}
            with gzip.open(os.path.join(eval_dir, task, "requests.jsonl.gz"), "rt") as f:
                for line in f:
                    r = json.loads(line)
                    if r["doc_id"] >= DOCS_PER_TASK:
                        continue
                    r["doc_id"] += 1000 * len(task_names)   # one request file, documents kept apart
                    req_out.write(json.dumps(r) + "\n")
                    d = docs.setdefault(r["doc_id"], {"context": r["request"]["context"], "choices": {}, "gold": r["label"]})
                    d["choices"][r["idx"]] = r["request"]["continuation"]
            name = "spes_check_" + task.split("_rc")[0]
            task_names.append(name)
            data = os.path.join(work, name + ".jsonl")
            with open(data, "w") as f:
                for doc_id in sorted(docs):
                    d = docs[doc_id]
                    f.write(json.dumps({"doc_id": doc_id, "context": d["context"], "gold": d["gold"],
                                        "choices": [d["choices"][i] for i in range(len(d["choices"]))]}) + "\n")
            with open(os.path.join(yaml_dir, name + ".yaml"), "w") as f:
                f.write(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
                        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
                        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{gold}}\"\ntarget_delimiter: \"\"\n"
                        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")

    # Ours.
    ours_scores = os.path.join(work, "scores.jsonl")
    code, log = run([spes, "eval", "--model", model_dir, "--tokenizer", model_dir, "--task", ours_requests,
                     "--output", os.path.join(work, "ours.json"), "--output_requests", ours_scores, "--no_progress"])
    if code != 0:
        print("FAIL spes eval: " + log)
        return 1
    ours = {(s["doc_id"], s["idx"]): s["sum_logprob"] for s in map(json.loads, open(ours_scores))}
    ours_task = list(json.load(open(os.path.join(work, "ours.json")))["tasks"].values())[0]

    # lm_eval, HF backend, same directory, local task files.
    import lm_eval
    from lm_eval.tasks import TaskManager
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32,device=cpu",
                                  tasks=task_names, task_manager=TaskManager(include_path=yaml_dir), batch_size=8,
                                  log_samples=True)
    theirs = {}
    correct = {"acc": 0, "acc_norm": 0}
    n_docs = 0
    for name in task_names:
        for sample in out["samples"][name]:
            doc = sample["doc"]
            for idx, resp in enumerate(sample["filtered_resps"]):
                theirs[(doc["doc_id"], idx)] = float(resp[0])
            correct["acc"] += sample["acc"]
            correct["acc_norm"] += sample["acc_norm"]
            n_docs += 1
    check(set(theirs) == set(ours), f"same {len(ours)} requests scored by both")
    # fp32 sums of ~10-200 token log-probabilities of ~-11 each: agreement to ~1e-6 relative.
    worst = max(abs(ours[k] - theirs[k]) / max(1.0, abs(theirs[k])) for k in theirs)
    check(worst <= 1e-6, f"per-choice log-likelihoods: max |ours - lm_eval| / |ll| = {worst:.2e} over {len(theirs)} choices")
    check(ours_task["num_docs"] == n_docs, f"{n_docs} documents")
    for metric, ours_metric in (("acc", "acc_raw"), ("acc_norm", "acc_per_char")):
        mine, lm = ours_task[ours_metric], correct[metric] / n_docs
        check(abs(mine - lm) < 1e-12, f"{metric}: lm_eval {lm:.4f} = ours {ours_metric} {mine:.4f}")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
