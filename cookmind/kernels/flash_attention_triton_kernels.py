"""Triton kernels for FlashAttention-2 (forward; backward as delta, dK/dV and dQ kernels).

Imported only when the Triton path is used, so ``cookmind.kernels`` loads on machines without
Triton. Layout: every tensor is (B, heads, T, D) with arbitrary strides; one program handles one
tile of rows for one (batch, head). Softmax runs in base 2: scores are multiplied by
qk_scale = log2(e) / sqrt(D) so exp2 replaces exp; L is stored in natural-log units (the
logsumexp callers expect) and turned back into log2 units where the backward kernels load it.
PRECISION is tl.dot's input_precision ("ieee" or "tf32"; it matters only for fp32 inputs).

Causal tiles come in three kinds: fully visible (no mask), on the diagonal (masked) and fully
hidden (skipped). Queries are aligned to the last keys: row i sees key j iff j <= i + (Tk - Tq).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * ln(2); a global a kernel reads must be a constexpr object
LOG2_E = tl.constexpr(1.4426950408889634)

# COOKMIND_FLASH_AUTOTUNE=1 lets Triton time every tile shape that fits per (head dim, causal,
# lengths); otherwise each kernel takes the first candidate that fits and compiles once.
_AUTOTUNE = os.environ.get("COOKMIND_FLASH_AUTOTUNE", "0") == "1"
_SMEM_BUDGET = 200 * 1024  # bytes; Hopper gives a block up to 227 KB, the rest is Triton's own scratch

# (BLOCK_M, BLOCK_N, num_warps, num_stages), best guess first; the small ones catch fp32 and old GPUs
_FWD = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 4), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
_BWD = [(64, 128, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2), (32, 32, 4, 2)]
_DQ = [(128, 64, 8, 3), (64, 64, 4, 3), (64, 128, 8, 3), (128, 32, 4, 3), (64, 64, 4, 2), (32, 32, 4, 2)]
_KEY = ["HEAD_D", "IS_CAUSAL", "Tq", "Tk"]


def _smem_bytes(cfg, streamed: int, resident: int, d: int, size: int) -> int:
    """Shared memory of two pipelined tiles (x num_stages) plus two resident tiles, in bytes."""
    m, n, _, stages = cfg
    rows = {0: m, 1: n}
    return (stages * 2 * rows[streamed] + 2 * rows[resident]) * d * size


class Launcher:
    """Launch one kernel with a tile config: the first candidate that fits, or Triton's autotuner.

    streamed/resident: which block axis (0 = BLOCK_M, 1 = BLOCK_N) the per-step tiles and the
    held tiles use, for the shared-memory estimate.
    """

    def __init__(self, fn, candidates, streamed: int, resident: int, prefer=None):
        self.fn, self.candidates, self.streamed, self.resident = fn, candidates, streamed, resident
        self.prefer = prefer  # (head_dim, Tk) -> config measured best there, tried first
        self.tuned = None
        if _AUTOTUNE:
            configs = [
                triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in candidates
            ]
            self.tuned = triton.autotune(
                configs=configs, key=_KEY, prune_configs_by={"early_config_prune": self._prune}
            )(fn)

    def fitting(self, d: int, size: int, tk: int = 0):
        order = self.candidates
        if self.prefer is not None:
            best = self.prefer(d, tk)
            order = [best] + [c for c in self.candidates if c != best]
        fit = [c for c in order if _smem_bytes(c, self.streamed, self.resident, d, size) <= _SMEM_BUDGET]
        return fit or self.candidates[-1:]

    def _prune(self, configs, named_args, **kwargs):
        d, size = kwargs["HEAD_D"], named_args["Q"].element_size()
        keep = {(m, n) for m, n, _, _ in self.fitting(d, size)}
        return [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) in keep] or configs[-1:]

    def __call__(
        self, grid, *args, HEAD_D: int, IS_CAUSAL: bool, element_size: int, Tk: int = 0, PRECISION: str = "tf32"
    ):
        """grid: meta-dict -> launch grid, as Triton's autotuner expects."""
        if self.tuned is not None:
            return self.tuned[grid](*args, HEAD_D=HEAD_D, IS_CAUSAL=IS_CAUSAL, PRECISION=PRECISION)
        m, n, w, s = self.fitting(HEAD_D, element_size, Tk)[0]
        meta = {"BLOCK_M": m, "BLOCK_N": n}
        return self.fn[grid(meta)](
            *args,
            HEAD_D=HEAD_D,
            IS_CAUSAL=IS_CAUSAL,
            BLOCK_M=m,
            BLOCK_N=n,
            PRECISION=PRECISION,
            num_warps=w,
            num_stages=s,
        )

    def chosen(self) -> dict:
        """Autotuned picks so far, {key: config string} (empty without autotune)."""
        return {str(k): str(v) for k, v in (self.tuned.cache.items() if self.tuned is not None else [])}


