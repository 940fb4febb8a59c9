"""Cross-entropy in fp32 with ignore_index."""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean") -> torch.Tensor:
    """loss_i = logsumexp(z_i) - z_i[y_i], over positions whose target != ignore_index.

    logits (..., V), targets (...) long. reduction "mean" (over kept positions; 0 when none are kept),
    "sum" or "none" (ignored positions give 0). Computed in fp32 whatever the logits' dtype.
    """
    z = logits.float().reshape(-1, logits.shape[-1])
    y = targets.reshape(-1)
    keep = y != ignore_index
    safe_y = torch.where(keep, y, torch.zeros_like(y))  # any valid index; masked out below
    nll = torch.logsumexp(z, dim=-1) - z.gather(-1, safe_y[:, None]).squeeze(-1)
    nll = torch.where(keep, nll, torch.zeros_like(nll))
    if reduction == "none":
        return nll.view(targets.shape)
    if reduction == "sum":
        return nll.sum()
    if reduction == "mean":
        return nll.sum() / keep.sum().clamp(min=1)
    raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
