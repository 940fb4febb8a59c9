"""The fused LM head + cross-entropy with FP8 GEMMs (opt-in: ``model.lm_head_fp8``), for Hopper/Ada GPUs.

The same computation as ``linear_ce`` (read its docstring first), with the three GEMMs of the LM head in
FP8 through ``torch._scaled_mm``. At the GPT-2-small training shape (N=12288, C=768, V=50304) those GEMMs
are the largest in the step (about 30% of its GEMM time, in bf16), and FP8 tensor cores run them 1.6x as
fast (3.9 ms -> 2.4 ms on the H200, bench/probe_fp8_gemms.py).

    forward   z = (h8 W8^T) * s_h * s_w          h, W in e4m3, one scale per tensor: s = amax / 448
              lse, nll per row                   (cross_entropy_rows_triton(lse=...): z is not overwritten)
              G8 = fp8(S * (softmax(z) - onehot(y)))   and its transpose, one tiled pass
    backward  grad_h = g * (G8 W8) / S * s_w                 grad_W = (G8^T (g h)8) / S * s_gh

G lies in [-1, 1], so its scale S is a constant (no amax pass over the (N, V) tensor): GRAD_SCALE maps
|G| = 1 to 256 in e4m3 (largest finite 448). Hopper's FP8 GEMMs want both operands K-major, and the
backward's two GEMMs reduce over V (grad_h) and over N (grad_W), so the tiled pass writes G both ways:
1 + 1 bytes per element, what the bf16 path writes in place. h's rows are scaled by the upstream grad g
before their quantisation, so any per-row upstream (reduction "none") is exact up to rounding.

Rounding: e4m3 keeps 3 mantissa bits, so each quantised value is within 2^-4 relative (6%) of its input;
the GEMMs accumulate in fp32. bench/bench_linear_ce.py reports the resulting errors against an fp32
reference next to the bf16 path's (2.7% on the gradients vs 0.3%; almost all of it from h and W in e4m3,
bench/probe_fp8_grad_format.py), and tests bound them. The weight is quantised from its fp32 master
directly and its gradient comes out of the GEMM in fp32.
"""

from __future__ import annotations

import torch

from .linear_ce import kernel_available
from .triton_device import launching_on

E4M3 = torch.float8_e4m3fn if hasattr(torch, "float8_e4m3fn") else None
E4M3_MAX = 448.0
GRAD_DTYPE = E4M3
GRAD_SCALE = 256.0  # |G| <= 1 -> |S G| <= 256 < 448; a power of two, so the scaling itself is exact
# the gradient pass's tile (rows, columns) and warps: 0.91 ms at N=12288, V=50304 on the H200, the best of
# bench/bench_linear_ce.py's sweep_fp8_tiles (8 warps: 1.05 ms)
TILE_M, TILE_V, TILE_WARPS = 64, 128, 4


def fp8_supported(device: torch.device) -> bool:
    """Whether FP8 GEMMs and the Triton passes run on ``device``: CUDA compute capability >= 8.9 (Ada, Hopper)."""
    return (
        E4M3 is not None
        and device.type == "cuda"
        and kernel_available(device)
        and torch.cuda.get_device_capability(device) >= (8, 9)
    )


def fp8_head_problem(device: torch.device) -> str | None:
    """Why ``model.lm_head_fp8`` cannot run on ``device`` (None when it can): for the Trainer's early check."""
    if device.type != "cuda":
        return (
            f"model.lm_head_fp8 runs only in the fused loss on a CUDA GPU; on {device.type} the LM head "
            "keeps the training precision"
        )
    if not fp8_supported(device):
        return (
            f"model.lm_head_fp8 needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper) and triton; "
            f"{torch.cuda.get_device_name(device)} has capability {torch.cuda.get_device_capability(device)}"
        )
    return None