@triton.jit
def _fwd_tile(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kt,
    stride_vt,
    start_m,
    lo,
    hi,
    Tk,
    offset,
    qk_scale,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax over key tiles [lo, hi); MASKED tiles apply the causal and length masks."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :] * stride_kt + offs_d[:, None]  # K^T tile (D, BLOCK_N)
        v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            kt = tl.load(kt_ptrs, mask=offs_n[None, :] < Tk, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < Tk, other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # S = Q K^T * log2(e) / sqrt(D)
        if MASKED:
            visible = offs_n[None, :] < Tk
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + offset)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(
    Q,
    K,
    V,
    O,
    L,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_ob,
    stride_oh,
    stride_ot,
    H,
    GROUP,
    Tq,
    Tk,
    qk_scale,
    IS_CAUSAL: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """O = softmax(Q K^T / sqrt(D)) V and L = logsumexp of each score row (natural log)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP  # the shared K/V head of this query head (GQA)
    offset = Tk - Tq
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < Tq, other=0.0)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    even_end = (Tk // BLOCK_N) * BLOCK_N  # key tiles that need no length mask
    if IS_CAUSAL:
        # a key tile is fully visible to this row block iff its last key <= start_m + offset
        full_end = tl.minimum(tl.maximum(start_m + offset + 1, 0) // BLOCK_N * BLOCK_N, even_end)
        hi = tl.minimum(Tk, start_m + BLOCK_M + offset)
    else:
        full_end = even_end
        hi = Tk
    acc, l_i, m_i = _fwd_tile(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        start_m,
        0,
        full_end,
        Tk,
        offset,
        qk_scale,
        False,
        IS_CAUSAL,
        BLOCK_M,
        BLOCK_N,
        HEAD_D,
        PRECISION,
    )
    acc, l_i, m_i = _fwd_tile(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        start_m,
        full_end,
        hi,
        Tk,
        offset,
        qk_scale,
        True,
        IS_CAUSAL,
        BLOCK_M,
        BLOCK_N,
        HEAD_D,
        PRECISION,
    )
    acc = acc / l_i[:, None]  # O = diag(l)^-1 acc
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=offs_m[:, None] < Tq)
    tl.store(L + bh * Tq + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=offs_m < Tq)  # L = (m + log2(l)) ln 2


@triton.jit
def flash_bwd_delta_kernel(
    O,
    DO,
    Delta,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_db,
    stride_dh,
    stride_dt,
    H,
    Tq,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Delta_i = rowsum(dO_i * O_i), the softmax-backward correction term."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    row_ok = offs_m[:, None] < Tq
    o = tl.load(
        O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], mask=row_ok, other=0.0
    ).to(tl.float32)
    do = tl.load(
        DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dt + offs_d[None, :], mask=row_ok, other=0.0
    ).to(tl.float32)
    tl.store(Delta + bh * Tq + offs_m, tl.sum(o * do, 1), mask=offs_m < Tq)


@triton.jit
def _dkdv_tile(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    l_base,
    delta_base,
    stride_qt,
    stride_dt,
    start_n,
    lo,
    hi,
    Tq,
    offset,
    qk_scale,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi), working on transposed scores."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qt_ptrs = q_base + offs_m[None, :] * stride_qt + offs_d[:, None]  # Q^T (D, BLOCK_M)
        do_ptrs = do_base + offs_m[:, None] * stride_dt + offs_d[None, :]
        if MASKED:
            qt = tl.load(qt_ptrs, mask=offs_m[None, :] < Tq, other=0.0)
            do = tl.load(do_ptrs, mask=offs_m[:, None] < Tq, other=0.0)
            l = tl.load(l_base + offs_m, mask=offs_m < Tq, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=offs_m < Tq, other=0.0)
        else:
            qt = tl.load(qt_ptrs)
            do = tl.load(do_ptrs)
            l = tl.load(l_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        st = tl.dot(k, qt, input_precision=PRECISION) * qk_scale  # S^T (BLOCK_N, BLOCK_M)
        pt = tl.math.exp2(st - l[None, :] * LOG2_E)  # P^T recomputed from L
        if MASKED:
            visible = offs_m[None, :] < Tq
            if IS_CAUSAL:
                visible = visible & (offs_n[:, None] <= offs_m[None, :] + offset)
            pt = tl.where(visible, pt, 0.0)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)  # dV += P^T dO
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dP^T = V dO^T
        dst = pt * (dpt - delta[None, :])  # dS^T = P^T * (dP^T - Delta)
        # dK += dS^T Q (scaled once at the end)
        dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=PRECISION)
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DK,
    DV,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_db,
    stride_dh,
    stride_dt,
    stride_dkb,
    stride_dkh,
    stride_dkt,
    stride_dvb,
    stride_dvh,
    stride_dvt,
    H,
    GROUP,
    Tq,
    Tk,
    qk_scale,
    sm_scale,
    IS_CAUSAL: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dK, dV for one key tile of one K/V head, summed over its GROUP query heads (no atomics)."""
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    hkv = H // GROUP
    b = bhk // hkv
    hk = bhk % hkv
    offset = Tk - Tq
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    n_ok = offs_n[:, None] < Tk
    k = tl.load(
        K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :], mask=n_ok, other=0.0
    )
    v = tl.load(
        V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :], mask=n_ok, other=0.0
    )
    dk = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    even_end = (Tq // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        # rows before lo see none of this tile; rows from diag_end on see all of it
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        diag_end = tl.minimum(
            (tl.maximum(start_n + BLOCK_N - 1 - offset, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M, even_end
        )
        diag_end = tl.maximum(diag_end, lo)
    else:
        lo = 0
        diag_end = 0
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_db + h * stride_dh
        l_base = L + (b * H + h) * Tq
        delta_base = Delta + (b * H + h) * Tq
        # masked tiles: the causal diagonal, then the unmasked body, then the ragged tail of Tq
        dk, dv = _dkdv_tile(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            l_base,
            delta_base,
            stride_qt,
            stride_dt,
            start_n,
            lo,
            diag_end,
            Tq,
            offset,
            qk_scale,
            True,
            IS_CAUSAL,
            BLOCK_M,
            BLOCK_N,
            HEAD_D,
            PRECISION,
        )
        dk, dv = _dkdv_tile(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            l_base,
            delta_base,
            stride_qt,
            stride_dt,
            start_n,
            tl.maximum(diag_end, lo),
            even_end,
            Tq,
            offset,
            qk_scale,
            False,
            IS_CAUSAL,
            BLOCK_M,
            BLOCK_N,
            HEAD_D,
            PRECISION,
        )
        dk, dv = _dkdv_tile(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            l_base,
            delta_base,
            stride_qt,
            stride_dt,
            start_n,
            tl.maximum(even_end, lo),
            Tq,
            Tq,
            offset,
            qk_scale,
            True,
            IS_CAUSAL,
            BLOCK_M,
            BLOCK_N,
            HEAD_D,
            PRECISION,
        )
    dk = dk * sm_scale  # dK = dS^T Q / sqrt(D)
    tl.store(
        DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkt + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=n_ok,
    )
    tl.store(
        DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvt + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=n_ok,
    )


@triton.jit
def _dq_tile(
    dq,
    q,
    do,
    l,
    delta,
    k_base,
    v_base,
    stride_kt,
    stride_vt,
    start_m,
    lo,
    hi,
    Tk,
    offset,
    qk_scale,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Accumulate dQ of one query tile over key tiles [lo, hi)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :] * stride_kt + offs_d[:, None]
        vt_ptrs = v_base + offs_n[None, :] * stride_vt + offs_d[:, None]
        if MASKED:
            kt = tl.load(kt_ptrs, mask=offs_n[None, :] < Tk, other=0.0)
            vt = tl.load(vt_ptrs, mask=offs_n[None, :] < Tk, other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            vt = tl.load(vt_ptrs)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        p = tl.math.exp2(s - l[:, None])
        if MASKED:
            visible = offs_n[None, :] < Tk
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + offset)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, vt, input_precision=PRECISION)  # dP = dO V^T
        ds = p * (dp - delta[:, None])  # dS = P * (dP - Delta)
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)  # dQ += dS K
    return dq


@triton.jit
def flash_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DQ,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_db,
    stride_dh,
    stride_dt,
    stride_dqb,
    stride_dqh,
    stride_dqt,
    H,
    GROUP,
    Tq,
    Tk,
    qk_scale,
    sm_scale,
    IS_CAUSAL: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dQ for one query tile of one head; same tile walk as the forward pass."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offset = Tk - Tq
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    m_ok = offs_m[:, None] < Tq
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=m_ok, other=0.0)
    do = tl.load(
        DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dt + offs_d[None, :], mask=m_ok, other=0.0
    )
    l = tl.load(L + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0) * LOG2_E  # to log2 units
    delta = tl.load(Delta + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    even_end = (Tk // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        full_end = tl.minimum(tl.maximum(start_m + offset + 1, 0) // BLOCK_N * BLOCK_N, even_end)
        hi = tl.minimum(Tk, start_m + BLOCK_M + offset)
    else:
        full_end = even_end
        hi = Tk
    dq = _dq_tile(
        dq,
        q,
        do,
        l,
        delta,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        start_m,
        0,
        full_end,
        Tk,
        offset,
        qk_scale,
        False,
        IS_CAUSAL,
        BLOCK_M,
        BLOCK_N,
        HEAD_D,
        PRECISION,
    )
    dq = _dq_tile(
        dq,
        q,
        do,
        l,
        delta,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        start_m,
        full_end,
        hi,
        Tk,
        offset,
        qk_scale,
        True,
        IS_CAUSAL,
        BLOCK_M,
        BLOCK_N,
        HEAD_D,
        PRECISION,
    )
    dq = dq * sm_scale  # dQ = dS K / sqrt(D)
    tl.store(
        DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqt + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=m_ok,
    )


# Picks from autotuning on one H200 (bf16, causal, 16k tokens a batch; bench/bench_attention.py
# --autotune): short sequences prefer smaller tiles, which waste less on the causal diagonal.
def _prefer_fwd(d, tk):
    return (64, 64, 4, 3) if tk <= 1024 or (d >= 128 and tk <= 4096) else (128, 64, 8, 3)


def _prefer_dkdv(d, tk):
    if d <= 64:
        return (32, 64, 4, 3)
    return (64, 64, 4, 2) if tk <= 4096 else (64, 128, 8, 3)


def _prefer_dq(d, tk):
    return (64, 64, 4, 3 if d <= 64 else 2) if tk <= 1024 else (128, 64, 8, 3)


flash_fwd = Launcher(flash_fwd_kernel, _FWD, 1, 0, _prefer_fwd)  # streams K, V; holds Q, O
flash_bwd_dkdv = Launcher(flash_bwd_dkdv_kernel, _BWD, 0, 1, _prefer_dkdv)  # streams Q, dO; holds K, V
flash_bwd_dq = Launcher(flash_bwd_dq_kernel, _DQ, 1, 0, _prefer_dq)  # streams K, V; holds Q, dO
