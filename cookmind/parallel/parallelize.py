"""``parallelize(model, cfg)``: everything that wraps the model for training, applied from outside in one order.

    0. FP8 blocks                 the blocks' projections become float8 linears in place (``train.fp8_blocks``)
    1. activation checkpointing   each block wrapped in place (``apply_activation_checkpointing``)
    2. torch.compile              the whole model
    3. data parallelism           our bucketed DDP or PyTorch's, around the compiled model

The model never knows about any of it; ``unwrap`` gets it back. The order is the one torchtitan's per-model
``parallelize`` uses: checkpointing inside compile (the compiler traces the recompute regions), data parallelism
last (its gradient hooks and collectives stay outside the compiled graphs). ZeRO-1 shards the
optimizer, not the model: ``ShardedOptimizer`` wraps the optimizer when ``parallel.zero1`` is set
(``cookmind.train.build.build_optimizer``), over the same DDP-averaged gradients.

Sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``) goes in step 3 next: ``fully_shard``
each block and then the root, in place of the DDP wrapper (checkpointing and compile stay as they are).
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from cookmind.model.float8_blocks import apply_fp8_blocks

from .activation_checkpointing import apply_activation_checkpointing
from .ddp import DDP

if TYPE_CHECKING:
    from cookmind.train.config import TrainConfig

DDP_KINDS = ("torch", "ours")


def parallelize(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Apply ``cfg``'s FP8 blocks, activation checkpointing, torch.compile and data parallelism to ``model``, in
    that order.

    Returns the module to train (the outermost wrapper); ``model`` itself is changed only by FP8 blocks and
    checkpointing, which swap or wrap its blocks' modules in place (state-dict names unchanged). Data
    parallelism applies when a process group of more than one rank is up (``init_distributed``); the model
    must be on this rank's device already.
    """
    t, p = cfg.train, cfg.parallel
    fp8 = apply_fp8_blocks(model, cfg)  # before compile (it traces the float8 casts) and before any sharding
    if fp8 is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"cookmind train: {fp8.summary()}", file=sys.stderr)
    if t.activation_checkpointing:
        apply_activation_checkpointing(model)
    if t.compile:
        model = torch.compile(model, mode=None if t.compile_mode == "default" else t.compile_mode)
    if dist.is_initialized() and dist.get_world_size() > 1:
        model = wrap_data_parallel(model, p.ddp, p.bucket_mb, p.reduce_dtype)
    return model


def wrap_data_parallel(
    model: nn.Module, kind: str = "torch", bucket_mb: float = 25.0, reduce_dtype: str = "fp32"
) -> nn.Module:
    """``kind`` "torch" (PyTorch's DistributedDataParallel) or "ours" (``cookmind.parallel.DDP``) around ``model``.

    reduce_dtype "bf16" all-reduces gradients in bf16 (half the bytes): ours on any backend, torch's through
    its bf16 compression hook, which needs NCCL. Needs an initialised process group.
    """
    if kind not in DDP_KINDS:
        raise ValueError(f"parallel.ddp must be one of {DDP_KINDS}, got {kind!r}")
    if reduce_dtype not in ("fp32", "bf16"):
        raise ValueError(f"parallel.reduce_dtype must be fp32 or bf16, got {reduce_dtype!r}")
    if kind == "ours":
        return DDP(model, bucket_size_mb=bucket_mb, reduce_dtype=torch.bfloat16 if reduce_dtype == "bf16" else None)
    if reduce_dtype == "bf16" and dist.get_backend() != "nccl":
        raise ValueError(
            "parallel.reduce_dtype=bf16 with parallel.ddp=torch needs the NCCL backend (torch's "
            f"bf16 hook), this job runs {dist.get_backend()}; use parallel.ddp=ours, which "
            "reduces in bf16 on any backend, or parallel.reduce_dtype=fp32"
        )
    device = next(model.parameters()).device
    wrapped = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=bucket_mb
    )
    if reduce_dtype == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        wrapped.register_comm_hook(None, bf16_compress_hook)
    return wrapped


def no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on non-final micro-steps (``sync`` False); a no-op without a DDP wrapper."""
    if sync or not isinstance(model, (DDP, nn.parallel.DistributedDataParallel)):
        return contextlib.nullcontext()
    return model.no_sync()


def finish_gradient_sync(model: nn.Module) -> None:
    """Wait for the averaged gradients: our DDP all-reduces asynchronously; torch's is done when backward is."""
    if isinstance(model, DDP):
        model.finish_gradient_synchronization()
