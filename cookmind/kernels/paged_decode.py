"""Decode attention over a paged KV cache, reading each row's blocks where they lie.

One decode step gives every row one new token. ``paged_decode_attention`` takes that token's
query, key and value (before RoPE, or already rotated), and in one pass per layer:
  - rotates q and k by the row's RoPE angles (when cos/sin are given),
  - stores the new key and value at the row's write index in the layer's pools,
  - attends the query to the row's cached positions 0..pos-1, found through its block table,
    plus the new token itself (taken from registers, so no program waits on another's store).

The gather path it replaces copies every row's keys and values into a contiguous (B, H, L, D)
tensor, masks it to each row's length and runs SDPA: at batch 64 that copy is most of a step.
Here nothing is copied and each row reads only its own length, so one CUDA graph serves every
length (no length buckets).

Small batches split each row's positions over several programs (flash-decoding): with one row
and 12 heads a GPU would otherwise run 12 programs. Each split keeps its running max, sum and
weighted values; a second kernel merges them.

On CUDA the Triton kernels run (Triton imported on first use); elsewhere ``paged_decode_reference``,
the same computation in PyTorch, stands in, and tests hold the two to each other. Layouts:
q (B, H, D), k and v (B, Hkv, D), any strides with a unit last dim (views into a fused QKV
projection work as they are); pools (num_blocks * block_size, Hkv, D); block_tables (rows, max_blocks).
"""

from __future__ import annotations

import functools
import math
import os

import torch

from .triton_device import launching_on, triton_runs_on

LOG2_E = 1.4426950408889634
BLOCK_N = 64  # cached positions per loop iteration


def kernel_available(device: torch.device, head_dim: int) -> bool:
    """Whether the Triton kernel can run here: CUDA (or Triton's interpreter), Triton importable,
    and a power-of-two head dim from 16 to 256."""
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        return False
    return triton_runs_on(device)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def default_splits(batch: int, heads: int, device: torch.device) -> int:
    """Splits per row so that batch * heads * splits fills the GPU's SMs once (1, 2, 4, 8 or 16);
    COOKMIND_DECODE_SPLITS=N fixes it (for benchmarks)."""
    fixed = os.environ.get("COOKMIND_DECODE_SPLITS")
    if fixed:
        return int(fixed)
    sms = _num_sms(device)
    splits = 1
    while splits < 16 and batch * heads * splits * 2 <= sms:
        splits *= 2
    return splits


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, D) rotated like model.rope.apply_rope: x cos + rotate_half(x) sin, in float32."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat((-x2, x1), dim=-1) * sin[:, None]


