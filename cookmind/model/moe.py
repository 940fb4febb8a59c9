"""Mixture-of-experts feed-forward: top-k routing, optional shared expert, load-balancing loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cookmind.model.activations import softmax
from cookmind.model.linear import Linear
from cookmind.model.swiglu import SwiGLU


class MoE(nn.Module):
    """y = sum_{e in topk(x)} w_e(x) FFN_e(x) (+ shared FFN(x)); w = router softmax renormalised over the top k.

    The data-dependent token gather makes this module a torch.compile graph break; the dense FFN stays the
    fast path.
    """

    def __init__(self, cfg, out_std: float | None = None):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = min(cfg.num_experts_per_tok, cfg.num_experts)
        std = cfg.initializer_range
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, std=std)  # router, named as in Qwen-MoE
        self.experts = nn.ModuleList(
            SwiGLU(cfg.hidden_size, cfg.intermediate_size, std, out_std) for _ in range(cfg.num_experts)
        )
        self.shared_expert = (
            SwiGLU(cfg.hidden_size, cfg.intermediate_size, std, out_std) if cfg.moe_shared_expert else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> (y (B, T, C), load-balancing loss scalar fp32)."""
        shape = x.shape
        xf = x.reshape(-1, shape[-1])  # (N, C)
        probs = softmax(self.gate(xf).float(), dim=-1)  # (N, E)
        top_w, top_i = probs.topk(self.top_k, dim=-1)  # (N, k)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(xf)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(top_i == e)  # tokens routed to expert e
            contrib = expert(xf[token]) * top_w[token, slot, None].to(xf.dtype)
            out.index_add_(0, token, contrib)
        if self.shared_expert is not None:
            out = out + self.shared_expert(xf)
        # Switch-Transformer balance loss: E * sum_e f_e P_e, f_e = share of routed slots, P_e = mean router prob
        frac = F.one_hot(top_i, self.num_experts).float().sum(dim=(0, 1)) / top_i.numel()
        aux = self.num_experts * (frac * probs.mean(dim=0)).sum()
        return out.view(shape), aux
