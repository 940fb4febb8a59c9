"""Block-diagonal causal attention mask from position ids that restart per document."""

from __future__ import annotations

import torch


def doc_attention_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Bool mask (B, 1, T, T), True where query i may attend key j: j <= i and both in one document.

    A document begins wherever ``position_ids == 0``; doc_id = cumsum(position_ids == 0).
    """
    doc = torch.cumsum((position_ids == 0).long(), dim=-1)  # (B, T)
    t = position_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    same_doc = doc.unsqueeze(-1) == doc.unsqueeze(-2)  # (B, T, T)
    return (same_doc & causal).unsqueeze(1)
