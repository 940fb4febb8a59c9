"""Elementwise activation and the numerically stable softmax."""

from __future__ import annotations

import torch


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU (swish): x * sigmoid(x)."""
    return x * torch.sigmoid(x)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x); subtracting the max avoids overflow.

    A row that is entirely -inf has no distribution and gives NaN, as torch.softmax does.
    """
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # -inf max would make (x - m) nan everywhere
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)
