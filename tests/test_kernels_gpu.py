"""Triton FlashAttention against naive float64 attention on the GPU (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from cookmind.kernels import FlashAttentionTriton
from tests.test_kernels import SHAPES, _check, check_against_sdpa

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}  # fp32: full-precision dots by default


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


def test_triton_flash_under_torch_compile():
    from tests.test_kernels import naive_attention

    q, k, v = (torch.randn(2, 8, 600, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    fn = torch.compile(lambda q, k, v: FlashAttentionTriton.apply(q, k, v, True) * 2.0, fullgraph=True)
    out = fn(q, k, v)
    out.sum().backward()
    ref = naive_attention(q.double(), k.double(), v.double(), True) * 2.0
    assert ((out.double() - ref).norm() / ref.norm()).item() < 3e-2
    qd = q.detach().double().requires_grad_()
    (naive_attention(qd, k.detach().double(), v.detach().double(), True) * 2.0).sum().backward()
    assert ((q.grad.double() - qd.grad).norm() / qd.grad.norm()).item() < 3e-2


def test_model_flash_triton_backend_matches_sdpa():
    from cookmind.model import CookMindConfig, CookMindLM

    cfg = dict(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    ref_model = CookMindLM(CookMindConfig(**cfg, attn_backend="sdpa")).cuda()
    model = CookMindLM(CookMindConfig(**cfg, attn_backend="flash-triton")).cuda()
    model.load_state_dict(ref_model.state_dict())
    ids = torch.randint(0, 256, (2, 300), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = ref_model(ids, labels=ids).loss
        got = model(ids, labels=ids).loss
    ref.backward()
    got.backward()
    assert abs(got.item() - ref.item()) < 1e-2
    g_ref = ref_model.model.layers[0].self_attn.q_proj.weight.grad
    g = model.model.layers[0].self_attn.q_proj.weight.grad
    assert ((g - g_ref).norm() / g_ref.norm()).item() < 5e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_shape, kv_shape, causal", SHAPES)
def test_triton_flash_any_leading_dims_matches_sdpa_cuda(q_shape, kv_shape, causal, dtype):
    """(T, D), (B, T, D), (B, H, T, D), 5-D and GQA shapes; the saved logsumexp has q's leading shape."""
    check_against_sdpa(FlashAttentionTriton, q_shape, kv_shape, causal, dtype, "cuda", TOL[dtype])


def test_triton_flash_fp32_tf32_when_allowed():
    """torch.set_float32_matmul_precision("high") lets fp32 dots run as TF32, as it does for torch.matmul."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        check_against_sdpa(FlashAttentionTriton, (2, 4, 700, 64), (2, 2, 700, 64), True, torch.float32, "cuda", 1e-2)
    finally:
        torch.set_float32_matmul_precision(old)