def paged_decode_reference(
    q,
    k,
    v,
    key_cache,
    value_cache,
    block_tables,
    positions,
    write_index,
    block_size: int,
    cos=None,
    sin=None,
    scale: float | None = None,
) -> torch.Tensor:
    """The kernel's computation in PyTorch (float32 math, the cache's rounding for stored keys):
    store k, v at write_index, attend each row to positions 0..positions[b]; returns (B, H, D)."""
    b, h, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q32, k32 = q.float(), k.float()
    if cos is not None:
        q32, k32 = _rope(q32, cos.float(), sin.float()), _rope(k32, cos.float(), sin.float())
    k_store, v_store = k32.to(key_cache.dtype), v.to(value_cache.dtype)
    q32 = q32.to(q.dtype).float()  # the query is rounded like the projections' output
    key_cache.index_copy_(0, write_index, k_store)
    value_cache.index_copy_(0, write_index, v_store)
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    for row in range(b):
        n = int(positions[row]) + 1
        cols = torch.arange(n, device=q.device)
        phys = block_tables[row, cols // block_size] * block_size + cols % block_size
        keys, values = key_cache[phys].float(), value_cache[phys].float()  # (n, Hkv, D)
        keys[-1], values[-1] = k_store[row].float(), v_store[row].float()  # the new token (as stored)
        group = h // hkv
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("hd,nhd->hn", q32[row], keys) * scale
        out[row] = torch.einsum("hn,nhd->hd", scores.softmax(-1), values).to(q.dtype)
    return out


def self_check(device, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int, block_size: int) -> str | None:
    """Run the Triton kernel once on a small random case of this layout against the reference;
    None when they agree, else what went wrong (a compile error, or the largest difference). Lets a
    caller fall back to another attention path instead of serving wrong tokens or crashing mid-request."""
    try:  # all of it: whatever goes wrong here must turn into a fallback, not a server that cannot start
        g = torch.Generator().manual_seed(0)
        tables = torch.tensor([[1, 2, 3], [4, 0, 0]], device=device)  # row 0: 2 blocks + 3 positions; row 1: 1
        positions = torch.tensor([2 * block_size + 2, 0], device=device)
        write = torch.tensor([3 * block_size + 2, 4 * block_size], device=device)  # each row's newest position
        pool = (5 * block_size, n_kv, head_dim)
        kc = torch.randn(pool, generator=g).to(device, dtype)
        vc = torch.randn(pool, generator=g).to(device, dtype)
        q = torch.randn(2, n_heads, head_dim, generator=g).to(device, dtype)
        k, v = (torch.randn(2, n_kv, head_dim, generator=g).to(device, dtype) for _ in range(2))
        cos, sin = (torch.rand(2, head_dim, generator=g).to(device, dtype) for _ in range(2))
        kc2, vc2 = kc.clone(), vc.clone()
        out = paged_decode_attention(q, k, v, kc, vc, tables, positions, write, block_size, cos, sin, num_splits=2)
        want = paged_decode_reference(q, k, v, kc2, vc2, tables, positions, write, block_size, cos, sin)
        err = (out.float() - want.float()).abs().max().item()
    except Exception as exc:  # Triton could not compile or launch it here
        return f"{type(exc).__name__}: {exc}"[:300]
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    return None if err <= tol else f"largest difference from the reference {err:.3g} (tolerance {tol})"


def paged_decode_attention(
    q,
    k,
    v,
    key_cache,
    value_cache,
    block_tables,
    positions,
    write_index,
    block_size: int,
    cos=None,
    sin=None,
    scale: float | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Store the new k, v and attend; returns (B, H, D) in q's dtype (see the module docstring).

    positions (B,): each row's new token's position (= cached tokens before it); write_index (B,):
    the pool index it is stored at; cos, sin (B, D): RoPE angles of the new token (None: q and k are
    already rotated); num_splits: programs per (row, head) (None: enough to fill the GPU once)."""
    b, h, d = q.shape
    hkv = k.shape[1]
    if h % hkv:
        raise ValueError(f"{h} query heads are not a multiple of {hkv} key/value heads")
    if not kernel_available(q.device, d):
        return paged_decode_reference(
            q, k, v, key_cache, value_cache, block_tables, positions, write_index, block_size, cos, sin, scale
        )
    from . import paged_decode_kernels as kernels

    splits = num_splits or default_splits(b, h, q.device)
    if splits & (splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {splits}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    rope = cos is not None
    cos_t = cos if rope else q  # placeholders the kernel never reads
    sin_t = sin if rope else q
    if splits > 1:
        part_ml = torch.empty((2, b, h, splits), dtype=torch.float32, device=q.device)
        part_acc = torch.empty((b, h, splits, d), dtype=torch.float32, device=q.device)
    else:
        part_ml = part_acc = out
    # Triton launches on the current device: make it the tensors' one (a model on cuda:1 in a process on cuda:0)
    with launching_on(q.device):
        kernels.paged_decode[(b, h, splits)](
            q,
            k,
            v,
            key_cache,
            value_cache,
            block_tables,
            positions,
            write_index,
            cos_t,
            sin_t,
            out,
            part_ml,
            part_acc,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            block_tables.stride(0),
            out.stride(0),
            out.stride(1),
            cos_t.stride(0) if rope else 0,
            scale * LOG2_E,
            GROUP=h // hkv,
            D=d,
            BS=block_size,
            BLOCK_N=BLOCK_N,
            SPLITS=splits,
            ROPE=rope,
            num_warps=4,
        )
        if splits > 1:
            kernels.merge_splits[(b, h)](
                part_ml, part_acc, out, out.stride(0), out.stride(1), D=d, SPLITS=splits, num_warps=1
            )
    return out
