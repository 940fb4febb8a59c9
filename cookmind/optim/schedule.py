"""Learning-rate schedule: linear warmup, then cosine decay down to a floor."""

from __future__ import annotations

import math

import torch


def cosine_with_warmup(step: int, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """Learning rate for 0-based `step`.

    warmup:  lr = max_lr (step + 1) / warmup_steps               for step < warmup_steps
    cosine:  lr = min_lr + (max_lr - min_lr) (1 + cos(pi p)) / 2,  p = (step - warmup) / (total - warmup)
    after:   lr = min_lr                                          for step >= total_steps
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


class CosineWarmupScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Scales each group's initial lr by the cosine-with-warmup curve; floor = min_lr_ratio x initial lr.

    Call ``step()`` after each optimizer step; state_dict()/load_state_dict() resume it exactly.
    """

    def __init__(self, optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1, last_epoch: int = -1):
        if warmup_steps < 0 or total_steps <= 0 or not 0 <= min_lr_ratio <= 1:
            raise ValueError(
                f"CosineWarmupScheduler: need warmup_steps >= 0, total_steps > 0 and "
                f"0 <= min_lr_ratio <= 1; got {warmup_steps}, {total_steps}, {min_lr_ratio}"
            )
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Each group's lr at the current step (last_epoch counts optimizer steps taken)."""
        step = self.last_epoch
        return [
            cosine_with_warmup(step, base, self.warmup_steps, self.total_steps, base * self.min_lr_ratio)
            for base in self.base_lrs
        ]
