"""Triton kernels behind lora_bgmv.py: each row's LoRA down-projection ("shrink") and up-projection added into the
projection's output ("expand"), the row's adapter read from a device tensor (id 0: no adapter, no work).

Row b owns tokens b * T .. b * T + T - 1 of the flattened (B * T, features) activations. Loop bounds (tokens a
row, input width) are compile-time constants: a few variants per model, each with its loops fixed. Products are
summed in float32 whatever the inputs' dtype; no tl.dot (it needs 16-wide tiles and rounds float32 to tf32): a
decode step's tiles are a row's few tokens by a rank of at most 64, where a broadcast product and a sum do.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lora_shrink(
    X,
    Rows,
    A,
    Low,
    R,
    sx_t,
    sa_i,
    sa_r,
    sl_t,
    T: tl.constexpr,
    IN: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (b, rb): Low[token, r] = sum_k X[token, k] A[idx, r, k] for row b's tokens and rank columns
    rb * BLOCK_R ..; idx = Rows[b]; a row of id 0 writes nothing."""
    b = tl.program_id(0)
    rb = tl.program_id(1)
    idx = tl.load(Rows + b)
    if idx != 0:
        t = tl.arange(0, BLOCK_T)
        r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        k = tl.arange(0, BLOCK_K)
        tok = b * T + t
        t_ok = t < T
        r_ok = r < R
        acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
        for k0 in range(0, IN, BLOCK_K):
            kk = k0 + k
            k_ok = kk < IN
            xs = tl.load(X + tok[:, None] * sx_t + kk[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            a = tl.load(A + idx * sa_i + r[:, None] * sa_r + kk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.sum(xs.to(tl.float32)[:, None, :] * a.to(tl.float32)[None, :, :], axis=2)
        tl.store(Low + tok[:, None] * sl_t + r[None, :], acc, mask=t_ok[:, None] & r_ok[None, :])


@triton.jit
def lora_expand(
    Low,
    Rows,
    B,
    Scale,
    OutCol,
    Rank0,
    RankN,
    Y,
    C,
    sl_t,
    sl_i,
    sb_i,
    sb_c,
    ss_i,
    sy_t,
    T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    R_PAD: tl.constexpr,
):
    """Program (b, cb): for row b's tokens and targeted output columns c = cb * BLOCK_C ..,
    Y[token, OutCol[c]] += Scale[idx, Rank0[c]] * sum_{r < RankN[c]} Low[token, idx * sl_i + Rank0[c] + r] B[idx, c, r]
    (sl_i: 0 for the shrink's own low, the stacked rank for a fold's every-adapter low); a row of id 0 is left as
    it is."""
    b = tl.program_id(0)
    cb = tl.program_id(1)
    idx = tl.load(Rows + b)
    if idx != 0:
        c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < C
        col = tl.load(OutCol + c, mask=c_ok, other=0)
        r0 = tl.load(Rank0 + c, mask=c_ok, other=0)
        rn = tl.load(RankN + c, mask=c_ok, other=0)
        r = tl.arange(0, R_PAD)
        ok = c_ok[:, None] & (r[None, :] < rn[:, None])
        w = tl.load(B + idx * sb_i + c[:, None] * sb_c + r[None, :], mask=ok, other=0.0).to(tl.float32)
        s = tl.load(Scale + idx * ss_i + r0, mask=c_ok, other=0.0)
        low_cols = idx * sl_i + r0[:, None] + r[None, :]
        for t in range(T):
            tok = b * T + t
            low = tl.load(Low + tok * sl_t + low_cols, mask=ok, other=0.0).to(tl.float32)
            y_ptr = Y + tok * sy_t + col
            y = tl.load(y_ptr, mask=c_ok, other=0.0).to(tl.float32)
            tl.store(y_ptr, (y + tl.sum(low * w, axis=1) * s).to(Y.dtype.element_ty), mask=c_ok)
