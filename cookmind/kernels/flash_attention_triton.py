"""FlashAttention-2 as a Triton kernel behind a torch.autograd.Function.

``FlashAttentionTriton.apply(q, k, v, is_causal)`` with q (..., H, T, D) and k, v (..., Hkv, T, D)
(H a multiple of Hkv: grouped-query attention reads the shared K/V head, never a repeated
copy), any leading dims as in F.scaled_dot_product_attention: (B, T, D) and (T, D) too. The saved
logsumexp L (natural log, fp32) has q's leading shape q.shape[:-1]. bf16/fp16 run the dots in
their dtype; fp32 runs them in full fp32 unless torch.set_float32_matmul_precision allows TF32
("high"/"medium"), as torch.matmul does. Softmax statistics and accumulators are fp32 always.
CUDA only; Triton is imported on first use so this module loads on CPU-only machines.
The kernels live in flash_attention_triton_kernels.py; the algorithm is the one written out
in plain PyTorch in flash_attention_pytorch.py.
"""

from __future__ import annotations

import math
import os

import torch

from .shapes import as_heads, autocast_inputs, check_attention_inputs

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e))
_DELTA_BLOCK = 64


def _kernels():
    """Import the Triton kernels, with a clear error where Triton is missing."""
    try:
        from . import flash_attention_triton_kernels as kernels
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "FlashAttentionTriton needs the 'triton' package and a CUDA GPU "
            f"({exc}); use attn_backend='sdpa' or FlashAttentionPytorch on this machine"
        ) from exc
    return kernels


def _check_device(q: torch.Tensor, d: int) -> None:
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":  # interpreter runs on CPU
        raise ValueError(f"FlashAttentionTriton runs on CUDA tensors; got device {q.device}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {d} is not supported by the Triton kernel; use one of {SUPPORTED_HEAD_DIMS}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {q.dtype} is not supported; use bf16, fp16 or fp32")


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """Kernels index the head dim with stride 1; copy only where it is not."""
    return x if x.stride(-1) == 1 else x.contiguous()


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for fp32 inputs: "ieee" under torch's default "highest", else "tf32"."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool):
    """Run the forward kernel; return (O, L) with L the per-row logsumexp (natural log), shape (B*H, Tq) fp32."""
    b, h, tq, d, hkv, tk = check_attention_inputs(q, k, v, is_causal)
    _check_device(q, d)
    kernels = _kernels()
    o = torch.empty_like(q)  # keeps q's strides, so the fake kernel below can promise the same
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    lse = torch.empty(b * h, tq, device=q.device, dtype=torch.float32)
    qk_scale = LOG2_E / math.sqrt(d)

    def grid(meta):
        return (triton_cdiv(tq, meta["BLOCK_M"]), b * h)

    kernels.flash_fwd(
        grid,
        q,
        k,
        v,
        o,
        lse,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *o.stride()[:3],
        h,
        h // hkv,
        tq,
        tk,
        qk_scale,
        IS_CAUSAL=is_causal,
        HEAD_D=d,
        element_size=q.element_size(),
        Tk=tk,
        PRECISION=dot_precision(q.dtype),
    )
    return o, lse


def flash_backward(q, k, v, o, lse, do, is_causal: bool):
    """Run delta, dK/dV and dQ kernels; return (dq, dk, dv) in the inputs' dtypes."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    kernels = _kernels()
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    q, k, v, o, do = (_unit_last(x) for x in (q, k, v, o, do))
    delta = torch.empty_like(lse)
    kernels.flash_bwd_delta_kernel[(triton_cdiv(tq, _DELTA_BLOCK), b * h)](
        o,
        do,
        delta,
        *o.stride()[:3],
        *do.stride()[:3],
        h,
        tq,
        HEAD_D=d,
        BLOCK_M=_DELTA_BLOCK,
    )
    qk_scale = LOG2_E / math.sqrt(d)
    sm_scale = 1.0 / math.sqrt(d)
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    size, precision = q.element_size(), dot_precision(q.dtype)
    kernels.flash_bwd_dkdv(
        lambda meta: (triton_cdiv(tk, meta["BLOCK_N"]), b * hkv),
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        *common,
        *dk.stride()[:3],
        *dv.stride()[:3],
        h,
        h // hkv,
        tq,
        tk,
        qk_scale,
        sm_scale,
        IS_CAUSAL=is_causal,
        HEAD_D=d,
        element_size=size,
        Tk=tk,
        PRECISION=precision,
    )
    kernels.flash_bwd_dq(
        lambda meta: (triton_cdiv(tq, meta["BLOCK_M"]), b * h),
        q,
        k,
        v,
        do,
        lse,
        delta,
        dq,
        *common,
        *dq.stride()[:3],
        h,
        h // hkv,
        tq,
        tk,
        qk_scale,
        sm_scale,
        IS_CAUSAL=is_causal,
        HEAD_D=d,
        element_size=size,
        Tk=tk,
        PRECISION=precision,
    )
    return dq, dk, dv


def triton_cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return (a + b - 1) // b


# Custom ops make the kernels opaque to torch.compile (it traces around them instead of into Triton's
# launcher); the fake functions tell the compiler the output shapes.
@torch.library.custom_op("cookmind::flash_attn_fwd", mutates_args=())
def flash_attn_fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel as a PyTorch op: (O, L)."""
    return flash_forward(q, k, v, is_causal)


@flash_attn_fwd_op.register_fake
def _(q, k, v, is_causal):
    return torch.empty_like(q), q.new_empty(q.shape[0] * q.shape[1], q.shape[2], dtype=torch.float32)


@torch.library.custom_op("cookmind::flash_attn_bwd", mutates_args=())
def flash_attn_bwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernels as a PyTorch op: (dQ, dK, dV)."""
    return flash_backward(q, k, v, o, lse, do, is_causal)


@flash_attn_bwd_op.register_fake
def _(q, k, v, o, lse, do, is_causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class FlashAttentionTriton(torch.autograd.Function):
    """Fused attention on CUDA: ``FlashAttentionTriton.apply(q, k, v, is_causal) -> o``."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False):
        ctx.in_dtypes = (q.dtype, k.dtype, v.dtype)  # gradients go back in these
        ctx.in_shapes = (q.shape, k.shape, v.shape)
        q_shape = q.shape
        q, k, v = as_heads(*autocast_inputs(q, k, v))
        o, lse = flash_attn_fwd_op(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse.view(q_shape[:-1]))
        ctx.is_causal = is_causal
        return o.reshape(q_shape)  # a view: o has q's (leading-dims-flattened) layout

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        grad_out = grad_out.reshape(o.shape)
        dq, dk, dv = flash_attn_bwd_op(q, k, v, o, lse.view(-1, q.shape[2]), grad_out, ctx.is_causal)
        (dt_q, dt_k, dt_v), (sq, sk, sv) = ctx.in_dtypes, ctx.in_shapes
        return dq.reshape(sq).to(dt_q), dk.reshape(sk).to(dt_k), dv.reshape(sv).to(dt_v), None
