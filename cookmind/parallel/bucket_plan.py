"""Which parameters share a DDP bucket: consecutive runs, in gradient-ready order, up to a byte size."""

from __future__ import annotations

import torch
from torch import nn


def plan_buckets(
    params: list[nn.Parameter],
    bucket_bytes: float,
    first_bucket_bytes: float | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> list[list[int]]:
    """Split ``params`` (in the order their gradients become ready) into buckets; returns index lists.

    A bucket closes when the next gradient would take it past its size (in the reduce dtype's
    bytes) or has another dtype/device. The first bucket may be smaller (``first_bucket_bytes``, never
    larger than the rest), so communication starts as soon as the first gradients are in. A parameter
    larger than a bucket gets a bucket of its own.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be > 0 bytes, got {bucket_bytes}")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i, p in enumerate(params):
        nbytes = p.numel() * (reduce_dtype or p.dtype).itemsize
        first = first_bucket_bytes is not None and not buckets
        cap = min(first_bucket_bytes, bucket_bytes) if first else bucket_bytes
        head = params[current[0]] if current else None
        other_kind = head is not None and (head.dtype != p.dtype or head.device != p.device)
        if current and (size + nbytes > cap or other_kind):
            buckets.append(current)
            current, size = [], 0.0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
