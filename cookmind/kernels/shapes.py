"""Input checks shared by the attention kernels: one clear error per way the shapes can be wrong."""

from __future__ import annotations

import torch


def as_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Views of q (..., H, Tq, D) and k, v (..., Hkv, Tk, D) as 4-D (B, H, T, D), the way
    F.scaled_dot_product_attention reads its inputs: (B, T, D) is B heads of one batch (the same
    thing as B batches of one head), (T, D) one head, and the dims before the head dim are flattened
    into B (they must match between q and k/v). Head dims may differ: grouped-query attention.
    """
    if q.dim() < 2 or not (q.dim() == k.dim() == v.dim()):
        raise ValueError(
            f"attention expects q, k, v with the same number of dims (..., T, D); got q{tuple(q.shape)}, "
            f"k{tuple(k.shape)}, v{tuple(v.shape)}. (B, T, H, D) inputs need .transpose(1, 2) first."
        )
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
        raise ValueError(
            f"the batch dims before (H, T, D) differ: q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}"
        )
    return tuple(
        x.reshape(-1, *x.shape[-3:]) if x.dim() > 4 else x.reshape((1,) * (4 - x.dim()) + x.shape) for x in (q, k, v)
    )


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool):
    """Validate q (B, H, Tq, D), k/v (B, Hkv, Tk, D) (see as_heads for other ranks); return (B, H, Tq, D, Hkv, Tk)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attention expects 4-D tensors (B, H, T, D) here; got q{tuple(q.shape)}, k{tuple(k.shape)}, "
            f"v{tuple(v.shape)}. Pass other ranks through as_heads first."
        )
    b, h, tq, d = q.shape
    bk, hkv, tk, dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k{tuple(k.shape)} and v{tuple(v.shape)} must have the same shape")
    if bk != b or dk != d:
        raise ValueError(f"batch/head-dim mismatch: q{tuple(q.shape)} vs k{tuple(k.shape)}")
    if hkv == 0 or h % hkv != 0:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({hkv}) for grouped-query attention")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}; cast them to one dtype")
    if is_causal and tq > tk:
        raise ValueError(
            f"causal attention needs at least as many keys as queries (Tq={tq} > Tk={tk}); "
            "queries are aligned to the last keys"
        )
    return b, h, tq, d, hkv, tk


def autocast_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Cast q, k, v to the autocast dtype when autocast is on (as SDPA does), else require one dtype."""
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return q.to(dtype), k.to(dtype), v.to(dtype)
    return q, k, v
