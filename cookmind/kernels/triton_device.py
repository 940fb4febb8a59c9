"""Where cookmind's Triton kernels can run: on CUDA, or on a CPU under Triton's interpreter (TRITON_INTERPRET=1,
for tests), with triton importable. One answer for every kernel module."""

from __future__ import annotations

import contextlib
import importlib.util
import os

import torch

TRITON_FOUND = importlib.util.find_spec("triton") is not None  # checked once; read inside compiled code


def triton_runs_on(device: torch.device) -> bool:
    """Whether a Triton kernel can run on ``device``: triton importable, and CUDA (or Triton's interpreter)."""
    return TRITON_FOUND and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def launching_on(device: torch.device):
    """A context in which Triton launches on ``device``: Triton launches on the current CUDA device, whatever the
    tensors' (a model on cuda:1 in a process whose current device is cuda:0); nothing to do elsewhere."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
