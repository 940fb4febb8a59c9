"""Fused LM head + cross-entropy: the PyTorch reference against cookmind's cross_entropy over h @ W^T, the
Triton kernel (CUDA, or Triton's interpreter on CPU) against the reference, torch.compile, and the model's
loss through the fused path against the unfused one."""

from __future__ import annotations

import lm_fixtures
import pytest
import torch
from triton_fixtures import kernel_device, needs_kernel

import cookmind.model.lm as lm_mod
from cookmind.kernels.linear_ce import (
    TRITON_FOUND,
    cross_entropy_rows_reference,
    cross_entropy_rows_triton,
    kernel_available,
    linear_cross_entropy,
)
from cookmind.model import CookMindConfig, CookMindLM
from cookmind.model.cross_entropy import cross_entropy
from cookmind.model.linear import Linear
from cookmind.model.lora import LoRALinear

TINY = {**lm_fixtures.TINY, "vocab_size": 97}  # the ids and shapes below are written for 97


def _case(n=(3, 7), c=16, v=50, dtype=torch.float32, device="cpu", seed=0, scale=3.0):
    """h (*n, C), W (V, C) leaf tensors, targets (*n,) with every third position ignored."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(*n, c, generator=g) * scale).to(device, dtype).requires_grad_()
    w = (torch.randn(v, c, generator=g) / c**0.5).to(device, dtype).requires_grad_()
    y = torch.randint(0, v, n, generator=g)
    y.view(-1)[::3] = -100
    return h, w, y.to(device)


def _unfused(h, w, y, reduction="mean"):
    """The path the fused op replaces, on detached copies: cross_entropy(h @ W^T)."""
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    return cross_entropy(h2 @ w2.t(), y, reduction=reduction), h2, w2


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reference_matches_cross_entropy_over_the_logits(reduction):
    h, w, y = _case()
    loss = linear_cross_entropy(h, w, y, reduction=reduction, impl="reference")
    want, h2, w2 = _unfused(h, w, y, reduction)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    upstream = torch.rand_like(loss) + 0.5  # a different scale per row for "none"
    loss.backward(upstream)
    want.backward(upstream)
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-5, atol=1e-6)
    if reduction == "none":
        assert (loss[y == -100] == 0).all() and (loss[y != -100] > 0).all()


def test_reference_under_cpu_autocast_gives_fp32_grads_to_fp32_weights():
    """As nn.Linear under autocast: bf16 GEMMs, fp32 gradients for the fp32 leaves."""
    h, w, y = _case(n=(4, 16), c=32, v=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, y, impl="reference")
        want, h2, w2 = _unfused(h, w, y)
    loss.backward()
    want.backward()
    assert h.grad.dtype == w.grad.dtype == torch.float32
    torch.testing.assert_close(loss, want, rtol=1e-2, atol=1e-2)
    for got, ref in ((h.grad, h2.grad), (w.grad, w2.grad)):
        assert ((got - ref).norm() / ref.norm()).item() < 2e-2


def test_no_kept_row_gives_zero_loss_and_grads():
    h, w, y = _case()
    y = torch.full_like(y, -100)
    loss = linear_cross_entropy(h, w, y, impl="reference")
    loss.backward()
    assert loss.item() == 0 and (h.grad == 0).all() and (w.grad == 0).all()


def test_nan_upstream_on_an_ignored_row_stays_out_of_the_grads():
    h, w, y = _case()
    loss = linear_cross_entropy(h, w, y, reduction="none", impl="reference")
    upstream = torch.where(y == -100, float("nan"), 1.0)
    loss.backward(upstream)
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(w=torch.zeros(50, 8)), "weight"),
        (dict(y=torch.zeros(3, 6, dtype=torch.long)), "leading shape"),
        (dict(y=torch.zeros(3, 7, dtype=torch.int32)), "int64"),
        (dict(w=torch.zeros(50, 16, dtype=torch.float64)), "cast them to one dtype"),
        (dict(h=torch.zeros(3, 7, 16, dtype=torch.long)), "floating point"),
        (dict(reduction="avg"), "reduction"),
        (dict(impl="cuda"), "impl"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, match):
    h, w, y = _case()
    args = dict(h=h, w=w, y=y, reduction="mean", impl="reference") | change
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(args["h"], args["w"], args["y"], reduction=args["reduction"], impl=args["impl"])


def test_reference_out_of_range_target_raises():
    h, w, y = _case()
    y[0, 1] = 50
    with pytest.raises((RuntimeError, IndexError)):
        linear_cross_entropy(h, w, y, impl="reference")


@pytest.mark.skipif(kernel_available(torch.device("cpu")), reason="the Triton interpreter runs the kernel on CPU")
def test_impl_triton_where_it_cannot_run_raises():
    h, w, y = _case()
    with pytest.raises(RuntimeError, match="impl='triton' needs"):
        linear_cross_entropy(h, w, y, impl="triton")


def test_compiles_without_graph_breaks():
    """fullgraph=True: the custom op's fake gives the compiler its shapes; the backward's GEMMs are traced."""
    h, w, y = _case()
    fn = torch.compile(lambda h, w, y: linear_cross_entropy(h, w, y, impl="reference") * 2.0, fullgraph=True)
    loss = fn(h, w, y)
    loss.backward()
    want, h2, w2 = _unfused(h, w, y)
    (want * 2.0).backward()
    torch.testing.assert_close(loss, want * 2.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-5, atol=1e-6)


def _logits(n, v, dtype, device, seed=0):
    """Peaked rows (scale 4) with targets, a few ignored."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, v, generator=g) * 4).to(device, dtype)
    y = torch.randint(0, v, (n,), generator=g)
    y[::4] = -100
    return z, y.to(device)


