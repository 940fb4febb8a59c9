"""Triton FlashAttention against naive float64 attention on the GPU (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from cookmind.kernels import FlashAttentionTriton
from tests.test_kernels import _check

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-2, torch.float16: 1e-2, torch.bfloat16: 3e-2}  # fp32 dots run as tf32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("d", [64, 128])
def test_triton_flash_matches_naive(dtype, causal, d):
    _check(FlashAttentionTriton, 2, 8, 2, 1000, 1000, d, causal, dtype, "cuda", TOL[dtype])  # GQA 4:1, ragged


@pytest.mark.parametrize(
    "b,h,hkv,tq,tk,d,causal",
    [
        (1, 4, 4, 4096, 4096, 128, True),  # long, many tiles
        (3, 6, 3, 77, 77, 32, True),  # shorter than one tile
        (1, 4, 1, 300, 700, 64, True),  # queries aligned to the last keys
        (1, 2, 2, 129, 257, 16, False),
    ],
)
def test_triton_flash_shapes(b, h, hkv, tq, tk, d, causal):
    _check(FlashAttentionTriton, b, h, hkv, tq, tk, d, causal, torch.bfloat16, "cuda", 3e-2)


def test_triton_flash_non_contiguous_inputs():
    # (B, T, H, D) projections viewed as (B, H, T, D), as a model produces them
    b, t, h, d = 2, 513, 4, 64
    q = torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kv = torch.randn(b, t, 2, 2 * d, device="cuda", dtype=torch.bfloat16)
    k, v = kv[..., :d].transpose(1, 2), kv[..., d:].transpose(1, 2)
    from tests.test_kernels import naive_attention

    out = FlashAttentionTriton.apply(q, k, v, True)
    ref = naive_attention(q.double(), k.double(), v.double(), True)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 3e-2
