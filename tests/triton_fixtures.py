"""Where our Triton kernels' tests can run: CUDA, or the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch


def kernel_device() -> str | None:
    """ "cuda" when a GPU is present, "cpu" under the interpreter with triton installed, else None."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None:
        return "cpu"
    return None


needs_kernel = pytest.mark.skipif(
    kernel_device() is None, reason="the Triton kernel needs CUDA, or TRITON_INTERPRET=1 with triton installed"
)
