"""Weight initialisation: a normal distribution truncated at +-3 standard deviations."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def truncated_normal_(w: torch.Tensor, std: float, bound: float = 3.0) -> torch.Tensor:
    """Fill w with N(0, std^2) conditioned on |x| <= bound std: no rare huge weights at init.

    Uses torch's inverse-CDF sampler (uniform -> erfinv), so a seed gives the same weights as
    nn.init.trunc_normal_. Meta tensors (shape-only models built to check a checkpoint) are left alone.
    """
    if w.is_meta:
        return w
    return nn.init.trunc_normal_(w, mean=0.0, std=std, a=-bound * std, b=bound * std)
