"""Triton kernel behind linear_ce.py: per row, the cross-entropy and its gradient over the logits, in place.

A program takes BLOCK_M rows at a time and walks each row in chunks of BLOCK_V columns, twice:
  pass 1: online max and sum of exp over the row (fp32), giving lse = m + log(s) and nll = lse - z[y];
  pass 2: reads the row again (from L2 when it is still there) and overwrites it with softmax - onehot(y).
The grid may be smaller than the number of row blocks: each program then steps through row blocks
pid, pid + programs, ... (persistent), which bounds how many rows are in flight at once, so that a
row read in pass 1 is still in L2 when pass 2 comes back for it.

Exponentials run in base 2 (exp(x) = exp2(x log2 e)), as in the attention kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def cross_entropy_rows(
    Z,
    Targets,
    Nll,
    Lse,
    n_rows,
    n_cols,
    stride_row,
    ignore_index,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    WRITE_GRAD: tl.constexpr = True,
):
    """Z (n_rows, n_cols) logits, unit column stride, rows stride_row apart: read, then overwritten with
    softmax(z) - onehot(y) (0 on rows whose target is ignore_index). Nll (n_rows,) fp32: lse - z[y], 0 on
    ignored rows, nan where a kept target lies outside [0, n_cols).
    WRITE_GRAD=False: pass 1 only; Z stays as it is and Lse (n_rows,) fp32 gets each row's logsumexp
    (for cross_entropy_grad_tiles)."""
    log2_e = 1.4426950408889634
    ln_2 = 0.6931471805599453
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    offs_m = tl.arange(0, BLOCK_M)
    offs_v = tl.arange(0, BLOCK_V)
    for block in range(pid, n_blocks, programs):
        rows = block * BLOCK_M + offs_m
        row_ok = rows < n_rows
        # rows past the end read the last row, which is in this same block (so read before its pass 2
        # overwrites it), and store nothing: every row of the block has finite logits to reduce
        safe_rows = tl.minimum(rows, n_rows - 1)
        row_base = Z + safe_rows.to(tl.int64) * stride_row  # int64: N * V passes 2^31 at large N
        row_ptr = row_base[:, None]  # (BLOCK_M, 1)
        y = tl.load(Targets + safe_rows)
        keep = y != ignore_index
        in_range = (y >= 0) & (y < n_cols)
        y_safe = tl.where(keep & in_range, y, 0)

        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_M,), tl.float32)
        for v0 in range(0, n_cols, BLOCK_V):
            cols = v0 + offs_v
            z = tl.load(row_ptr + cols[None, :], mask=cols[None, :] < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, axis=1))  # finite: every chunk holds at least one column
            s = s * tl.exp2((m - m_new) * log2_e) + tl.sum(tl.exp2((z - m_new[:, None]) * log2_e), axis=1)
            m = m_new
        lse = m + tl.log2(s) * ln_2
        z_y = tl.load(row_base + y_safe).to(tl.float32)  # read before pass 2 overwrites it
        nll = tl.where(in_range, lse - z_y, float("nan"))
        tl.store(Nll + rows, tl.where(keep, nll, 0.0), mask=row_ok)
        if WRITE_GRAD:
            for v0 in range(0, n_cols, BLOCK_V):
                cols = v0 + offs_v
                ok = row_ok[:, None] & (cols[None, :] < n_cols)
                z = tl.load(row_ptr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
                grad = tl.exp2((z - lse[:, None]) * log2_e)  # softmax
                grad = grad - tl.where(cols[None, :] == y_safe[:, None], 1.0, 0.0)  # - onehot(y)
                grad = tl.where(keep[:, None], grad, 0.0)
                tl.store(row_ptr + cols[None, :], grad.to(Z.dtype.element_ty), mask=ok)
        else:
            tl.store(Lse + rows, lse, mask=row_ok)


@triton.jit
def cross_entropy_grad_tiles(
    Z,
    Lse,
    Targets,
    G,
    GT,
    n_rows,
    n_cols,
    stride_row,
    ignore_index,
    scale,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The gradient pass as tiles, for the FP8 head: one (BLOCK_M, BLOCK_V) tile of Z per program, grid
    (row blocks, column blocks).

    G = scale * (softmax(z) - onehot(y)), from the row's Lse (0 on ignored rows), rounded to G's dtype
    (an fp8 type) and written twice: G (n_rows, n_cols) row-major, and its transpose GT (n_cols, n_rows)
    row-major. Hopper's FP8 GEMMs take both operands K-major, and the two backward GEMMs reduce over
    different axes (V for grad_h, N for grad_W), so each wants one of the two layouts. Z is only read.
    """
    log2_e = 1.4426950408889634
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # row blocks on axis 0 (up to 2^31 of them)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < n_rows
    ok = row_ok[:, None] & (cols[None, :] < n_cols)
    z = tl.load(Z + rows.to(tl.int64)[:, None] * stride_row + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    lse = tl.load(Lse + rows, mask=row_ok, other=0.0)
    y = tl.load(Targets + rows, mask=row_ok, other=ignore_index)
    keep = y != ignore_index
    grad = tl.exp2((z - lse[:, None]) * log2_e) - tl.where(cols[None, :] == y[:, None], 1.0, 0.0)
    grad = tl.where(keep[:, None], grad * scale, 0.0).to(G.dtype.element_ty)
    tl.store(G + rows.to(tl.int64)[:, None] * n_cols + cols[None, :], grad, mask=ok)
    tl.store(GT + cols.to(tl.int64)[:, None] * n_rows + rows[None, :], tl.trans(grad), mask=tl.trans(ok))
