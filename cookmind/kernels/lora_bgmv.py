"""Each row's LoRA update of one projection in two Triton launches, the row's adapter read from a device tensor
(after Punica's BGMV and S-LoRA's MBGMV: a batched gather of each row's adapter inside the matrix-vector kernel).

A decode or verify step (a few tokens a row) serves a batch whose rows use different adapters of one stack
(``infer.multi_lora``): A (n+1, R, in) with every part of a fused projection's ranks side by side, index 0 the base
(no adapter). ``add_lora_update_`` adds, in place into the projection's output y,

    y[token, part j] += scale_j[i] * (x[token] A_j[i]^T) B_j[i]^T        for the tokens of a row served by adapter i

with two launches whatever the mix: "shrink" (every part's x A^T of each row's own adapter at once: q, k and v read
the same x) and "expand" (each targeted output column's update added where it lies). A row of adapter 0 costs no
work and its output is left as it is. Where the projection's GEMM already gave every adapter's x A^T beside y (a
weight with the stacked A below its rows: ``multi_lora`` fold), the shrink is skipped and the expand reads the
row's own columns there. Nothing syncs with the host and every shape is fixed by the batch, so CUDA graphs capture
it; it is a ``torch.library`` custom op, so ``torch.compile`` keeps it as one node.

The expand's layout (``ExpandLayout``) lists the targeted output columns only: a part no adapter targets is neither
read nor written. Triton is imported on the first launch; it runs on CUDA, or on CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .triton_device import launching_on, triton_runs_on

# the most tokens a row a launch takes (a verify step: k + 1): the shrink holds a row's tokens in one tile
MAX_TOKENS = 16
# the most stacked rank columns one part of an adapter has: the expand holds a column's ranks in one tile
MAX_RANK = 64


def kernel_available(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: CUDA (or Triton's interpreter on CPU) with Triton importable."""
    return triton_runs_on(device)


class ExpandLayout(NamedTuple):
    """Where each targeted output column's update comes from: ``b`` (n+1, C, r_part_max) every adapter's B rows of
    the C targeted columns (a part's smaller rank zero-padded), ``out_col`` (C,) the column of y each is added
    to, ``rank0`` and ``rank_n`` (C,) the first of its part's rank columns in x A^T and how many."""

    b: torch.Tensor
    out_col: torch.Tensor
    rank0: torch.Tensor
    rank_n: torch.Tensor  # a NamedTuple, not a dataclass: the compiler traces its construction as a tuple's


def expand_layout(parts: list[tuple[int, int, torch.Tensor]]) -> ExpandLayout:
    """The layout of a projection's targeted parts, each given as (first output column, first rank column,
    B (n+1, out_j, r_j)), in output order."""
    stack, dtype, device = parts[0][2].shape[0], parts[0][2].dtype, parts[0][2].device
    width = sum(b.shape[1] for _, _, b in parts)
    r_max = max(b.shape[2] for _, _, b in parts)
    if r_max > MAX_RANK:
        raise ValueError(
            f"the LoRA kernels take adapters of rank up to {MAX_RANK} a part, got {r_max}; use lora_update='auto'"
        )
    flat = torch.zeros(stack, width, r_max, dtype=dtype, device=device)
    cols, rank0, rank_n, c = [], [], [], 0
    for start, r_start, b in parts:
        out, r = b.shape[1], b.shape[2]
        flat[:, c : c + out, :r] = b
        cols.append(torch.arange(start, start + out, device=device))
        rank0.append(torch.full((out,), r_start, device=device))
        rank_n.append(torch.full((out,), r, device=device))
        c += out
    return ExpandLayout(flat, torch.cat(cols).int(), torch.cat(rank0).int(), torch.cat(rank_n).int())


