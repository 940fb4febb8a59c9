"""Linear layer without bias (optional bias for imported Qwen2 q/k/v), truncated-normal init."""

from __future__ import annotations

import torch
from torch import nn

from cookmind.model.init import truncated_normal_


class Linear(nn.Module):
    """y = x W^T (+ b). W has shape (out_features, in_features), as in torch and Hugging Face."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, std: float = 0.02, device=None, dtype=None
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.std = std
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W ~ N(0, std^2) truncated at +-3 std: no rare huge weights at init."""
        truncated_normal_(self.weight, self.std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project the last dim of x from in_features to out_features."""
        y = x @ self.weight.t()  # (..., in) @ (in, out) -> (..., out)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
