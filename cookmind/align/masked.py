"""Reductions that count only the positions a mask selects."""

from __future__ import annotations

import torch


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(tensor * mask) / sum(mask), over ``dim`` (all elements when None)."""
    kept = torch.where(mask.bool(), tensor, torch.zeros_like(tensor))  # where, not *, so inf/nan outside stay out
    count = mask.to(tensor.dtype)
    if dim is None:
        return kept.sum() / count.sum()
    return kept.sum(dim=dim) / count.sum(dim=dim)


def masked_normalize(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None, normalize_constant: float = 1.0) -> torch.Tensor:
    """sum(tensor * mask) / normalize_constant, over ``dim`` (all elements when None).

    A fixed constant instead of the mask count is Dr. GRPO's remedy for the length bias
    of per-sequence means.
    """
    kept = torch.where(mask.bool(), tensor, torch.zeros_like(tensor))
    if dim is None:
        return kept.sum() / normalize_constant
    return kept.sum(dim=dim) / normalize_constant
