"""Fused LM head + cross-entropy for training: the (N, V) logits are written once and read once.

    z = h W^T                      one GEMM in the compute dtype (bf16 under autocast)
    nll_i = logsumexp(z_i) - z_i[y_i]
    d nll_i / d z_i = softmax(z_i) - onehot(y_i) =: G_i

The loss is the last op of a training step, so its gradient with respect to the logits is known, up to
one scale per row, as soon as the forward has the row's logsumexp. The forward therefore computes, in one
Triton pass over each row of z (``linear_ce_kernels.cross_entropy_rows``), the row's lse, its nll and G,
written in place over z in z's dtype; ignored rows (target == ignore_index) get G = 0. What it saves for
the backward is G, h and W. The backward's upstream grad_nll (N,) is a row scale g, and a row scale
commutes with both GEMMs:

    grad_h = g[:, None] * (G @ W)          grad_W = G^T @ (g[:, None] * h)

so the (N, V) tensor is never rescaled or read again outside the two GEMMs. The unfused path
(``lm_head`` then ``cross_entropy``) makes two passes over the logits besides the GEMMs: a logsumexp
in the forward and a softmax-minus-onehot in the backward (llm.c's fused classifier makes the same cut).

Where Triton cannot run (CPU without TRITON_INTERPRET=1, or no triton), ``cross_entropy_rows_reference``
computes the same (nll, G) in PyTorch, and tests hold the kernel to it. The GEMM and the row pass are one
``torch.library`` custom op, so torch.compile treats them as one opaque node (shapes from its fake) and
traces the rest, the backward's GEMMs included, without graph breaks.
"""

from __future__ import annotations

import functools

import torch

from .triton_device import TRITON_FOUND, launching_on, triton_runs_on

IMPLS = ("auto", "triton", "reference")
REDUCTIONS = ("mean", "sum", "none")
# Defaults from bench/bench_linear_ce.py's sweep on the H200 (N=12288, V=50304, bf16, 2026-11-30): 4096 columns
# per loop step, 8 warps, one program per row: 0.89 ms (2.77 TB/s for one read and one write of the logits),
# against 1.07 ms for the persistent grid of 2 programs per SM first chosen; a plain copy takes 0.59 ms.
CHUNK_BYTES = 8 * 1024  # of one row per loop step: 4096 bf16 logits, 2048 fp32
NUM_WARPS = 8
PROGRAMS_PER_SM = None  # None: one program per block of rows; an int: a persistent grid of that many per SM


