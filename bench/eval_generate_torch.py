"""PyTorch side of the inference benchmark (bench/eval_generate.c is ours).

The same bench-small model as bench/train_step_torch.py (HF OlmoeForCausalLM, eager attention
and experts, fp32 CPU, torch.set_num_threads(2)), in eval mode under torch.no_grad:
  - eval: forward with labels (mean cross-entropy) over batch 8 x seq 256;
  - generate: model.generate greedy (do_sample=False) with HF's KV cache, 64 new tokens after
    a 32-token prompt (prefill included in the time).
Prints detail, then pytorch_eval_tok_s= and pytorch_gen_tok_s= lines.
Usage: eval_generate_torch.py [--threads N] [--batch B] [--seq T] [--prompt P] [--new N] [--reps R]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_torch import bench_small_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    model = bench_small_model().eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, vocab, (args.batch, args.seq), generator=g)
    labels = torch.randint(0, vocab, (args.batch, args.seq), generator=g)
    with torch.no_grad():
        model(input_ids=inputs, labels=labels)   # warm-up
        best = 1e30
        for r in range(args.reps):
            t0 = time.perf_counter()
            loss = model(input_ids=inputs, labels=labels).loss
            dt = time.perf_counter() - t0
            best = min(best, dt)
            print(f"  eval rep {r}: {dt:.3f} s for {args.batch * args.seq} tokens (loss {float(loss):.4f})")
        eval_tok_s = args.batch * args.seq / best
        prompt = torch.randint(0, vocab, (1, args.prompt), generator=g)
        best = 1e30
        for r in range(args.reps):
            t0 = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                                 use_cache=True, pad_token_id=0)
            dt = time.perf_counter() - t0
            best = min(best, dt)
            print(f"  generate rep {r}: {out.shape[1] - args.prompt} new tokens in {dt:.3f} s")
    print(f"pytorch_eval_tok_s={eval_tok_s:.1f}")
    print(f"pytorch_gen_tok_s={args.new / best:.1f}")


if __name__ == "__main__":
    main()
