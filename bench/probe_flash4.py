"""FlashAttention-4 (the flash-attn-4 package's CuTe DSL kernels) against cuDNN's fused attention, at the presets'
attention: B=8, T=2048, 16 query and 8 key/value heads of 128, causal, bf16. A probe: it decided that
cookmind does not take FlashAttention-4 as a backend (docs/BENCHMARKS.md, "Attention on Hopper").

    python bench/probe_flash4.py     # an H100/H200 with flash-attn-4 and nvidia-cutlass-dsl[cu13] installed

Prints JSON lines: the relative error of the output and of dq, dk, dv against an fp32 reference (both
kernels), then forward and forward+backward milliseconds (Triton's do_bench, median) and TFLOP/s
(forward 4·B·H·T²·D/2, backward 2.5x that).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@torch.library.custom_op("cookmind_probe::flash4_fwd", mutates_args=(), device_types="cuda")
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    from flash_attn.cute import interface

    return tuple(interface._flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)[:2])


@_fwd.register_fake
def _(q, k, v, scale):
    b, t, h, _ = q.shape
    return q.new_empty(b, t, h, v.shape[-1]), q.new_empty(b, h, t, dtype=torch.float32)


@torch.library.custom_op("cookmind_probe::flash4_bwd", mutates_args=(), device_types="cuda")
def _bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from flash_attn.cute import interface

    return tuple(interface._flash_attn_bwd(q, k, v, out, dout, lse, scale, True)[:3])


@_bwd.register_fake
def _(dout, q, k, v, out, lse, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3], *output)
    ctx.scale = inputs[3]


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return (*_bwd(dout.contiguous(), q, k, v, out, lse, ctx.scale), None)


_fwd.register_autograd(_backward, setup_context=_setup_context)


def flash4(q, k, v):
    """q (B, T, H, D), k and v (B, T, Hkv, D): the projections' layout, GQA native."""
    return _fwd(q.contiguous(), k.contiguous(), v.contiguous(), q.shape[-1] ** -0.5)[0]


def cudnn(q, k, v):
    """SDPA with cuDNN's kernel first, as the model's attn_backend 'cudnn' (and torch 2.11's default here)."""
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION], set_priority=True):
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
    return y.transpose(1, 2)


def main() -> int:
    if not torch.cuda.is_available():
        print("probe_flash4 needs a CUDA GPU (Hopper or newer) and the flash-attn-4 package", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    dev = torch.device("cuda")
    b, t, h, hkv, d = 8, 2048, 16, 8, 128
    torch.manual_seed(0)
    q = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, t, hkv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, t, hkv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(b, t, h, d, device=dev, dtype=torch.bfloat16)

    t0 = time.time()
    flash4(q, k, v).backward(do)
    torch.cuda.synchronize()
    print(json.dumps({"first_call_s": round(time.time() - t0, 1)}))  # the CuTe DSL compiles on the first call
    ref = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out_ref = F.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in ref), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    out_ref.backward(do.float())

    def rel(a, r):
        return ((a.float() - r).norm() / r.norm()).item()

    errors = {}
    for name, fn in (("flash4", flash4), ("cudnn", cudnn)):
        for x in (q, k, v):
            x.grad = None
        out = fn(q, k, v)
        out.backward(do)
        errors[name] = [rel(out, out_ref)] + [rel(x.grad, r.grad) for x, r in zip((q, k, v), ref, strict=True)]
    print(json.dumps({"check": "relative error vs fp32: out, dq, dk, dv", **errors}))

    fwd_flops = 4 * b * h * t * t * d / 2
    for name, fn in (("cudnn", cudnn), ("flash4", flash4)):
        ms_f = do_bench(lambda fn=fn: fn(q, k, v), rep=200, return_mode="median")
        ms_fb = do_bench(lambda fn=fn: fn(q, k, v).backward(do), rep=200, return_mode="median", grad_to_none=[q, k, v])
        line = {"impl": name, "fwd_ms": round(ms_f, 4), "fwd_bwd_ms": round(ms_fb, 4), "bwd_ms": round(ms_fb - ms_f, 4)}
        line |= {
            "fwd_tflops": round(fwd_flops / ms_f / 1e9, 1),
            "bwd_tflops": round(2.5 * fwd_flops / (ms_fb - ms_f) / 1e9, 1),
        }
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
