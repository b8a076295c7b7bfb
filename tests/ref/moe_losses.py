"""The four SPES training losses (DESIGN.md "Losses") computed in PyTorch from what Hugging
Face's OlmoeForCausalLM / Qwen3MoeForCausalLM return with output_router_logits=True.

HF's own load_balancing_loss_func is a different formula (it concatenates all layers before
counting and has no 1/k), so it is NOT used; these are written from DESIGN.md:

  ce       = mean over non-ignored targets of cross-entropy
  lm_z     = mean over non-ignored targets of logsumexp(logits)^2
  lb       = E/(L*N*k) * sum_{l,e} count_{l,e} * meanprob_{l,e}        (MegaBlocks form)
             count_{l,e}: tokens whose top-k in layer l holds e (a constant: no gradient),
             meanprob_{l,e}: mean over the N tokens of softmax(router_logits_l)[e]
  router_z = sum_l mean over tokens of logsumexp(router_logits_l)^2
  total    = ce + lm_z_mult*lm_z + lb_weight*lb + router_z_weight*router_z

Shared by tests/ref/model_vs_hf.py and bench/train_step_torch.py, so both do the same work.
"""
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def moe_losses(logits, targets, router_logits, top_k, lm_z_mult=0.0, lb_weight=0.0, router_z_weight=0.0):
    """logits [B,T,V], targets [B,T] (IGNORE_INDEX skipped), router_logits: tuple of L [B*T,E].
    Returns a dict of 0-dim tensors ce, lm_z, lb, router_z, total (total carries the graph)."""
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_targets = targets.reshape(-1)
    keep = flat_targets != IGNORE_INDEX
    ce = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="mean")
    lm_z = torch.logsumexp(flat_logits[keep], dim=-1).square().mean()

    num_layers = len(router_logits)
    num_tokens, num_experts = router_logits[0].shape
    lb = flat_logits.new_zeros(())
    router_z = flat_logits.new_zeros(())
    for layer_logits in router_logits:
        probs = torch.softmax(layer_logits, dim=-1)                       # [N, E]
        chosen = torch.topk(probs, top_k, dim=-1).indices                 # [N, k]
        counts = torch.bincount(chosen.reshape(-1), minlength=num_experts).to(probs.dtype)  # [E], constant
        lb = lb + (counts * probs.mean(dim=0)).sum()
        router_z = router_z + torch.logsumexp(layer_logits, dim=-1).square().mean()
    lb = lb * (num_experts / (num_layers * num_tokens * top_k))

    total = ce + lm_z_mult * lm_z + lb_weight * lb + router_z_weight * router_z
    return {"ce": ce, "lm_z": lm_z, "lb": lb, "router_z": router_z, "total": total}
