"""Process-group setup for torchrun-launched jobs: NCCL on GPUs, gloo on CPUs."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None when running as a single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(backend: str | None = None, device_type: str | None = None) -> DistInfo:
    """Join the job torchrun started (RANK / WORLD_SIZE / LOCAL_RANK); a single process needs no group.

    backend: "nccl" or "gloo"; default nccl when CUDA is present, else gloo. The CUDA device is
    set to LOCAL_RANK before the group is made, so NCCL binds one GPU per process.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices are visible")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device(device_type)
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device, dist.get_backend())
    if world_size == 1:
        return DistInfo(0, 1, 0, device, None)
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(f"WORLD_SIZE={world_size} but {var} is unset; launch with torchrun --nproc_per_node N")
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    # device_id binds NCCL to this rank's GPU up front (no guessing from the rank)
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    return DistInfo(rank, world_size, local_rank, device, backend)


def destroy_distributed() -> None:
    """Tear the process group down (a no-op when there is none)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def find_free_port() -> int:
    """A TCP port free on this host right now, for MASTER_PORT in tests and local launches."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
