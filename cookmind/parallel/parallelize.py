"""``parallelize(model, cfg)``: everything that wraps the model for training, applied from outside in one order.

    0. FP8 blocks                 the blocks' projections become float8 linears in place (``train.fp8_blocks``)
    1. activation checkpointing   each block wrapped in place (``apply_activation_checkpointing``)
    2. torch.compile              the whole model, or each block in place (``train.compile_scope=blocks``)
    3. data parallelism           our bucketed DDP or PyTorch's, around the compiled model

The model never knows about any of it; ``unwrap`` gets it back. The order is the one torchtitan's per-model
``parallelize`` uses: checkpointing inside compile (the compiler traces the recompute regions), data parallelism
last (its gradient hooks and collectives stay outside the compiled graphs). ZeRO-1 shards the
optimizer, not the model: ``ShardedOptimizer`` wraps the optimizer when ``parallel.zero1`` is set
(``cookmind.train.build.build_optimizer``), over the same DDP-averaged gradients.

With ``parallel.fsdp`` step 3 is FSDP2 (``cookmind.parallel.fsdp.shard_model``): ``fully_shard`` each block and
then the root, in place of the DDP wrapper, on any number of ranks. Compile is then per block (step 2 compiles
each block in place, as torchtitan does), so FSDP's hooks and collectives stay outside the compiled graphs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from cookmind.model.float8_blocks import apply_fp8_blocks, fast_accum_gemms

from .activation_checkpointing import apply_activation_checkpointing
from .compile_blocks import compile_blocks
from .ddp import DDP
from .fsdp import set_gradient_sync, shard_model

if TYPE_CHECKING:
    from cookmind.train.config import TrainConfig

DDP_KINDS = ("torch", "ours")


def parallelize(model: nn.Module, cfg: TrainConfig, device: torch.device | None = None) -> nn.Module:
    """Apply ``cfg``'s FP8 blocks, activation checkpointing, torch.compile and data parallelism to ``model``, in
    that order.

    Returns the module to train (the outermost wrapper); ``model`` itself is changed only by FP8 blocks and
    checkpointing, which swap or wrap its blocks' modules in place (state-dict names unchanged). Data
    parallelism applies when a process group of more than one rank is up (``init_distributed``); the model
    must be on this rank's device already. With ``parallel.fsdp`` the model is sharded in place (its blocks
    compiled in place) and returned itself; that needs a process group of any size. ``device``: the device the
    model trains on (default: its parameters'); under FSDP the model may still be on the CPU, sharding moves it.
    """
    t, p = cfg.train, cfg.parallel
    if hasattr(model, "lm_head_fast_accum"):  # the FP8 LM head's GEMMs follow the float8 blocks' choice
        model.lm_head_fast_accum = tuple(sorted(fast_accum_gemms(t.fp8_fast_accum)))
    fp8 = apply_fp8_blocks(model, cfg, device)  # before compile (it traces the float8 casts) and before any sharding
    if fp8 is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        sys.stderr.write(f"cookmind train: {fp8.summary()}\n")  # one write: ranks under torchrun share one stderr
    head_fp8 = getattr(getattr(model, "config", None), "lm_head_fp8", False)
    if head_fp8 and (device if device is not None else next(model.parameters()).device).type != "cuda":
        head_fp8 = False  # on a CPU the head keeps the training precision (the Trainer warns)
    if head_fp8 and (not dist.is_initialized() or dist.get_rank() == 0):
        print(  # an opt-in speed option with a measured cost: say it where the run starts, not only in the docs
            "cookmind train: model.lm_head_fp8: the LM head's GEMMs in FP8; faster, but at Qwen3-0.6B its loss after "
            "200 steps was 2.3-2.9% above bf16's in four runs (docs/BENCHMARKS.md): compare with a bf16 run",
            file=sys.stderr,
        )
    if t.activation_checkpointing:
        apply_activation_checkpointing(model)
    mode = None if t.compile_mode == "default" else t.compile_mode
    if p.fsdp:
        if t.compile:
            compile_blocks(model, mode=mode)
        return shard_model(
            model,
            p.reshard_after_forward,
            fsdp_param_dtype(cfg),
            _DTYPES[p.reduce_dtype],
            unit_blocks=p.fsdp_unit_blocks,
            prefetch=p.fsdp_prefetch,
        )
    if t.compile and t.compile_scope == "blocks":
        compile_blocks(model, mode=mode)
    elif t.compile:
        model = torch.compile(model, mode=mode)
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
    # gradients as views into DDP's communication buckets: without, every gradient is held twice (the .grad and
    # its bucket's copy), 4 bytes a parameter more in an fp32 run
    wrapped = nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_mb,
        gradient_as_bucket_view=True,
    )
    if reduce_dtype == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        wrapped.register_comm_hook(None, bf16_compress_hook)
    return wrapped


def fsdp_param_dtype(cfg: TrainConfig) -> torch.dtype | None:
    """The dtype FSDP gathers and computes the weights in: bf16 for a bf16 run, else the weights' own (fp32)."""
    return torch.bfloat16 if cfg.train.precision == "bf16" else None


def shard_frozen(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Shard a frozen model that runs beside the policy (a DPO or GRPO reference) as ``parallelize`` shards the
    policy under ``parallel.fsdp``: each block and the root, the same gather dtype; returns it.

    Every module, the root too, frees its gathered weights after its forward whatever
    ``parallel.reshard_after_forward`` says: without a backward nothing else would, and the whole model would
    stay gathered. Its forwards are collectives like the policy's: every rank runs them together. No FP8
    blocks, checkpointing or compile: it only runs forwards without gradients.
    """
    return shard_model(model, True, fsdp_param_dtype(cfg), _DTYPES[cfg.parallel.reduce_dtype], reshard_root=True)


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP) on non-final micro-steps (``sync`` False);
    a no-op without data parallelism. The backward must run inside."""
    if sync:
        return contextlib.nullcontext()
    if isinstance(model, (DDP, nn.parallel.DistributedDataParallel)):
        return model.no_sync()
    return _fsdp_no_sync(model)


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module):
    set_gradient_sync(model, False)  # a no-op for a model that is not sharded
    try:
        yield
    finally:
        set_gradient_sync(model, True)


def finish_gradient_sync(model: nn.Module) -> None:
    """Wait for the averaged gradients: our DDP all-reduces asynchronously; torch's is done when backward is."""
    if isinstance(model, DDP):
        model.finish_gradient_synchronization()
