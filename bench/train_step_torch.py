"""PyTorch side of the bench-small training-step benchmark (bench/train_step.c is ours).

The same step as ours: Hugging Face transformers' OlmoeForCausalLM, eager attention and eager
(per-expert loop) experts, fp32 on CPU, torch.set_num_threads(2); forward, the four SPES
losses of tests/ref/moe_losses.py (CE + LM z-loss + MegaBlocks load balancing + router
z-loss, SPES config weights), backward, torch.optim.AdamW step over every parameter.

bench-small: d_model 512, 8 heads (head_dim 64, MHA), 4 layers, 8 experts top-2, expert
hidden 1024, vocab 8192, seq 256, micro-batch 8, rope_theta 500000, RMSNorm eps 1e-6,
no top-k renormalisation, OLMo init (normal std 0.02 truncated at 3 std, norms 1).

Prints per-step times, then as its last line: pytorch_tok_s=<tokens per second>.
Usage: train_step_torch.py [--warmup N] [--steps N] [--threads N] [--batch B] [--seq T]
"""
import argparse
import os
import resource
import sys
import time

import torch
from transformers import OlmoeConfig, OlmoeForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from moe_losses import moe_losses  # noqa: E402

# SPES reference config (spes_moe_1b_4nodes_node_0.yaml): auxiliary_loss_multiplier,
# moe_loss_weight, moe_zloss_weight; optimizer lr, betas, eps, weight_decay.
LM_Z_MULT, LB_WEIGHT, ROUTER_Z_WEIGHT = 1e-5, 0.01, 0.001
ADAMW = dict(lr=5e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def bench_small_model():
    config = OlmoeConfig(vocab_size=8192, hidden_size=512, num_attention_heads=8, num_key_value_heads=8,
                         num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, intermediate_size=1024,
                         max_position_embeddings=2048, rope_theta=500000.0, rms_norm_eps=1e-6,
                         norm_topk_prob=False, tie_word_embeddings=False, attention_dropout=0.0,
                         pad_token_id=None, eos_token_id=None, bos_token_id=None)
    model = OlmoeForCausalLM._from_config(config, attn_implementation="eager", experts_implementation="eager",
                                          dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                torch.nn.init.trunc_normal_(p, mean=0.0, std=0.02, a=-0.06, b=0.06)
    model.train()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)

    model = bench_small_model()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    gen = torch.Generator().manual_seed(1)
    rows = torch.randint(0, model.config.vocab_size, (args.batch, args.seq + 1), generator=gen)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    k = model.config.num_experts_per_tok

    def step():
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out = model(input_ids=inputs, output_router_logits=True, use_cache=False)
        losses = moe_losses(out.logits, targets, out.router_logits, k, LM_Z_MULT, LB_WEIGHT, ROUTER_Z_WEIGHT)
        t1 = time.perf_counter()
        losses["total"].backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        return float(losses["total"].detach()), t1 - t0, t2 - t1, t3 - t2

    tokens = args.batch * args.seq
    for i in range(args.warmup):
        loss, *_ = step()
        print(f"pytorch warmup {i}: loss {loss:.4f}", flush=True)
    times = []
    for i in range(args.steps):
        loss, fwd, bwd, upd = step()
        total = fwd + bwd + upd
        times.append(total)
        print(f"pytorch step {i}: loss {loss:.4f}  {total:.3f}s (forward+losses {fwd:.3f}, backward {bwd:.3f}, "
              f"adamw {upd:.3f})  {tokens / total:.0f} tok/s", flush=True)
    best = min(times)
    mean = sum(times) / len(times)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"pytorch: torch {torch.__version__}, {args.threads} threads, B={args.batch} T={args.seq}, "
          f"mean step {mean:.3f}s, best {best:.3f}s, peak_rss_mb {rss_mb:.0f}")
    print(f"pytorch_tok_s={tokens / mean:.1f}")


if __name__ == "__main__":
    main()