def shapes_fit(n: int, c: int, v: int) -> bool:
    """_scaled_mm needs every reduced and every output-column dimension a multiple of 16: N, C and V."""
    return n % 16 == 0 and c % 16 == 0 and v % 16 == 0 and n > 0


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8 e4m3, s) with x ~= x8 * s, s = amax|x| / 448 as a 0-dim fp32 tensor (no host sync)."""
    amax = x.detach().abs().amax().float().clamp(min=1e-12)
    x8 = (x.float() * (E4M3_MAX / amax)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return x8, amax / E4M3_MAX


def _col_major(x8: torch.Tensor) -> torch.Tensor:
    """The same (R, C) matrix stored column-major, as _scaled_mm wants its second operand."""
    return x8.t().contiguous().t()


@torch.library.custom_op("cookmind::linear_cross_entropy_fp8_forward", mutates_args=())
def _forward_op(
    h8: torch.Tensor,
    w8: torch.Tensor,
    scale_h: torch.Tensor,
    scale_w: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    grad_scale: float,
    fast_accum: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """z = (h8 W8^T) s_h s_w in bf16, then (nll, S G, (S G)^T) from the two Triton passes; z is dropped."""
    import triton

    from . import linear_ce_kernels as kernels
    from .linear_ce import cross_entropy_rows_triton

    n, v = h8.shape[0], w8.shape[0]
    logits = torch._scaled_mm(
        h8, w8.t(), scale_a=scale_h, scale_b=scale_w, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
    )
    lse = torch.empty(n, dtype=torch.float32, device=h8.device)
    targets = targets.contiguous()
    nll = cross_entropy_rows_triton(logits, targets, ignore_index, lse=lse)
    grad = torch.empty(n, v, dtype=GRAD_DTYPE, device=h8.device)
    grad_t = torch.empty(v, n, dtype=GRAD_DTYPE, device=h8.device)
    with launching_on(h8.device):
        kernels.cross_entropy_grad_tiles[(triton.cdiv(n, TILE_M), triton.cdiv(v, TILE_V))](
            logits,
            lse,
            targets,
            grad,
            grad_t,
            n,
            v,
            logits.stride(0),
            ignore_index,
            grad_scale,
            BLOCK_M=TILE_M,
            BLOCK_V=TILE_V,
            num_warps=TILE_WARPS,
        )
    return nll, grad, grad_t


@_forward_op.register_fake
def _(h8, w8, scale_h, scale_w, targets, ignore_index, grad_scale, fast_accum=False):
    n, v = h8.shape[0], w8.shape[0]
    return (
        h8.new_empty(n, dtype=torch.float32),
        h8.new_empty(n, v, dtype=GRAD_DTYPE),
        h8.new_empty(v, n, dtype=GRAD_DTYPE),
    )


class LinearCrossEntropyFP8(torch.autograd.Function):
    """(h (N, C), weight (V, C), targets (N,), keep (N,)) -> nll (N,) fp32, the head's GEMMs in FP8.

    fast_accum: which GEMMs accumulate in the FP8 tensor cores' fast, lower-precision mode, by torchao's names:
    ``output`` (the logits), ``grad_input`` (grad_h, reducing over V), ``grad_weight`` (grad_W, over N); the
    rest move their partial sums into fp32 as they go (cuBLAS's default), which is slower."""

    @staticmethod
    def forward(ctx, h, weight, targets, keep, ignore_index: int, fast_accum: tuple[str, ...] = ()):
        h8, scale_h = quantize(h)
        w8, scale_w = quantize(weight)
        nll, grad, grad_t = _forward_op(
            h8, w8, scale_h, scale_w, targets, ignore_index, GRAD_SCALE, "output" in fast_accum
        )
        ctx.save_for_backward(grad, grad_t, h, w8, scale_w, keep)
        ctx.weight_dtype = weight.dtype
        ctx.fast_accum = fast_accum
        return nll

    @staticmethod
    def backward(ctx, grad_nll):
        grad, grad_t, h, w8, scale_w, keep = ctx.saved_tensors
        g = torch.where(keep, grad_nll, 0.0)[
            :, None
        ]  # (N, 1); where, not *: a nan upstream on an ignored row stays out
        unscale = torch.full((), 1.0 / GRAD_SCALE, dtype=torch.float32, device=grad.device)
        grad_h = grad_w = None
        if ctx.needs_input_grad[0]:
            gw = torch._scaled_mm(
                grad,
                _col_major(w8),
                scale_a=unscale,
                scale_b=scale_w,
                out_dtype=torch.float32,
                use_fast_accum="grad_input" in ctx.fast_accum,
            )
            grad_h = (gw * g).to(h.dtype)
        if ctx.needs_input_grad[1]:
            hg8, scale_hg = quantize(h.float() * g)
            out = ctx.weight_dtype if ctx.weight_dtype in (torch.float32, torch.bfloat16) else torch.float32
            grad_w = torch._scaled_mm(
                grad_t,
                _col_major(hg8),
                scale_a=unscale,
                scale_b=scale_hg,
                out_dtype=out,
                use_fast_accum="grad_weight" in ctx.fast_accum,
            ).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None
