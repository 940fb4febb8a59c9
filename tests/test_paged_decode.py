"""Paged decode attention: the PyTorch reference against SDPA over contiguous keys, and the Triton
kernel (CUDA, or Triton's interpreter on CPU) against the reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from triton_fixtures import kernel_device, needs_kernel

from cookmind.kernels.paged_decode import paged_decode_attention, paged_decode_reference
from cookmind.model.rope import RotaryEmbedding, apply_rope


def _case(b=3, h=4, hkv=2, d=16, block=4, num_blocks=40, lengths=(1, 7, 23), dtype=torch.float32, device="cpu", seed=0):
    """Random pools, a shuffled block table per row, and a new token per row at position lengths[i] - 1."""
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(num_blocks * block, hkv, d, generator=g).to(device, dtype)
    vc = torch.randn(num_blocks * block, hkv, d, generator=g).to(device, dtype)
    max_blocks = -(-max(lengths) // block) + 1
    perm = torch.randperm(num_blocks - 1, generator=g) + 1  # block 0 is scratch
    tables = torch.zeros((b, max_blocks), dtype=torch.long)
    used = 0
    for row, n in enumerate(lengths):
        k = -(-n // block)
        tables[row, :k] = perm[used : used + k]
        used += k
    positions = torch.tensor(lengths) - 1
    write = tables[torch.arange(b), positions // block] * block + positions % block
    q = torch.randn(b, h, d, generator=g).to(device, dtype)
    k = torch.randn(b, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(b, hkv, d, generator=g).to(device, dtype)
    return q, k, v, kc, vc, tables.to(device), positions.to(device), write.to(device)


def test_reference_matches_sdpa_over_contiguous_keys():
    """Reference (rope inside) == rope the new q/k, write them, gather each row's keys in order, SDPA."""
    block, lengths = 4, (1, 7, 23)
    q, k, v, kc, vc, tables, positions, write = _case(block=block, lengths=lengths)
    rope = RotaryEmbedding(16)
    cos, sin = rope(positions[:, None], torch.float32)  # (B, 1, D)
    kc2, vc2 = kc.clone(), vc.clone()
    out = paged_decode_reference(q, k, v, kc, vc, tables, positions, write, block, cos[:, 0], sin[:, 0])
    qr = apply_rope(q[:, :, None], cos, sin)  # (B, H, 1, D)
    kr = apply_rope(k[:, :, None], cos, sin)[:, :, 0]
    for row, n in enumerate(lengths):
        kc2[write[row]], vc2[write[row]] = kr[row], v[row]
        cols = torch.arange(n)
        phys = tables[row, cols // block] * block + cols % block
        keys = kc2[phys].transpose(0, 1).repeat_interleave(2, 0)  # (H, n, D)
        values = vc2[phys].transpose(0, 1).repeat_interleave(2, 0)
        want = F.scaled_dot_product_attention(qr[row], keys, values)  # (H, 1, D)
        torch.testing.assert_close(out[row], want[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, kc2)  # the new keys were stored, nothing else changed
    torch.testing.assert_close(vc, vc2)


def test_reference_without_rope_is_plain_softmax_attention():
    q, k, v, kc, vc, tables, positions, write = _case(h=2, hkv=2, lengths=(5, 2, 9))
    out = paged_decode_reference(q, k, v, kc, vc, tables, positions, write, 4)
    for row, n in enumerate((5, 2, 9)):
        cols = torch.arange(n)
        phys = tables[row, cols // 4] * 4 + cols % 4
        keys, values = kc[phys], vc[phys]  # (n, H, D), the new token already stored at n - 1
        scores = torch.einsum("hd,nhd->hn", q[row], keys) / math.sqrt(16)
        torch.testing.assert_close(out[row], torch.einsum("hn,nhd->hd", scores.softmax(-1), values))


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("splits", [1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [True, False])
def test_kernel_matches_reference(splits, dtype, rope):
    dev = kernel_device()
    lengths = (1, 64, 65, 200, 3)
    q, k, v, kc, vc, tables, positions, write = _case(
        b=5, h=8, hkv=2, d=64, block=16, num_blocks=64, lengths=lengths, dtype=dtype, device=dev, seed=3
    )
    cos = sin = None
    if rope:
        cos, sin = RotaryEmbedding(64).to(dev)(positions[:, None], dtype)
        cos, sin = cos[:, 0], sin[:, 0]
    kc2, vc2 = kc.clone(), vc.clone()
    out = paged_decode_attention(q, k, v, kc, vc, tables, positions, write, 16, cos, sin, num_splits=splits)
    want = paged_decode_reference(q, k, v, kc2, vc2, tables, positions, write, 16, cos, sin)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.float(), want.float(), **tol)
    torch.testing.assert_close(kc, kc2, **tol)
    torch.testing.assert_close(vc, vc2)


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("h,hkv,d,block,splits", [(8, 1, 128, 32, 16), (4, 4, 32, 12, 4), (6, 2, 16, 16, 2)])
def test_kernel_shapes(h, hkv, d, block, splits):
    """Head dim 128 with 8:1 GQA and 16 splits, a block size that is not a power of two, a 3:1 group."""
    dev = kernel_device()
    lengths = (700, 1, 333)
    q, k, v, kc, vc, tables, positions, write = _case(
        b=3, h=h, hkv=hkv, d=d, block=block, num_blocks=120, lengths=lengths, device=dev, seed=11
    )
    kc2, vc2 = kc.clone(), vc.clone()
    cos, sin = RotaryEmbedding(d).to(dev)(positions[:, None], torch.float32)
    out = paged_decode_attention(
        q, k, v, kc, vc, tables, positions, write, block, cos[:, 0], sin[:, 0], num_splits=splits
    )
    want = paged_decode_reference(q, k, v, kc2, vc2, tables, positions, write, block, cos[:, 0], sin[:, 0])
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kc, kc2)
    torch.testing.assert_close(vc, vc2)


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
def test_kernel_reads_strided_views_of_a_fused_projection():
    """q, k, v as column slices of one (B, (H + 2 Hkv) D) projection output, as the serving runner passes them."""
    dev = kernel_device()
    q, k, v, kc, vc, tables, positions, write = _case(
        b=2, h=4, hkv=2, d=32, block=16, num_blocks=16, lengths=(30, 70), device=dev, seed=5
    )
    fused = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    qv, kv_, vv = fused[:, :128].view(2, 4, 32), fused[:, 128:192].view(2, 2, 32), fused[:, 192:].view(2, 2, 32)
    kc2, vc2 = kc.clone(), vc.clone()
    out = paged_decode_attention(qv, kv_, vv, kc, vc, tables, positions, write, 16, num_splits=2)
    want = paged_decode_reference(q, k, v, kc2, vc2, tables, positions, write, 16)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_check_passes_on_a_working_kernel(dtype):
    from cookmind.kernels.paged_decode import self_check

    assert self_check(kernel_device(), dtype, 8, 4, 64, 16) is None


def test_runner_falls_back_to_gather_when_the_kernel_fails_its_self_check(monkeypatch):
    """auto: a kernel that fails its self-check (wrong numbers, or no compiler) is not used, with a warning;
    asked for explicitly, the runner refuses to start."""
    from lm_fixtures import sharp_tiny_lm

    import cookmind.infer.runner as runner_mod

    monkeypatch.setattr(runner_mod, "kernel_available", lambda device, head_dim: True)
    monkeypatch.setattr(
        runner_mod, "self_check", lambda *a: "largest difference from the reference 3 (tolerance 0.001)"
    )
    model = sharp_tiny_lm(head_dim=16)
    with pytest.warns(UserWarning, match="failed its self-check"):
        runner = runner_mod.ModelRunner(model, 2, 32, kv_cache="paged", num_blocks=20, block_size=4)
    assert runner.decode_attention == "gather" and runner.fused is None
    with pytest.raises(RuntimeError, match="self-check"):
        runner_mod.ModelRunner(model, 2, 32, kv_cache="paged", num_blocks=20, block_size=4, decode_attention="kernel")
