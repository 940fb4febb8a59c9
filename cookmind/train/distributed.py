"""Process groups and data-parallel wrapping: the seam between the Trainer and DDP implementations.

``torchrun`` sets RANK / WORLD_SIZE / LOCAL_RANK; without them the run is one process. The model
is wrapped from outside (it never knows about DDP): PyTorch's DistributedDataParallel
(``parallel.ddp: torch``) or cookmind's own bucketed DDP (``parallel.ddp: ours``, from
cookmind.parallel), optionally with a ZeRO-1 sharded optimizer (``parallel.zero1``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> this rank's GPU when CUDA is present, else CPU."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device(f"cuda:{local_rank}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={name!r} but CUDA is not available; use train.device=cpu or auto")
    return dev


def init_distributed(device_name: str = "auto", backend: str = "auto") -> DistInfo:
    """Join the torchrun process group when launched by torchrun; otherwise a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local)
    if world > 1 and not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30))
    return DistInfo(rank, world, local, device)


def wrap_model(model: torch.nn.Module, info: DistInfo, ddp: str = "torch", bucket_mb: float = 25.0,
               reduce_dtype: str = "fp32") -> torch.nn.Module:
    """Wrap for data parallelism (identity for one process). reduce_dtype "bf16" all-reduces gradients in bf16."""
    if not info.enabled:
        return model
    if ddp == "torch":
        from torch.nn.parallel import DistributedDataParallel as DDP

        import torch.distributed as dist

        if reduce_dtype == "bf16" and dist.get_backend() != "nccl":
            raise ValueError("parallel.reduce_dtype=bf16 with parallel.ddp=torch needs the NCCL backend (torch's "
                             f"bf16 hook), this job runs {dist.get_backend()}; use parallel.ddp=ours, which "
                             "reduces in bf16 on any backend, or parallel.reduce_dtype=fp32")
        ids = [info.device.index] if info.device.type == "cuda" else None
        wrapped = DDP(model, device_ids=ids, bucket_cap_mb=bucket_mb)
        if reduce_dtype == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

            wrapped.register_comm_hook(None, bf16_compress_hook)
        return wrapped
    if ddp == "ours":
        try:
            from cookmind.parallel import DDP as OurDDP
        except ImportError as exc:
            raise RuntimeError("parallel.ddp=ours needs cookmind.parallel.DDP, which is not available in this "
                               "build; use parallel.ddp=torch") from exc
        return OurDDP(model, bucket_size_mb=bucket_mb,
                      reduce_dtype=torch.bfloat16 if reduce_dtype == "bf16" else None)
    raise ValueError(f"parallel.ddp must be 'torch' or 'ours', got {ddp!r}")


def no_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on non-final micro-steps (``sync`` False) when the wrapper allows it."""
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def finish_gradient_sync(model: torch.nn.Module) -> None:
    """Wrappers that all-reduce asynchronously (ours) expose ``finish_gradient_synchronization``."""
    fn = getattr(model, "finish_gradient_synchronization", None)
    if fn is not None:
        fn()


def all_reduce_flag(flag: bool, info: DistInfo) -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op for one process)."""
    if info.enabled and dist.is_initialized():
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    """Leave the process group."""
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
