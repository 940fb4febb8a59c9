"""The model's fused projections and fast paths (cookmind/model/fused.py) equal the readable math they sit beside."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cookmind.model import CookMindConfig, CookMindLM, KVCache
from cookmind.model.fused import fast_paths_enabled, fuse_projections, set_fast_paths
from cookmind.model.lora import apply_lora
import lm_fixtures

TINY = {**lm_fixtures.TINY, "vocab_size": 97}  # the ids and shapes below are written for 97


@pytest.fixture
def readable():
    """Run a test with the fast paths off, restoring the switch afterwards."""
    before = fast_paths_enabled()
    set_fast_paths(False)
    yield
    set_fast_paths(before)


@pytest.fixture
def fast():
    """Run a test with the fast paths on, restoring the switch afterwards."""
    before = fast_paths_enabled()
    set_fast_paths(True)
    yield
    set_fast_paths(before)


def _run(model, ids, fast: bool, **kw):
    before = fast_paths_enabled()
    set_fast_paths(fast)
    try:
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids, **kw)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.logits.detach(), out.loss.detach(), grads
    finally:
        set_fast_paths(before)


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


@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "qk_norm": True}, {"tie_word_embeddings": True}])
def test_model_fast_path_equals_readable_path_forward_and_grads(extra):
    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig(**TINY, **extra))
    if extra.get("attention_bias"):
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.1)
    ids = torch.randint(0, 97, (3, 12))
    logits_f, loss_f, grads_f = _run(model, ids, fast=True)
    logits_r, loss_r, grads_r = _run(model, ids, fast=False)
    torch.testing.assert_close(logits_f, logits_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_f, loss_r, rtol=1e-6, atol=1e-6)
    assert grads_f.keys() == grads_r.keys()
    for name in grads_r:
        torch.testing.assert_close(grads_f[name], grads_r[name], rtol=1e-5, atol=1e-6, msg=name)


def test_lazy_fp32_logits_under_bf16_autocast(fast):
    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig(**TINY))
    ids = torch.randint(0, 97, (2, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids)
    assert out.raw_logits.dtype == torch.bfloat16  # the forward writes no fp32 (B, T, V) copy
    assert out.logits.dtype == torch.float32 and out.logits is out.logits  # upcast once, then kept
    torch.testing.assert_close(out.logits, out.raw_logits.float(), rtol=0, atol=0)
    ref = F.cross_entropy(out.logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))  # torch's own CE
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-5)


def test_kv_cache_decoding_same_with_fast_paths(readable):
    torch.manual_seed(0)
    cfg = CookMindConfig(**TINY)
    model = CookMindLM(cfg).eval()
    ids = torch.randint(0, 97, (2, 9))
    results = []
    for fast in (False, True):
        set_fast_paths(fast)
        cache = KVCache(cfg, batch_size=2, max_seq_len=16)
        with torch.no_grad():
            steps = [model(ids[:, :5], kv_cache=cache).logits]
            steps += [model(ids[:, i:i + 1], kv_cache=cache).logits for i in range(5, 9)]
        results.append(torch.cat(steps, dim=1))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)


def test_lora_wrapped_projections_keep_their_own_forward():
    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig(**TINY))
    apply_lora(model, r=4, alpha=8.0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # B != 0 so the adapters change the output
    ids = torch.randint(0, 97, (2, 8))
    logits_f, _, grads_f = _run(model, ids, fast=True)
    logits_r, _, grads_r = _run(model, ids, fast=False)
    torch.testing.assert_close(logits_f, logits_r, rtol=1e-5, atol=1e-5)
    assert grads_f.keys() == grads_r.keys() and all("lora_" in n for n in grads_f)  # only adapters train
    for name in grads_r:
        torch.testing.assert_close(grads_f[name], grads_r[name], rtol=1e-5, atol=1e-6, msg=name)
