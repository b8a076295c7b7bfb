"""PyTorch side of the GPU training-step benchmark (bench/gpu_train_step.c is ours).

The same step as ours on the same GPU: Hugging Face transformers' OlmoeForCausalLM with the
reference's spes_moe_1b_4nodes shape (d_model 768, 12 heads, 12 layers, 16 experts top-2,
expert hidden 2048, vocab 151665, seq 2048, rope_theta 500000, RMSNorm eps 1e-6, no top-k
renormalisation, untied embeddings), micro-batch 8 x 2048 random tokens, every parameter
trainable; forward, the four SPES losses of tests/ref/moe_losses.py (CE + LM z-loss +
MegaBlocks load balancing + router z-loss, SPES weights; computed in fp32 from upcast
logits, as transformers' own loss does), backward, global-norm clipping to 1.0,
torch.optim.AdamW(fused=True).

Fastest configuration the installed versions allow, each tried in order and reported:
  - attention: SDPA (attn_implementation="sdpa");
  - experts: transformers 5's `experts_implementation` ("grouped_mm": one
    torch grouped GEMM per projection over all experts; then "batched_mm"; then "eager", the
    per-expert loop), unless --experts names one;
  - torch.compile of the model (default "auto": compiled first, eager if compiling or the
    compiled step fails; --compile on|off forces one).
Precision (--params): "bf16" (default) holds parameters, gradients and AdamW moments in
bf16, the usual fast HF setup and what grouped_mm needs (its kernel is bf16-only under
torch.compile); "amp" keeps fp32 parameters and moments and runs the forward under
torch.autocast(bf16) like ours (fp32 master weights), but then the expert GEMMs run in fp32.
Memory therefore differs from ours by design in "bf16": ours keeps fp32 master weights,
gradients and moments (16 bytes per trainable parameter + 6 per parameter) against 8 here.

Prints per-step times and, last, machine-readable lines:
  pytorch_tok_s=<x>  pytorch_peak_mem_gb=<x>  pytorch_config=<experts>,<compile>,<params>
Without a CUDA device: "pytorch: skipped (<why>)" and exit 0. Out of GPU memory at the
requested size: "pytorch: out of memory (...)", pytorch_tok_s=NA, exit 0.
Usage: gpu_train_step_torch.py [--warmup N] [--steps N] [--batch B] [--seq T]
         [--experts auto|grouped_mm|batched_mm|eager] [--compile auto|on|off] [--params bf16|amp]
         [--preset 1b|tiny] [--allow-cpu]
(--preset tiny --allow-cpu runs the script's logic on a CPU, for checking it without a GPU.)
"""
import argparse
import gc
import os
import sys
import time
import traceback

LM_Z_MULT, LB_WEIGHT, ROUTER_Z_WEIGHT = 1e-5, 0.01, 0.001
ADAMW = dict(lr=5e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MAX_GRAD_NORM = 1.0


def skip(why):
    print(f"pytorch: skipped ({why})", flush=True)
    sys.exit(0)


try:
    import torch
    from transformers import OlmoeConfig, OlmoeForCausalLM
except ImportError as e:   # run_gpu.sh checks the venv first; this is the belt to its braces
    skip(f"cannot import torch/transformers: {e}")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from moe_losses import moe_losses  # noqa: E402


def model_config(preset):
    if preset == "1b":
        shape = dict(vocab_size=151665, hidden_size=768, num_attention_heads=12, num_key_value_heads=12,
                     num_hidden_layers=12, num_experts=16, num_experts_per_tok=2, intermediate_size=2048,
                     max_position_embeddings=2048)
    else:   # tiny: the logic on any machine
        shape = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                     num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, intermediate_size=16,
                     max_position_embeddings=64)
    return OlmoeConfig(**shape, rope_theta=500000.0, rms_norm_eps=1e-6, norm_topk_prob=False,
                       tie_word_embeddings=False, attention_dropout=0.0, clip_qkv=None,
                       pad_token_id=None, eos_token_id=None, bos_token_id=None)


