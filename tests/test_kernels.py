"""FlashAttention kernels against naive attention written here (materialised scores, repeated K/V)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from cookmind.kernels import FlashAttentionPytorch, FlashAttentionTriton
from tests.triton_fixtures import kernel_device, needs_kernel


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
    with pytest.raises(ValueError, match="same number of dims"):
        FlashAttentionPytorch.apply(q[0], kv, kv, True)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs the kernel on the CPU")
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


def sdpa_reference(q, k, v, is_causal):
    """(output, logsumexp) from F.scaled_dot_product_attention and torch.logsumexp, in float64, with the
    causal mask bottom-right aligned as our kernels align it (SDPA's is_causal aligns top-left)."""
    import torch.nn.functional as F

    q, k, v = q.double(), k.double(), v.double()
    tq, tk = q.shape[-2], k.shape[-2]
    mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq) if is_causal else None
    gqa = q.dim() >= 3 and q.shape[-3] != k.shape[-3]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    kr = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) if gqa else k
    s = q @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return out, torch.logsumexp(s, -1)


# (q shape, k/v shape, causal): every rank F.scaled_dot_product_attention takes
SHAPES = [
    ((70, 16), (70, 16), True),  # (T, D)
    ((3, 70, 16), (3, 70, 16), True),  # (B, T, D)
    ((2, 40, 32), (2, 90, 32), False),  # (B, Tq, D) with more keys
    ((4, 2, 40, 16), (4, 2, 100, 16), True),  # (B, H, T, D), queries aligned to the last keys
    ((2, 3, 4, 33, 16), (2, 3, 2, 33, 16), True),  # (A, B, H, T, D) with GQA 2:1
    ((4, 50, 16), (2, 50, 16), False),  # 3-D with GQA over dim -3, as SDPA's enable_gqa
]


def check_against_sdpa(fn, q_shape, kv_shape, causal, dtype, device, tol):
    """Output, all three gradients and the saved logsumexp of fn against float64 SDPA on the same inputs."""
    q64 = torch.randn(q_shape, dtype=torch.float64, device=device, requires_grad=True)
    k64 = torch.randn(kv_shape, dtype=torch.float64, device=device, requires_grad=True)
    v64 = torch.randn(kv_shape, dtype=torch.float64, device=device, requires_grad=True)
    ref, ref_lse = sdpa_reference(q64, k64, v64, causal)
    do = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do)
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q64, k64, v64))
    out = fn.apply(q, k, v, causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert _rel(out, ref) < tol, f"output rel error {_rel(out, ref)}"
    lse = [t for t in out.grad_fn.saved_tensors if t.shape == q.shape[:-1]]
    assert len(lse) == 1, f"expected one saved tensor of shape {tuple(q.shape[:-1])} (the logsumexp)"
    assert lse[0].dtype == torch.float32 and _rel(lse[0], ref_lse) < max(tol, 1e-5)
    grads = torch.autograd.grad(out, (q, k, v), do.to(dtype))
    for name, g, r in zip("qkv", grads, ref_grads):
        assert g.shape == r.shape and g.dtype == dtype
        assert _rel(g, r) < tol, f"d{name} rel error {_rel(g, r)}"


@pytest.mark.parametrize("q_shape, kv_shape, causal", SHAPES)
def test_pytorch_flash_any_leading_dims_matches_sdpa(q_shape, kv_shape, causal):
    check_against_sdpa(FlashAttentionPytorch, q_shape, kv_shape, causal, torch.float32, "cpu", 1e-5)


@needs_kernel
@pytest.mark.parametrize("q_shape, kv_shape, causal", SHAPES)
def test_triton_flash_any_leading_dims_matches_sdpa(q_shape, kv_shape, causal):
    """Under TRITON_INTERPRET=1 on the CPU (or on CUDA): fp32 inputs, fp32 out, full fp32 accuracy."""
    check_against_sdpa(FlashAttentionTriton, q_shape, kv_shape, causal, torch.float32, kernel_device(), 1e-4)


def test_leading_dims_must_agree():
    q, k = torch.randn(2, 3, 4, 8, 16), torch.randn(2, 5, 4, 8, 16)
    with pytest.raises(ValueError, match="batch dims"):
        FlashAttentionPytorch.apply(q, k, k, False)
    with pytest.raises(ValueError, match="same number of dims"):
        FlashAttentionPytorch.apply(q[0], k[0, 0], k[0, 0], False)
