"""Per-token entropy of the next-token distribution."""

from __future__ import annotations

import torch


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum_v p_v log p_v over the last dim, with p = softmax(logits); shape (..., V) -> (...).

    Computed from log-softmax (logits - logsumexp) so large logits never overflow.
    """
    log_p = logits.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    return -(log_p.exp() * log_p).sum(dim=-1)
