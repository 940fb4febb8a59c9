"""AdamW over a list of tensors with one Triton kernel per tensor (``adamw_kernels.adamw_update``).

Why not ``torch._fused_adamw_``: on an H200 at the 1.3B Llama shape its multi-tensor kernels took 13.8 ms a step
for 1.27B float32 parameters, about half of the memory bandwidth AdamW needs (28 bytes an element: 7.4 ms at
4.8 TB/s); it also writes every gradient back divided by the clipping divisor, even a divisor of 1. One launch
per tensor streams each tensor at full width; ~220 launches a step cost the host a few ms, hidden behind the
GPU's step (and nothing inside a captured CUDA graph). ``bench/bench_adamw.py`` measures both.

Same arguments as ``torch._fused_adamw_`` where they overlap: per-parameter step tensors (already incremented),
the lr as a 0-dim device tensor, the optional skip flag and gradient divisor as 0-dim device tensors.
"""

from __future__ import annotations

import torch

from .triton_device import TRITON_FOUND, launching_on

BLOCK = 1024  # elements a program, 4 a thread at 8 warps: on the H200 9.27 ms against 9.52 (2048) and 10.42 (4096)
NUM_WARPS = 8


def available(device: torch.device) -> bool:
    """Whether the Triton kernel can run on ``device``: CUDA with triton importable (the optimizer never takes
    Triton's interpreter: tests call ``adamw_triton_`` by name)."""
    return device.type == "cuda" and TRITON_FOUND


def adamw_triton_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: torch.Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
    outs: list[torch.Tensor] | None = None,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
) -> None:
    """Update ``params``, ``exp_avgs`` and ``exp_avg_sqs`` in place (contiguous float32 tensors on one device;
    gradients float32 or bf16/fp16). Gradients are divided by ``grad_scale`` as they are read and written back
    divided only where it is not 1 (the clipped gradients are left behind, as after clip_grad_norm_).

    ``outs`` (master weights): a contiguous bf16 tensor per parameter that the kernel writes the updated
    parameter into, rounded, in the same pass (the model's weight; ``params`` are then its fp32 masters)."""
    from .adamw_kernels import adamw_update

    if not params:
        return
    with launching_on(params[0].device):
        for i, (p, g, m, v, t) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True)):
            n = p.numel()
            if n == 0:
                continue
            out = outs[i] if outs is not None else None
            if not all(x.is_contiguous() for x in (p, g, m, v, p if out is None else out)):
                raise ValueError(f"adamw_triton_: tensors of shape {tuple(p.shape)} must be contiguous")
            if out is not None and (out.shape != p.shape or out.dtype not in (torch.bfloat16, torch.float16)):
                raise ValueError(
                    f"adamw_triton_: an out must be bf16 or fp16 of its parameter's shape {tuple(p.shape)}, got "
                    f"{out.dtype} {tuple(out.shape)}"
                )
            adamw_update[(-(-n // block),)](
                p,
                p if out is None else out,
                g,
                m,
                v,
                t,
                lr,
                found_inf if found_inf is not None else lr,
                grad_scale if grad_scale is not None else lr,
                n,
                beta1,
                beta2,
                eps,
                weight_decay,
                HAS_FOUND_INF=found_inf is not None,
                HAS_DIVISOR=grad_scale is not None,
                HAS_OUT=out is not None,
                BLOCK=block,
                num_warps=num_warps,
            )
