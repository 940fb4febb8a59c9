"""One switch for the training loop: our DDP or PyTorch's, with the same few calls either way.

    model = wrap_data_parallel(model, kind="ours", bucket_size_mb=25, reduce_dtype=torch.bfloat16)
    with no_sync(model): loss.backward()          # accumulation micro-steps
    loss.backward(); finish_gradient_synchronization(model); optimizer.step()
    unwrap_model(model).state_dict()              # checkpoints hold the bare model's names
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from .ddp import DDP

KINDS = ("ours", "torch")


def wrap_data_parallel(module: nn.Module, kind: str = "ours", bucket_size_mb: float = 25.0,
                       reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """Wrap for data parallelism; returns the module unchanged when there is one process."""
    if kind not in KINDS:
        raise ValueError(f"unknown data-parallel kind {kind!r}; choose one of {KINDS}")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return module
    if kind == "ours":
        return DDP(module, bucket_size_mb=bucket_size_mb, reduce_dtype=reduce_dtype)
    device = next(module.parameters()).device
    ddp = nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_size_mb, gradient_as_bucket_view=True,
    )
    if reduce_dtype is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {torch.bfloat16: default_hooks.bf16_compress_hook, torch.float16: default_hooks.fp16_compress_hook}
        if reduce_dtype not in hooks:
            raise ValueError(f"torch DDP reduces in bf16 or fp16 only, not {reduce_dtype}")
        ddp.register_comm_hook(None, hooks[reduce_dtype])
    return ddp


def no_sync(model: nn.Module):
    """Context for accumulation micro-steps: skip gradient communication (no-op when unwrapped)."""
    if isinstance(model, (DDP, nn.parallel.DistributedDataParallel)):
        return model.no_sync()
    return contextlib.nullcontext()


def finish_gradient_synchronization(model: nn.Module) -> None:
    """Wait for averaged gradients (our DDP); torch DDP and a bare module have them after backward."""
    if isinstance(model, DDP):
        model.finish_gradient_synchronization()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a data-parallel wrapper."""
    return model.module if isinstance(model, (DDP, nn.parallel.DistributedDataParallel)) else model