def _assert_rows_match(nll, grad, want_nll, want_grad, dtype):
    torch.testing.assert_close(nll, want_nll, rtol=1e-5, atol=1e-4)
    tol = dict(rtol=1.6e-2, atol=1e-5) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad.float(), want_grad.float(), **tol)  # bf16: one rounding step apart at most


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "v,block_m,block_v,programs_per_sm",
    [
        (1000, 1, None, 2),  # one chunk, persistent grid
        (1003, 4, 128, None),  # ragged last chunk, 37 rows in blocks of 4, one program per block
        (1003, 4, 256, 1),  # ragged, persistent: each program takes several row blocks
        (50304, 1, None, 2),  # GPT-2's padded vocabulary with training's defaults
    ],
)
def test_kernel_matches_reference(dtype, v, block_m, block_v, programs_per_sm):
    z, y = _logits(37, v, dtype, kernel_device())
    want_nll, want_grad = cross_entropy_rows_reference(z, y)
    nll = cross_entropy_rows_triton(z, y, block_m=block_m, block_v=block_v, programs_per_sm=programs_per_sm)
    _assert_rows_match(nll, z, want_nll, want_grad, dtype)  # z now holds G
    assert (z[y == -100] == 0).all() and (nll[y == -100] == 0).all()


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
def test_kernel_writes_with_the_row_stride():
    """Logits as a column slice of a wider buffer: G lands in the slice, the rest of each row is untouched."""
    dev = kernel_device()
    z, y = _logits(9, 1003, torch.bfloat16, dev, seed=2)
    buf = torch.full((9, 1003 + 29), 7.0, dtype=torch.bfloat16, device=dev)
    buf[:, :1003] = z
    want_nll, want_grad = cross_entropy_rows_reference(z, y)
    nll = cross_entropy_rows_triton(buf[:, :1003], y, block_m=4, block_v=256)
    _assert_rows_match(nll, buf[:, :1003], want_nll, want_grad, torch.bfloat16)
    assert (buf[:, 1003:] == 7.0).all()


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
def test_kernel_out_of_range_target_gives_nan():
    z, y = _logits(6, 100, torch.float32, kernel_device())
    y[1], y[2] = 100, -3
    nll = cross_entropy_rows_triton(z, y)
    assert nll[1:3].isnan().all() and nll[3:].isfinite().all()


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_kernel_matches_reference(autocast, reduction):
    dev = kernel_device()
    h, w, y = _case(n=(5, 9), c=32, v=1003, device=dev, seed=4)
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy(h, w, y, reduction=reduction, impl="triton")
        want = linear_cross_entropy(h2, w2, y, reduction=reduction, impl="reference")
    upstream = torch.rand_like(loss) + 0.5
    loss.backward(upstream)
    want.backward(upstream)
    tol = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, want, **tol)
    torch.testing.assert_close(h.grad, h2.grad, **tol)
    torch.testing.assert_close(w.grad, w2.grad, **tol)


