"""Scaled dot-product attention written out: softmax(q k^T / sqrt(d) + mask) v."""

from __future__ import annotations

import math

import torch

from cookmind.model.activations import softmax


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, scale: float | None = None
) -> torch.Tensor:
    """Attention over any number of leading batch dims.

    q: (..., T, D), k: (..., S, D), v: (..., S, Dv); mask: bool broadcastable to (..., T, S), True = may attend.
    Leading dims broadcast, so grouped-query attention is q (B, Hkv, G, T, D) against k (B, Hkv, 1, S, D).
    Returns (..., T, Dv). Scores and softmax run in fp32 for stability.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # forbidden keys get zero weight
    probs = softmax(scores, dim=-1)
    return (probs @ v.float()).to(q.dtype)


def causal_mask(q_len: int, k_len: int, offset: int = 0, device=None) -> torch.Tensor:
    """Bool (q_len, k_len) mask: query i (absolute position offset+i) may see keys 0..offset+i."""
    qi = torch.arange(q_len, device=device)[:, None] + offset
    kj = torch.arange(k_len, device=device)[None, :]
    return kj <= qi
