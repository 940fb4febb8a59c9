"""The serving engine's fused projections (cookmind/model/fused.py) equal the readable math they sit beside."""

from __future__ import annotations

import lm_fixtures
import pytest
import torch
import torch.nn.functional as F

from cookmind.model import CookMindConfig, CookMindLM
from cookmind.model.fused import fuse_projections
from cookmind.model.lora import apply_lora

TINY = {**lm_fixtures.TINY, "vocab_size": 97}  # the ids and shapes below are written for 97


@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "qk_norm": True}])
def test_fused_projections_equal_the_modules_and_torch_linear(extra):
    """fuse_projections' one-GEMM weights give each module's own output (checked against F.linear per weight)."""
    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig(**TINY, **extra)).eval()
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    if extra.get("attention_bias"):
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            torch.nn.init.normal_(proj.bias, std=0.1)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        plain = attn.project_qkv(x)
        ref = [F.linear(x, m.weight, m.bias) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        fused = fuse_projections(model)[0]
        assert attn.q_proj.weight.untyped_storage().data_ptr() == fused.qkv.untyped_storage().data_ptr()
        one_gemm = attn.project_qkv(x, fused.qkv, fused.qkv_bias)
        for a, b in zip(one_gemm, plain):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        if not extra:  # without QK-norm the projections are the raw GEMMs
            for a, r in zip(one_gemm, ref):
                torch.testing.assert_close(a.flatten(2), r, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(mlp(x, fused.gate_up), mlp(x), rtol=1e-6, atol=1e-6)


def test_fuse_projections_declines_lora_wrapped_and_mixed_bias_modules():
    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig(**TINY))
    apply_lora(model, r=2, targets=("q_proj", "up_proj"))
    fused = fuse_projections(model)
    assert all(f.qkv is None and f.gate_up is None for f in fused)  # a LoRA update is no stacked weight
    model = CookMindLM(CookMindConfig(**TINY))
    model.model.layers[0].self_attn.k_proj.bias = torch.nn.Parameter(torch.zeros(16))  # only k has a bias
    fused = fuse_projections(model)
    assert fused[0].qkv is None and fused[1].qkv is not None
