"""SwiGLU feed-forward network (Llama's MLP)."""

from __future__ import annotations

import torch
from torch import nn

from cookmind.model.activations import silu
from cookmind.model.fused import fused_linear
from cookmind.model.linear import Linear


class SwiGLU(nn.Module):
    """FFN(x) = W_down (silu(W_gate x) * W_up x). Names match HF: gate_proj, up_proj, down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, std: float = 0.02, out_std: float | None = None):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, std=std)
        self.up_proj = Linear(hidden_size, intermediate_size, std=std)
        self.down_proj = Linear(intermediate_size, hidden_size, std=std if out_std is None else out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Gate, activate, project down: (..., hidden) -> (..., hidden)."""
        gu = fused_linear(x, [self.gate_proj, self.up_proj])  # one GEMM for both; None -> separate ones
        g, u = gu if gu is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(silu(g) * u)
