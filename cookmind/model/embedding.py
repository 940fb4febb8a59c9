"""Token embedding: a lookup table row per token id."""

from __future__ import annotations

import torch
from torch import nn

from cookmind.model.init import truncated_normal_


class Embedding(nn.Module):
    """E[ids]: (...,) long -> (..., dim). Weight shape (num_embeddings, dim)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, std: float = 0.02, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.std = std
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Rows ~ N(0, std^2) truncated at +-3 std."""
        truncated_normal_(self.weight, self.std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up the embedding row of every id."""
        return self.weight[ids]  # row lookup; gradient scatters back into the rows used

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
