"""Triton kernels behind paged_decode.py: decode attention over block tables, and the merge of splits.

Program (b, h, s) handles query head h of row b over the s-th share of the row's cached positions.
Softmax runs in base 2 (the scale carries log2(e)). Share 0 starts from the new token itself
(score q.k_new, weight 1, value v_new); the others start empty (max -inf, sum 0), which the merge
weighs to zero. Share 0 of the first head of each KV group also stores the new key and value.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_decode(
    Q,
    K,
    V,
    KC,
    VC,
    Tables,
    Pos,
    WIdx,
    Cos,
    Sin,
    Out,
    PartML,
    PartAcc,
    sq_b,
    sq_h,
    sk_b,
    sk_h,
    sv_b,
    sv_h,
    sc_t,
    sc_h,
    st_b,
    so_b,
    so_h,
    scs_b,
    qk_scale,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    ROPE: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    n_heads = tl.num_programs(1)
    kvh = h // GROUP
    d = tl.arange(0, D)
    q_ptr = Q + b * sq_b + h * sq_h
    k_ptr = K + b * sk_b + kvh * sk_h
    q = tl.load(q_ptr + d).to(tl.float32)
    k_new = tl.load(k_ptr + d).to(tl.float32)
    v_new = tl.load(V + b * sv_b + kvh * sv_h + d)
    if ROPE:  # x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1)
        partner = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        cos = tl.load(Cos + b * scs_b + d).to(tl.float32)
        sin = tl.load(Sin + b * scs_b + d).to(tl.float32)
        q = q * cos + sign * tl.load(q_ptr + partner).to(tl.float32) * sin
        k_new = k_new * cos + sign * tl.load(k_ptr + partner).to(tl.float32) * sin
    q = q.to(Q.dtype.element_ty).to(tl.float32) * qk_scale  # rounded like a projection's output
    k_store = k_new.to(KC.dtype.element_ty)
    v_store = v_new.to(VC.dtype.element_ty)
    pos = tl.load(Pos + b)
    if (s == 0) & (h % GROUP == 0):
        w = tl.load(WIdx + b)
        tl.store(KC + w * sc_t + kvh * sc_h + d, k_store)
        tl.store(VC + w * sc_t + kvh * sc_h + d, v_store)
    first = s == 0
    m_i = tl.where(first, tl.sum(q * k_store.to(tl.float32), axis=0), float("-inf"))
    l_i = tl.where(first, 1.0, 0.0)
    acc = tl.where(first, v_store.to(tl.float32), 0.0)
    # this program's share of positions 0..pos-1, in whole BLOCK_N tiles
    share = tl.cdiv(tl.cdiv(pos, SPLITS), BLOCK_N) * BLOCK_N
    start = s * share
    end = tl.minimum(start + share, pos)
    offs = tl.arange(0, BLOCK_N)
    table = Tables + b * st_b
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs
        ok = cols < end
        phys = tl.load(table + cols // BS, mask=ok, other=0) * BS + cols % BS
        rows = phys[:, None] * sc_t + kvh * sc_h + d[None, :]
        keys = tl.load(KC + rows, mask=ok[:, None], other=0.0).to(tl.float32)
        scores = tl.where(ok, tl.sum(keys * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new)
        values = tl.load(VC + rows, mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * values, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    if SPLITS == 1:
        tl.store(Out + b * so_b + h * so_h + d, (acc / l_i).to(Out.dtype.element_ty))
    else:
        i = (b * n_heads + h) * SPLITS + s
        n_rows = tl.num_programs(0) * n_heads * SPLITS
        tl.store(PartML + i, m_i)
        tl.store(PartML + n_rows + i, l_i)
        tl.store(PartAcc + i * D + d, acc)


@triton.jit
def merge_splits(PartML, PartAcc, Out, so_b, so_h, D: tl.constexpr, SPLITS: tl.constexpr):
    """Out[b, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the splits of (b, h)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    n_heads = tl.num_programs(1)
    n_rows = tl.num_programs(0) * n_heads * SPLITS
    i = (b * n_heads + h) * SPLITS + tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    m = tl.load(PartML + i)
    l_s = tl.load(PartML + n_rows + i)
    acc = tl.load(PartAcc + i[:, None] * D + d[None, :])
    w = tl.exp2(m - tl.max(m, axis=0))  # empty splits (m = -inf) weigh 0; split 0 is never empty
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l_s, axis=0)
    tl.store(Out + b * so_b + h * so_h + d, out.to(Out.dtype.element_ty))
