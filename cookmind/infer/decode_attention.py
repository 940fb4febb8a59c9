"""Attention of one new token per row against its cached keys and values, written for the compiler.

    out = softmax(q k^T / sqrt(D) + bias) v        q: (B, H, 1, D), keys/values: (B, Hkv, L, D)

as products and sums rather than a call to scaled_dot_product_attention. Inside torch.compile,
inductor turns it into three kernels per layer (scores as a reduction over D, the softmax, the
weighted sum over L), each reading the cache once, and folds the paged cache's block-table gather
into the loads; an SDPA call there was handed strided (or gathered) cache views that the compiled
graph first copied into fresh contiguous tensors every layer (measured on the H200: the compiled
step at batch 64 slower than the uncompiled one). Eagerly this form would materialise the
(B, Hkv, G, L, D) products, so the eager path keeps SDPA; tests check both give the same output.
"""

from __future__ import annotations

import math

import torch


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q (B, H, 1, D); keys, values (B, Hkv, L, D), any strides, H a multiple of Hkv (grouped-query);
    bias (B, 1, 1, L) added to the scores (0 or -inf). Returns (B, H, 1, D) in q's dtype; math in fp32."""
    b, h, _, d = q.shape
    hkv = keys.shape[1]
    g = h // hkv  # query heads sharing one key/value head
    qg = q.reshape(b, hkv, g, 1, d).float()
    scores = (qg * keys[:, :, None].float()).sum(-1) / math.sqrt(d)  # (B, Hkv, G, L): q . k_l / sqrt(D)
    p = torch.softmax(scores + bias, dim=-1)  # bias (B, 1, 1, L) broadcasts over heads
    out = (p[..., None] * values[:, :, None].float()).sum(-2)  # (B, Hkv, G, D): sum_l p_l v_l
    return out.to(q.dtype).reshape(b, h, 1, d)
