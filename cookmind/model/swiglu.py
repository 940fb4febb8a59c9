"""SwiGLU feed-forward network (Llama's MLP)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cookmind.model.activations import silu
from cookmind.model.linear import Linear


class SwiGLU(nn.Module):
    """FFN(x) = W_down (silu(W_gate x) * W_up x). Names match HF: gate_proj, up_proj, down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, std: float = 0.02, out_std: float | None = None):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, std=std)
        self.up_proj = Linear(hidden_size, intermediate_size, std=std)
        self.down_proj = Linear(intermediate_size, hidden_size, std=std if out_std is None else out_std)

    def forward(self, x: torch.Tensor, gate_up_weight: torch.Tensor | None = None, gate_up_delta=None) -> torch.Tensor:
        """Gate, activate, project down: (..., hidden) -> (..., hidden). gate_up_weight: [W_gate; W_up] from
        ``model.fused.fuse_projections`` for one GEMM (the serving engine), plus its ``gate_up_delta`` (the rows'
        LoRA updates) when it has one; else the modules (LoRA too)."""
        if gate_up_weight is None:
            g, u = self.gate_proj(x), self.up_proj(x)
        else:
            gate_up = F.linear(x, gate_up_weight)
            if gate_up_delta is not None:
                gate_up = gate_up_delta(x, gate_up)
            g, u = gate_up.chunk(2, dim=-1)
        return self.down_proj(silu(g) * u)
