"""SGD with (coupled) weight decay and optional momentum."""

from __future__ import annotations

import torch


class SGD(torch.optim.Optimizer):
    """d = g + wd p;  b <- mu b + d (b = d on the first step);  p <- p - lr (b if mu else d)."""

    def __init__(self, params, lr: float = 1e-2, momentum: float = 0.0, weight_decay: float = 0.0):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: invalid hyper-parameters lr={lr} momentum={momentum} wd={weight_decay}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=wd) if wd != 0 else p.grad
                if mu != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = d.clone()
                    else:
                        state["momentum_buffer"].mul_(mu).add_(d)
                    d = state["momentum_buffer"]
                p.add_(d, alpha=-lr)
        return loss