def build(config, experts, params, device):
    """The model on `device`, OLMo init (normal 0.02 truncated at 3 std, norms 1), in the
    parameter dtype of `params`. Raises when transformers refuses the experts implementation."""
    with torch.device(device):
        model = OlmoeForCausalLM._from_config(config, attn_implementation="sdpa", experts_implementation=experts,
                                              dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                torch.nn.init.trunc_normal_(p, mean=0.0, std=0.02, a=-0.06, b=0.06)
    if params == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    return model


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


class Run:
    """One configuration: model, optimizer, the step function (compiled or not)."""

    def __init__(self, config, experts, use_compile, params, device, inputs, targets):
        self.label = f"experts:{experts},compile:{'on' if use_compile else 'off'},params:{params}"
        self.model = build(config, experts, params, device)
        self.opt = torch.optim.AdamW(self.model.parameters(), **ADAMW, fused=device == "cuda")
        self.forward = torch.compile(self.model) if use_compile else self.model
        self.params, self.device = params, device
        self.inputs, self.targets = inputs, targets
        self.k = config.num_experts_per_tok

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self):
        """Returns (loss, forward+losses s, backward s, clip+AdamW s), synced."""
        self.opt.zero_grad(set_to_none=True)
        self.sync()
        t0 = time.perf_counter()
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.params == "amp"):
            out = self.forward(input_ids=self.inputs, output_router_logits=True, use_cache=False)
        losses = moe_losses(out.logits.float(), self.targets, [r.float() for r in out.router_logits], self.k,
                            LM_Z_MULT, LB_WEIGHT, ROUTER_Z_WEIGHT)
        self.sync()
        t1 = time.perf_counter()
        losses["total"].backward()
        del out
        self.sync()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM, foreach=True)
        self.opt.step()
        self.sync()
        t3 = time.perf_counter()
        loss = float(losses["total"].detach())
        if loss != loss:
            raise RuntimeError("the loss is NaN")
        return loss, t1 - t0, t2 - t1, t3 - t2

    def close(self):
        del self.forward, self.opt, self.model
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001 - best effort
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--experts", default="auto", choices=["auto", "grouped_mm", "batched_mm", "eager"])
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--params", default="bf16", choices=["bf16", "amp"])
    ap.add_argument("--preset", default="1b", choices=["1b", "tiny"])
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (checks only)")
    args = ap.parse_args()

    if torch.cuda.is_available():
        device = "cuda"
    elif args.allow_cpu:
        device = "cpu"
    else:
        skip(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda})")
    import transformers
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"pytorch: torch {torch.__version__}, transformers {transformers.__version__}, device {name}", flush=True)

    torch.manual_seed(0)
    config = model_config(args.preset)
    gen = torch.Generator().manual_seed(1)
    rows = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=gen)
    inputs, targets = rows[:, :-1].contiguous().to(device), rows[:, 1:].contiguous().to(device)
    tokens = args.batch * args.seq

    impls = ["grouped_mm", "batched_mm", "eager"] if args.experts == "auto" else [args.experts]
    compiles = {"auto": [True, False], "on": [True], "off": [False]}[args.compile]
    run = None
    for experts in impls:
        for use_compile in compiles:
            label = f"experts:{experts},compile:{'on' if use_compile else 'off'},params:{args.params}"
            try:
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                run = Run(config, experts, use_compile, args.params, device, inputs, targets)
                for i in range(args.warmup):
                    t0 = time.perf_counter()
                    loss, *_ = run.step()
                    note = " (includes compilation)" if use_compile and i == 0 else ""
                    print(f"pytorch [{label}] warm-up {i}: loss {loss:.4f}  {time.perf_counter() - t0:.3f}s{note}",
                          flush=True)
                break
            except Exception as e:  # noqa: BLE001 - try the next configuration, say why
                if is_oom(e):
                    print(f"pytorch: out of memory at micro-batch {args.batch} x {args.seq} [{label}]: "
                          f"{str(e).splitlines()[0]}", flush=True)
                    print("pytorch_tok_s=NA")
                    print("pytorch_peak_mem_gb=NA")
                    print(f"pytorch_config={label.replace(',', '/')}:oom")
                    return
                print(f"pytorch [{label}] did not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                      flush=True)
                traceback.print_exc(limit=3, file=sys.stdout)
                if run is not None:
                    run.close()
                run = None
        if run is not None:
            break
    if run is None:
        print("pytorch: no configuration ran")
        sys.exit(1)

    times = []
    for i in range(args.steps):
        loss, fwd, bwd, upd = run.step()
        total = fwd + bwd + upd
        times.append(total)
        print(f"pytorch step {i}: loss {loss:.4f}  {1e3 * total:.1f} ms (forward+losses {1e3 * fwd:.1f}, "
              f"backward {1e3 * bwd:.1f}, clip+adamw {1e3 * upd:.1f})  {tokens / total:.0f} tok/s", flush=True)
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 1e9 if device == "cuda" else float("nan")
    n_params = sum(p.numel() for p in run.model.parameters())
    print(f"pytorch: [{run.label}] {n_params / 1e9:.3f}B parameters, B={args.batch} T={args.seq}, "
          f"mean step {1e3 * mean:.1f} ms, best {1e3 * min(times):.1f} ms; peak allocated {peak:.2f} GB, "
          f"reserved {reserved:.2f} GB")
    print(f"pytorch_tok_s={tokens / mean:.1f}")
    print(f"pytorch_peak_mem_gb={peak:.2f}" if device == "cuda" else "pytorch_peak_mem_gb=NA")
    print(f"pytorch_config={run.label.replace(',', '/')}")


if __name__ == "__main__":
    main()
