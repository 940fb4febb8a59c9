"""Global-norm gradient clipping."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """Scale all gradients by min(1, max_norm / (||g|| + eps)), ||g|| = sqrt(sum_p ||g_p||^2).

    Returns the total norm before clipping as a tensor (no .item(): no host sync, compile friendly).
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = torch._foreach_norm(grads)  # one L2 norm per gradient tensor
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    scale = (max_norm / (total + eps)).clamp(max=1.0)  # only ever shrink
    torch._foreach_mul_(grads, scale)
    return total
