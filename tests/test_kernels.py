"""FlashAttention kernels against naive attention written here (materialised scores, repeated K/V)."""

from __future__ import annotations

import math

import pytest
import torch

from cookmind.kernels import FlashAttentionPytorch, FlashAttentionTriton


def naive_attention(q, k, v, is_causal):
    """softmax(Q K^T / sqrt(D) + causal mask) V with K/V heads repeated for grouped-query attention."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        tq, tk = s.shape[-2:]
        visible = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)  # bottom-right aligned
        s = s.masked_fill(~visible, float("-inf"))
    return s.softmax(-1) @ v


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _check(fn, b, h, hkv, tq, tk, d, causal, dtype, device, tol):
    """Outputs and all three gradients of fn against float64 naive attention on the same inputs."""
    q64 = torch.randn(b, h, tq, d, dtype=torch.float64, device=device, requires_grad=True)
    k64 = torch.randn(b, hkv, tk, d, dtype=torch.float64, device=device, requires_grad=True)
    v64 = torch.randn(b, hkv, tk, d, dtype=torch.float64, device=device, requires_grad=True)
    ref = naive_attention(q64, k64, v64, causal)
    do = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do)
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q64, k64, v64))
    out = fn.apply(q, k, v, causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    grads = torch.autograd.grad(out, (q, k, v), do.to(dtype))
    assert _rel(out, ref) < tol, f"output rel error {_rel(out, ref)}"
    for name, g, r in zip("qkv", grads, ref_grads):
        assert g.shape == r.shape and g.dtype == dtype
        assert _rel(g, r) < tol, f"d{name} rel error {_rel(g, r)}"


@pytest.mark.parametrize(
    "b,h,hkv,tq,tk,d,causal",
    [
        (2, 4, 4, 70, 70, 16, True),  # multi-head, ragged tail (70 is no multiple of the 64 tile)
        (1, 4, 2, 130, 130, 32, True),  # GQA 2:1 across three tiles
        (1, 6, 2, 100, 100, 16, False),  # GQA 3:1, non-causal
        (1, 2, 1, 40, 150, 16, True),  # fewer queries than keys: queries aligned to the last keys
    ],
)
def test_pytorch_flash_matches_naive(b, h, hkv, tq, tk, d, causal):
    _check(FlashAttentionPytorch, b, h, hkv, tq, tk, d, causal, torch.float32, "cpu", 1e-5)


def test_pytorch_flash_bf16_close_to_naive():
    _check(FlashAttentionPytorch, 1, 2, 1, 96, 96, 32, True, torch.bfloat16, "cpu", 2e-2)


def test_pytorch_flash_rejects_bad_shapes():
    q = torch.randn(1, 3, 8, 16)
    kv = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        FlashAttentionPytorch.apply(q, kv, kv, True)
    with pytest.raises(ValueError, match="4-D"):
        FlashAttentionPytorch.apply(q[0], kv[0], kv[0], True)


def test_triton_kernel_refuses_cpu_tensors():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises((ValueError, RuntimeError)):
        FlashAttentionTriton.apply(q, q, q, True)


def test_pytorch_flash_under_autocast_casts_like_sdpa():
    # mixed fp32 q/k and bf16 v, as a model under autocast produces them: computed in bf16, grads in input dtypes
    q = torch.randn(1, 2, 40, 16, requires_grad=True)
    k = torch.randn(1, 2, 40, 16, requires_grad=True)
    v = torch.randn(1, 2, 40, 16, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = FlashAttentionPytorch.apply(q, k, v, True)
    assert out.dtype == torch.bfloat16
    ref = naive_attention(q.double(), k.double(), v.double(), True)
    assert _rel(out, ref) < 2e-2
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and v.grad.dtype == torch.bfloat16
