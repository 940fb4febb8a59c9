"""Mixed precision: bf16 autocast over fp32 master weights, fp16 with a loss scaler, or plain fp32.

Weights and optimizer state stay fp32; only the matmuls of the forward/backward run in the low-precision
type. (``train.master_weights`` makes the weights themselves bf16, with fp32 masters in the optimizer:
``cookmind.optim.master_weights``.) fp16's narrow exponent needs the loss scaled up before backward (and the
gradients unscaled before clipping); bf16 has fp32's exponent and needs no scaler.
"""

from __future__ import annotations

import contextlib

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast block for one forward pass (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {sorted(_DTYPES)}, got {precision!r}")
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def make_grad_scaler(precision: str, device: torch.device):
    """A GradScaler for fp16, None otherwise."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)
