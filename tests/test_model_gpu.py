"""CUDA-only: the attention backends agree on the GPU, in forward and backward."""

from __future__ import annotations

import pytest
import torch

from cookmind.model import CookMindConfig, CookMindLM, KVCache

pytestmark = pytest.mark.gpu


def _pair(backend_a, backend_b, dtype, **kw):
    base = dict(
        dict(
            vocab_size=211,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
        ),
        **kw,
    )
    a = CookMindLM(CookMindConfig(**base, attn_backend=backend_a)).cuda().to(dtype)
    b = CookMindLM(CookMindConfig(**base, attn_backend=backend_b)).cuda().to(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("backend", ["naive", "flash-triton", "cudnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backends_match_sdpa_on_cuda(backend, dtype):
    ref, other = _pair("sdpa", backend, dtype, qk_norm=True)
    ids = torch.randint(0, 211, (2, 300), device="cuda")
    out_ref, out = ref(ids, labels=ids), other(ids, labels=ids)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.logits, out_ref.logits, rtol=tol, atol=tol)
    out_ref.loss.backward()
    out.loss.backward()
    for (name, p), q in zip(ref.named_parameters(), other.parameters()):
        torch.testing.assert_close(q.grad.float(), p.grad.float(), rtol=5 * tol, atol=5 * tol, msg=name)


def test_flash_triton_model_decodes_with_cache():
    ref, flash = _pair("sdpa", "flash-triton", torch.bfloat16)
    ids = torch.randint(0, 211, (2, 40), device="cuda")
    with torch.no_grad():
        full = ref(ids).logits
        cache = KVCache(flash.config, 2, 64, device="cuda", dtype=torch.bfloat16)
        parts = [flash(ids[:, :30], kv_cache=cache).logits]
        parts += [flash(ids[:, i : i + 1], kv_cache=cache).logits for i in range(30, 40)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_cudnn_backend_runs_cudnn_kernels(kv_heads):
    """attn_backend="cudnn" really reaches cuDNN's attention (the profile names its kernels), MHA and GQA."""
    if not torch.backends.cudnn.is_available():
        pytest.skip("cuDNN is not available")
    from torch.profiler import ProfilerActivity, profile

    _, model = _pair("sdpa", "cudnn", torch.bfloat16, num_key_value_heads=kv_heads)
    ids = torch.randint(0, 211, (2, 256), device="cuda")
    model(ids, labels=ids).loss.backward()  # warm-up
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any("cudnn" in n.lower() for n in names), sorted(names)[:40]
