"""The Triton kernel behind adamw.py: one AdamW update of one parameter tensor, one pass over its memory.

Reads p, g, m, v once and writes p, m, v once (28 bytes a float32 element): the bandwidth floor of AdamW over
float32 state; the gradient is written back only when a clipping divisor is not 1. With master weights the
updated parameter is also written, rounded, into the model's bf16 weight (Out), and the gradient read is bf16:
28 bytes an element still. The step count, the lr, the skip flag and the gradient divisor are read from device
memory, so neither the host nor a captured CUDA graph has to know them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def adamw_update(
    P,
    Out,
    G,
    M,
    V,
    Step,
    Lr,
    FoundInf,
    GradDivisor,
    n,
    beta1,
    beta2,
    eps,
    weight_decay,
    HAS_FOUND_INF: tl.constexpr,
    HAS_DIVISOR: tl.constexpr,
    HAS_OUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program i updates elements i * BLOCK ..: p <- p (1 - lr wd); m <- lerp(m, g, 1 - b1);
    v <- b2 v + (1 - b2) g^2; p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t = Step
    (already counted), g divided by GradDivisor first (and written back when that is not 1); with HAS_OUT, p
    rounded to Out's dtype is stored in Out too; a nonzero FoundInf leaves everything as it was."""
    skip = 0.0
    if HAS_FOUND_INF:
        skip = tl.load(FoundInf)
    if skip == 0.0:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        t = tl.load(Step)
        lr = tl.load(Lr)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_DIVISOR:
            divisor = tl.load(GradDivisor)
            g = g / divisor
            if divisor != 1.0:  # clipped: leave the clipped gradient behind, as clip_grad_norm_ would
                tl.store(G + offs, g.to(G.dtype.element_ty), mask=mask)
        p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
        p = p * (1.0 - lr * weight_decay)
        m = m + (1.0 - beta1) * (g - m)
        v = beta2 * v + (1.0 - beta2) * g * g
        bias1 = 1.0 - tl.exp2(t * tl.log2(beta1))
        bias2_sqrt = tl.sqrt(1.0 - tl.exp2(t * tl.log2(beta2)))
        denom = tl.sqrt(v) / bias2_sqrt + eps
        p = p - (lr / bias1) * (m / denom)
        tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
        if HAS_OUT:
            tl.store(Out + offs, p.to(Out.dtype.element_ty), mask=mask)
        tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
        tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)
