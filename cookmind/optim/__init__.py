"""Optimizers and schedules written out: AdamW, SGD, cosine-with-warmup, global-norm clipping."""

from cookmind.optim.adamw import AdamW, param_groups
from cookmind.optim.clip import clip_divisor, clip_grad_norm, global_grad_norm
from cookmind.optim.schedule import CosineWarmupScheduler, cosine_with_warmup
from cookmind.optim.sgd import SGD

__all__ = [
    "AdamW",
    "SGD",
    "CosineWarmupScheduler",
    "clip_divisor",
    "clip_grad_norm",
    "cosine_with_warmup",
    "global_grad_norm",
    "param_groups",
]