def test_fused_loss_applies_only_to_a_plain_head_on_cuda():
    head = Linear(16, 50)
    assert not lm_mod.fused_loss_applies(head, torch.device("cpu"))  # the CPU path stays the unfused one
    assert lm_mod.fused_loss_applies(head, torch.device("cuda")) == TRITON_FOUND
    assert not lm_mod.fused_loss_applies(LoRALinear(Linear(16, 50), r=2, alpha=4), torch.device("cuda"))
    assert not lm_mod.fused_loss_applies(Linear(16, 50, bias=True), torch.device("cuda"))


def _loss_and_grads(model, ids, labels):
    model.zero_grad()
    loss = model(ids, labels=labels, return_logits=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
def test_model_fused_loss_equals_unfused_loss(monkeypatch, tied):
    """The forward's wiring (final norm, shifted targets, the head's weight, tied or not), here through the
    reference path on CPU; the CUDA test below runs the kernel."""
    model = CookMindLM(CookMindConfig(**TINY, tie_word_embeddings=tied))
    ids = torch.randint(0, 97, (3, 12))
    labels = ids.clone()
    labels[0, :5] = -100
    loss, grads = _loss_and_grads(model, ids, labels)
    calls = []
    monkeypatch.setattr(lm_mod, "fused_loss_applies", lambda head, device: calls.append(device) or True)
    fused_loss, fused_grads = _loss_and_grads(model, ids, labels)
    assert calls
    torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(fused_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_model_fused_loss_equals_unfused_loss_on_cuda(monkeypatch, compiled):
    """bf16 autocast, fp32 weights, the Triton kernel in the fused path; also inside torch.compile."""
    cfg = CookMindConfig(**{**TINY, "vocab_size": 1003, "hidden_size": 64})
    model = CookMindLM(cfg).cuda()
    ids = torch.randint(0, 1003, (4, 33), device="cuda")
    labels = ids.clone()
    labels[1, :7] = -100
    run = torch.compile(model) if compiled else model
    used = []
    real = lm_mod.linear_cross_entropy
    monkeypatch.setattr(lm_mod, "linear_cross_entropy", lambda *a, **k: used.append(1) or real(*a, **k))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused_loss, fused_grads = _loss_and_grads(run, ids, labels)
        assert used, "the fused path was not taken on CUDA"
        monkeypatch.setattr(lm_mod, "fused_loss_applies", lambda head, device: False)
        loss, grads = _loss_and_grads(run, ids, labels)
    torch.testing.assert_close(fused_loss, loss, rtol=1e-2, atol=1e-2)
    for name, g in grads.items():
        rel = ((fused_grads[name] - g).norm() / g.norm().clamp(min=1e-12)).item()
        assert rel < 3e-2, f"{name}: relative gradient difference {rel:.3g}"


@pytest.mark.gpu
def test_kernel_at_the_gpt2_training_shape():
    """N = 12 * 1024 rows of V = 50304 bf16, the shape the kernel was written for (int64 row offsets, grid)."""
    z, y = _logits(12 * 1024, 50304, torch.bfloat16, "cuda")
    want_nll, want_grad = cross_entropy_rows_reference(z, y)
    nll = cross_entropy_rows_triton(z, y)
    _assert_rows_match(nll, z, want_nll, want_grad, torch.bfloat16)