def lora_shrink(x: torch.Tensor, rows: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """x (B, T, in) or (B, in); rows (>= B,) each row's adapter; a (n+1, R, in). Returns float32 (B * T, R): each
    token's x A[rows[b]]^T; the tokens of a row of adapter 0 are left unwritten (never read: see the expand)."""
    from . import lora_bgmv_kernels as kernels

    n_rows, t = x.shape[0], (x.shape[1] if x.dim() == 3 else 1)
    flat = x.reshape(n_rows * t, x.shape[-1])
    rank, width = a.shape[1], a.shape[2]
    low = torch.empty(n_rows * t, rank, dtype=torch.float32, device=x.device)
    block_t = max(1, 1 << (t - 1).bit_length())
    block_r = 16
    block_k = max(16, min(256, 4096 // (block_t * block_r), 1 << (width - 1).bit_length()))
    with launching_on(x.device):
        kernels.lora_shrink[(n_rows, -(-rank // block_r))](
            flat,
            rows,
            a,
            low,
            rank,
            flat.stride(0),
            a.stride(0),
            a.stride(1),
            low.stride(0),
            T=t,
            IN=width,
            BLOCK_T=block_t,
            BLOCK_R=block_r,
            BLOCK_K=block_k,
            num_warps=4,
        )
    return low


def lora_expand_(
    y: torch.Tensor,
    low: torch.Tensor,
    low_adapter_stride: int,
    rows: torch.Tensor,
    layout: ExpandLayout,
    scale: torch.Tensor,
    tokens: int,
) -> None:
    """y (B * T, >= out) += each targeted column's update from low (B * T, ...): the row's rank columns start at
    rows[b] * low_adapter_stride (0: low is the shrink's; R: a fold's every-adapter x A^T). scale: (n+1, R) the
    scaling of each stacked rank column."""
    from . import lora_bgmv_kernels as kernels

    n_rows, c = y.shape[0] // tokens, layout.b.shape[1]
    r_pad = max(2, 1 << (layout.b.shape[2] - 1).bit_length())
    block_c = max(16, min(128, 4096 // r_pad))
    with launching_on(y.device):
        kernels.lora_expand[(n_rows, -(-c // block_c))](
            low,
            rows,
            layout.b,
            scale,
            layout.out_col,
            layout.rank0,
            layout.rank_n,
            y,
            c,
            low.stride(0),
            low_adapter_stride,
            layout.b.stride(0),
            layout.b.stride(1),
            scale.stride(0),
            y.stride(0),
            T=tokens,
            BLOCK_C=block_c,
            R_PAD=r_pad,
            num_warps=4,
        )


@torch.library.custom_op("cookmind::lora_bgmv_add_", mutates_args=("y",))
def _add_op(
    y: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    a: torch.Tensor,
    scale: torch.Tensor,
    b: torch.Tensor,
    out_col: torch.Tensor,
    rank0: torch.Tensor,
    rank_n: torch.Tensor,
    low_offset: int,
) -> None:
    tokens = x.shape[1] if x.dim() == 3 else 1
    flat_y = y.view(-1, y.shape[-1])
    if low_offset < 0:
        low, stride = lora_shrink(x, rows, a), 0
    else:
        low, stride = flat_y[:, low_offset:], a.shape[1]
    lora_expand_(flat_y, low, stride, rows, ExpandLayout(b, out_col, rank0, rank_n), scale, tokens)


@_add_op.register_fake
def _(y, x, rows, a, scale, b, out_col, rank0, rank_n, low_offset):
    return None


def add_lora_update_(
    y: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    a: torch.Tensor,
    scale: torch.Tensor,
    layout: ExpandLayout,
    low_offset: int | None = None,
) -> None:
    """In place: y (B, T, W) or (B, W), the projection of x (B, T, in) or (B, in), plus each row's adapter update
    (see the module docstring). rows (>= B,): each row's adapter (0: none); a (n+1, R, in) every part's A side by
    side; scale (n+1, R) float32, each rank column's scaling; layout: ``expand_layout`` of the parts' B.
    low_offset: None computes x A^T (the shrink); an int reads it from y's own columns low_offset.. (a fold's
    every-adapter x A^T, (n+1) R wide), the shrink skipped. At most ``MAX_TOKENS`` tokens a row."""
    tokens = x.shape[1] if x.dim() == 3 else 1
    if tokens > MAX_TOKENS:
        raise ValueError(f"the LoRA kernels take up to {MAX_TOKENS} tokens a row, got {tokens}")
    if y.stride(-1) != 1 or x.stride(-1) != 1 or a.stride(-1) != 1:
        raise ValueError("the LoRA kernels need unit last strides in y, x and A")
    off = -1 if low_offset is None else low_offset
    torch.ops.cookmind.lora_bgmv_add_(y, x, rows, a, scale, layout.b, layout.out_col, layout.rank0, layout.rank_n, off)