kernel_available = triton_runs_on  # whether the Triton kernel can run on a device


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def cross_entropy_rows_reference(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's computation in PyTorch: (nll (N,) fp32, G (N, V) in the logits' dtype).

    fp32 math on the logits as stored: nll_i = lse_i - z_i[y_i], G_i = exp(z_i - lse_i) - onehot(y_i);
    both 0 on rows whose target is ignore_index. A kept target outside [0, V) fails in the gather, as
    in torch's cross_entropy.
    """
    z = logits.float()
    keep = targets != ignore_index
    y = torch.where(keep, targets, torch.zeros_like(targets))[:, None]  # (N, 1), any valid index where ignored
    lse = torch.logsumexp(z, dim=-1, keepdim=True)  # (N, 1)
    nll = (lse - z.gather(-1, y)).squeeze(-1)
    grad = torch.exp(z - lse)
    grad.scatter_add_(-1, y, torch.full_like(lse, -1.0))  # - onehot(y)
    grad = torch.where(keep[:, None], grad, 0.0).to(logits.dtype)
    return torch.where(keep, nll, 0.0), grad


def cross_entropy_rows_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    *,
    block_m: int = 1,
    block_v: int | None = None,
    num_warps: int = NUM_WARPS,
    programs_per_sm: int | None = PROGRAMS_PER_SM,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton pass: returns nll (N,) fp32 and overwrites ``logits`` with G (see the module docstring).
    Given ``lse`` ((N,) fp32), it instead leaves ``logits`` as they are and writes each row's logsumexp
    there (the first half of the FP8 head's passes, linear_ce_fp8).

    logits (N, V) with unit column stride (any row stride: a view into a wider buffer works); targets (N,)
    long. A kept target outside [0, V) gives nll = nan (checking for it here would cost a device sync).
    block_v: columns per loop step (default: CHUNK_BYTES of the row); programs_per_sm: persistent grid of
    that many programs per SM (None: one program per block of block_m rows). Keyword-only knobs for the
    benchmark's sweep; the defaults are what training uses.
    """
    import triton

    from . import linear_ce_kernels as kernels

    n, v = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError(f"cross_entropy_rows_triton: logits need a unit column stride, got strides {logits.stride()}")
    if targets.shape != (n,) or targets.dtype != torch.long:
        raise ValueError(
            f"cross_entropy_rows_triton: targets must be ({n},) int64, got {tuple(targets.shape)} {targets.dtype}"
        )
    nll = torch.empty(n, dtype=torch.float32, device=logits.device)
    if lse is not None and (lse.shape != (n,) or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(
            f"cross_entropy_rows_triton: lse must be a contiguous ({n},) fp32 tensor, "
            f"got {tuple(lse.shape)} {lse.dtype}"
        )
    if n == 0:
        return nll
    if block_v is None:
        block_v = min(CHUNK_BYTES // logits.element_size(), triton.next_power_of_2(v))
    blocks = triton.cdiv(n, block_m)
    grid = blocks if programs_per_sm is None else min(blocks, programs_per_sm * _num_sms(logits.device))
    # Triton launches on the current device: make it the tensors' one
    with launching_on(logits.device):
        kernels.cross_entropy_rows[(grid,)](
            logits,
            targets.contiguous(),
            nll,
            nll if lse is None else lse,
            n,
            v,
            logits.stride(0),
            ignore_index,
            BLOCK_M=block_m,
            BLOCK_V=block_v,
            WRITE_GRAD=lse is None,
            num_warps=num_warps,
        )
    return nll


@torch.library.custom_op("cookmind::linear_cross_entropy_forward", mutates_args=())
def _forward_op(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, impl: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """z = h W^T, then (nll, G) from the Triton pass (G written over z) or from the reference."""
    use_kernel = impl == "triton" or (impl == "auto" and kernel_available(h.device))
    if use_kernel and not kernel_available(h.device):
        raise RuntimeError(
            f"linear_cross_entropy: impl='triton' needs the 'triton' package and a CUDA device "
            f"(or TRITON_INTERPRET=1), got device {h.device}, triton "
            f"{'found' if TRITON_FOUND else 'missing'}; use impl='auto' or 'reference'"
        )
    with torch.autocast(h.device.type, enabled=False):  # the caller chose the dtype; keep the GEMM in it
        logits = h @ weight.t()  # (N, V), fresh and internal: G may overwrite it
        if use_kernel:
            return cross_entropy_rows_triton(logits, targets, ignore_index), logits
        return cross_entropy_rows_reference(logits, targets, ignore_index)


@_forward_op.register_fake
def _(h, weight, targets, ignore_index, impl):
    return h.new_empty(h.shape[0], dtype=torch.float32), h.new_empty(h.shape[0], weight.shape[0])


class _LinearCrossEntropy(torch.autograd.Function):
    """(h (N, C), weight (V, C), targets (N,), keep (N,)) -> nll (N,) fp32; saves G, h, W (module docstring)."""

    @staticmethod
    def forward(ctx, h, weight, targets, keep, ignore_index: int, impl: str):
        nll, grad = _forward_op(h, weight, targets, ignore_index, impl)
        ctx.save_for_backward(grad, h, weight, keep)
        return nll

    @staticmethod
    def backward(ctx, grad_nll):
        grad, h, weight, keep = ctx.saved_tensors
        g = torch.where(keep, grad_nll, 0.0)[
            :, None
        ]  # (N, 1); where, not *: a nan upstream on an ignored row stays out
        grad_h = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_h = ((grad @ weight) * g).to(h.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = grad.t() @ (h * g).to(h.dtype)
        return grad_h, grad_w, None, None, None, None


def _check_inputs(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str, impl: str, same_dtype: bool = True
) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if impl not in IMPLS:
        raise ValueError(f"linear_cross_entropy: impl must be one of {IMPLS}, got {impl!r}")
    if h.dim() < 1 or weight.dim() != 2 or h.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: need h (..., C) and weight (V, C), got h{tuple(h.shape)} "
            f"and weight{tuple(weight.shape)}"
        )
    if targets.shape != h.shape[:-1]:
        raise ValueError(
            f"linear_cross_entropy: targets{tuple(targets.shape)} must have h's leading shape "
            f"{tuple(h.shape[:-1])} (one target per row of h)"
        )
    if targets.dtype != torch.long:
        raise ValueError(f"linear_cross_entropy: targets must be int64 (torch.long), got {targets.dtype}")
    if same_dtype and h.dtype != weight.dtype:
        raise ValueError(
            f"linear_cross_entropy: h is {h.dtype} but weight is {weight.dtype}; cast them to one "
            "dtype or run under torch.autocast"
        )
    if not (h.device == weight.device == targets.device):
        raise ValueError(
            f"linear_cross_entropy: h, weight, targets on {h.device}, {weight.device}, "
            f"{targets.device}; put them on one device"
        )


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    impl: str = "auto",
    fp8: bool = False,
    fp8_fast_accum: tuple[str, ...] = (),
) -> torch.Tensor:
    """cross_entropy(h @ weight^T, targets) without a second pass over the logits (see the module docstring).

    h (..., C), weight (V, C) (the LM head's, as nn.Linear stores it), targets (...) int64. reduction
    "mean" (over kept positions; 0 when none are kept), "sum" or "none" (ignored positions give 0), as in
    ``cookmind.model.cross_entropy``. Under autocast, h and weight are first cast to the autocast dtype
    with a differentiable ``.to``, so fp32 master weights get fp32 gradients as through nn.Linear.
    impl: "auto" (the Triton kernel where ``kernel_available``, else the PyTorch reference), "triton"
    or "reference".
    fp8=True runs the three GEMMs in FP8 (``linear_ce_fp8``; CUDA with compute capability >= 8.9); where
    N, C or V is not a multiple of 16 (FP8 GEMMs need it) it runs this bf16 path instead. ``fp8_fast_accum``
    names the FP8 GEMMs that accumulate fast (``output``, ``grad_input``, ``grad_weight``; train.fp8_fast_accum).
    """
    if not (h.is_floating_point() and weight.is_floating_point()):
        raise ValueError(f"linear_cross_entropy: h and weight must be floating point, got {h.dtype}, {weight.dtype}")
    device_type = h.device.type
    if fp8:
        from .linear_ce_fp8 import fp8_supported, shapes_fit

        if not fp8_supported(h.device):
            raise ValueError(
                f"linear_cross_entropy: fp8=True needs a CUDA GPU with FP8 tensor cores (compute "
                f"capability >= 8.9: Ada, Hopper) and triton; got {h.device}"
                + (f" (capability {torch.cuda.get_device_capability(h.device)})" if h.is_cuda else "")
                + "; use fp8=False"
            )
        fp8 = shapes_fit(targets.numel(), h.shape[-1], weight.shape[0])
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        h = h.to(dtype)
        if not fp8:  # the FP8 path quantises the fp32 master weight itself
            weight = weight.to(dtype)
    _check_inputs(h, weight, targets, reduction, impl, same_dtype=not fp8)
    y = targets.reshape(-1)
    keep = y != ignore_index
    if fp8:
        from .linear_ce_fp8 import LinearCrossEntropyFP8

        nll = LinearCrossEntropyFP8.apply(
            h.reshape(-1, h.shape[-1]), weight, y, keep, ignore_index, tuple(sorted(fp8_fast_accum))
        )
    else:
        nll = _LinearCrossEntropy.apply(h.reshape(-1, h.shape[-1]), weight, y, keep, ignore_index, impl)
    if reduction == "none":
        return nll.view(targets.shape)
    if reduction == "sum":
        return nll.sum()
    return nll.sum() / keep.sum().clamp(min=1)
