"""Optimizers, schedule and clipping against PyTorch's own and hand-computed values."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
from lm_fixtures import tiny_lm
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from triton_fixtures import kernel_device, needs_kernel

from cookmind.optim import SGD, AdamW, CosineWarmupScheduler, clip_grad_norm, cosine_with_warmup, param_groups


def _toy_params():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 5, generator=g, requires_grad=True), torch.randn(5, generator=g, requires_grad=True)]


def _run(opt_cls, params, steps, **kw):
    opt = opt_cls(params, **kw)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(((p - torch.randn(p.shape, generator=g)) ** 2).sum() * 0.5 for p in params)
        loss = loss + sum((p**4).sum() * 0.01 for p in params)  # not quadratic: moments matter
        loss.backward()
        opt.step()
    return params


@pytest.mark.parametrize("mode", ["foreach", "single", "fused"])
def test_adamw_matches_torch_over_1000_steps(mode):
    ours, ref = _toy_params(), [p.detach().clone().requires_grad_() for p in _toy_params()]
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    _run(lambda ps, **k: AdamW(ps, foreach=mode == "foreach", fused=mode == "fused", **k), ours, 1000, **kw)
    _run(torch.optim.AdamW, ref, 1000, **kw)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused_b", [False, True])
def test_adamw_state_dict_resumes_identically(fused_b):
    a = _toy_params()
    opt = AdamW(a, lr=1e-2)
    _run(lambda ps, **k: opt, a, 5)
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = AdamW(b, lr=1e-2, fused=fused_b)
    opt_b.load_state_dict(copy.deepcopy(opt.state_dict()))
    opt_b.param_groups[0]["fused"] = fused_b  # load_state_dict restores the saved flags; switch path here
    _run(lambda ps, **k: opt, a, 3)
    _run(lambda ps, **k: opt_b, b, 3)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0 if not fused_b else 1e-6, atol=0 if not fused_b else 1e-7)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_with_decay_matches_torch(momentum):
    ours, ref = _toy_params(), [p.detach().clone().requires_grad_() for p in _toy_params()]
    _run(SGD, ours, 200, lr=1e-2, momentum=momentum, weight_decay=0.05)
    _run(torch.optim.SGD, ref, 200, lr=1e-2, momentum=momentum, weight_decay=0.05)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_param_groups_decay_matrices_only_hand_listed():
    matrices = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ]
    vectors = [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight",
    ]
    for tied in (True, False):
        model = tiny_lm(num_hidden_layers=1, qk_norm=True, attention_bias=True, tie_word_embeddings=tied)
        model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)  # frozen: in neither group
        decay, no_decay = param_groups(model, weight_decay=0.1)
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        names = {id(p): n for n, p in model.named_parameters()}
        want_decay = [n for n in matrices if n != "model.layers.0.mlp.up_proj.weight"]
        want_decay += [] if tied else ["lm_head.weight"]  # tied: the embedding's tensor, listed once
        assert [names[id(p)] for p in decay["params"]] == want_decay
        assert [names[id(p)] for p in no_decay["params"]] == vectors


def test_param_groups_leave_out_an_empty_group():
    net = nn.Linear(3, 2, bias=False)
    assert [g["weight_decay"] for g in param_groups(net, 0.1)] == [0.1]


def test_cosine_schedule_hand_computed():
    f = lambda s: cosine_with_warmup(s, max_lr=1.0, warmup_steps=4, total_steps=14, min_lr=0.1)  # noqa: E731
    assert [f(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f(4) == pytest.approx(1.0)  # cosine starts at the peak
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert f(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))
    assert f(14) == pytest.approx(0.1) and f(1000) == pytest.approx(0.1)


def test_cosine_scheduler_drives_optimizer_and_resumes():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = CosineWarmupScheduler(opt, warmup_steps=4, total_steps=14, min_lr_ratio=0.05)
    seen = []
    for _ in range(16):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expect = [cosine_with_warmup(s, 2.0, 4, 14, 0.1) for s in range(16)]
    assert seen == pytest.approx(expect)
    opt2 = torch.optim.SGD([p], lr=2.0)
    sched2 = CosineWarmupScheduler(opt2, warmup_steps=4, total_steps=14, min_lr_ratio=0.05)
    sched2.load_state_dict(sched.state_dict())
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())


def test_clip_grad_norm_matches_torch():
    g = torch.Generator().manual_seed(3)
    a = [torch.randn(4, 3, generator=g, requires_grad=True) for _ in range(3)]
    b = [p.detach().clone().requires_grad_() for p in a]
    for max_norm in (0.5, 1e3):
        for x, y in zip(a, b):
            x.grad = torch.randn(x.shape, generator=g) * 3
            y.grad = x.grad.clone()
        ours = clip_grad_norm(a, max_norm)
        ref = torch.nn.utils.clip_grad_norm_(b, max_norm)
        torch.testing.assert_close(ours, ref)
        for x, y in zip(a, b):
            torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("fused", [False, True])
def test_adamw_found_inf_skips_the_step_entirely(fused):
    # a step flagged found_inf=1 must be a no-op (params, moments and step count), so the run continues
    # exactly as if that step never happened: compare against a run that simply omits it
    torch.manual_seed(0)
    w0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(3)]
    a, b = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    opt_a, opt_b = AdamW([a], lr=1e-2, fused=fused), AdamW([b], lr=1e-2, fused=fused)
    for i, g in enumerate(grads):
        a.grad = g.clone()
        opt_a.step(found_inf=torch.tensor(1.0 if i == 1 else 0.0))
        if i != 1:
            b.grad = g.clone()
            opt_b.step()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    sa, sb = opt_a.state[a], opt_b.state[b]
    assert float(sa["step"]) == float(sb["step"]) == 2
    torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["foreach", "single", "fused"])
@pytest.mark.parametrize("max_norm", [0.05, 1e6])  # clipping every step; never clipping
def test_adamw_grad_divisor_is_torch_clipping_then_adamw(mode, max_norm):
    """step(grad_divisor=clip_divisor(||g||, max_norm)) == torch's clip_grad_norm_ then torch's AdamW."""
    from cookmind.optim import clip_divisor, global_grad_norm

    ours, ref = _toy_params(), [p.detach().clone().requires_grad_() for p in _toy_params()]
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = AdamW(ours, foreach=mode == "foreach", fused=mode == "fused", **kw)
    opt_ref = torch.optim.AdamW(ref, **kw)
    g = torch.Generator().manual_seed(2)
    for _ in range(50):
        targets = [torch.randn(p.shape, generator=g) for p in ours]
        for params, o in ((ours, opt), (ref, opt_ref)):
            o.zero_grad()
            sum(((p - t) ** 2).sum() * 0.5 + (p**4).sum() * 0.01 for p, t in zip(params, targets)).backward()
        total = global_grad_norm(ours)
        torch.testing.assert_close(total, torch.nn.utils.get_total_norm([p.grad for p in ref]))
        opt.step(grad_divisor=clip_divisor(total, max_norm))
        torch.nn.utils.clip_grad_norm_(ref, max_norm)
        opt_ref.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)  # the clipped gradients are left behind


class _DTensorOps(TorchDispatchMode):
    """Counts the aten ops that reach the dispatcher with a DTensor among their arguments."""

    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        self.ops += any(issubclass(t, DTensor) for t in types)
        return func(*args, **(kwargs or {}))


def _sharded_step(rank: int) -> dict:
    """On 2 gloo ranks: AdamW (each path) and the gradient norm over DTensor parameters sharded on dim 0 (FSDP2's
    layout, uneven sizes included), against the same on the full tensors; and how many ops DTensor dispatched."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from cookmind.optim import global_grad_norm

    mesh = init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(7)
    shapes = [(6, 4), (5, 3), (7,)]  # 5 and 7 rows split unevenly over the ranks
    fulls = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    out = {}
    for path in ("fused", "foreach", "single"):
        kw = {"fused": path == "fused", "foreach": path == "foreach"}
        plain = [nn.Parameter(t.clone()) for t in fulls]
        sharded = [nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)])) for t in fulls]
        opt_p = AdamW(plain, lr=0.1, weight_decay=0.1, **kw)
        opt_s = AdamW(sharded, lr=0.1, weight_decay=0.1, **kw)
        counter = _DTensorOps()
        for i, step_grads in enumerate(grads):
            for p, s, gr in zip(plain, sharded, step_grads):
                p.grad = gr.clone()
                s.grad = distribute_tensor(gr.clone(), mesh, [Shard(0)])
            norm_p = global_grad_norm(plain)
            with counter if i else contextlib.nullcontext():  # the first step makes the moments: DTensors too
                norm_s = global_grad_norm(sharded)
                opt_s.step(grad_divisor=torch.tensor(2.0))
            opt_p.step(grad_divisor=torch.tensor(2.0))
        out[path] = {
            "max_diff": max((s.full_tensor() - p).abs().max().item() for p, s in zip(plain, sharded)),
            "norm": (norm_p.item(), norm_s.item()),
            "dispatched": counter.ops,
            "moved": max((p - f).abs().max().item() for p, f in zip(plain, fulls)),
        }
    return out


def test_adamw_and_the_grad_norm_on_fsdp_shards_equal_the_full_tensors_without_dtensor_dispatch(tmp_path):
    from gloo_fixtures import run_on_gloo_ranks

    for rank_out in run_on_gloo_ranks(_sharded_step, 2, tmp_path):
        for path, r in rank_out.items():
            assert r["moved"] > 1e-3, path  # the update did something
            assert r["max_diff"] < 1e-6, (path, r)
            assert r["norm"][1] == pytest.approx(r["norm"][0], rel=1e-6), (path, r)
            assert r["dispatched"] == 0, (path, r)  # every op ran on the local shards


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("divisor", [None, 1.0, 4.0])
def test_the_triton_adamw_kernel_equals_torch_clipping_then_adamw(divisor):
    """cookmind/kernels/adamw.py over tensors of uneven sizes (a last partial block) for 30 steps, a skipped step
    (found_inf) among them: torch's clip (divide) then torch.optim.AdamW gives the same parameters and moments; a
    divisor of 4 leaves the divided gradients behind, a divisor of 1 or none leaves them untouched."""
    from cookmind.kernels.adamw import adamw_triton_

    dev = kernel_device()
    g = torch.Generator().manual_seed(3)
    shapes = [(37, 5), (300,), (3,)]
    start = [torch.randn(s, generator=g) for s in shapes]
    mine = [t.clone().to(dev) for t in start]
    ref = [t.clone().requires_grad_(True) for t in start]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, foreach=False)
    ms, vs = [torch.zeros_like(t) for t in mine], [torch.zeros_like(t) for t in mine]
    steps = [torch.zeros((), device=dev) for _ in mine]
    lr = torch.tensor(1e-2, device=dev)
    for i in range(30):
        grads = [torch.randn(s, generator=g) for s in shapes]
        skip = i == 7
        found_inf = torch.tensor(float(skip), device=dev)
        ours = [x.clone().to(dev) for x in grads]
        torch._foreach_add_(steps, 1)
        adamw_triton_(
            mine, ours, ms, vs, steps, lr=lr, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, block=64,
            grad_scale=None if divisor is None else torch.tensor(divisor, device=dev), found_inf=found_inf,
        )  # fmt: skip
        torch._foreach_sub_(steps, [found_inf] * len(steps))
        if skip:
            for x, y in zip(ours, grads):
                torch.testing.assert_close(x.cpu(), y, rtol=0, atol=0)  # a skipped step touches nothing
            continue
        for r, x in zip(ref, grads):
            r.grad = x / (divisor or 1.0)
        opt.step()
        for x, r in zip(ours, ref):  # what the kernel left behind: divided where the divisor is not 1
            torch.testing.assert_close(x.cpu(), r.grad, rtol=0 if divisor != 4.0 else 1e-6, atol=0)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a.cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(ms, ref):
        torch.testing.assert_close(a.cpu(), opt.state[b]["exp_avg"], rtol=1e-5, atol=1e-7)
    assert float(steps[0]) == 29


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; run on the device machine")
def test_adamw_fused_on_cuda_runs_the_triton_kernel_and_equals_torchs_fused_kernel(monkeypatch):
    """On CUDA, AdamW(fused=True) goes through our Triton kernel (FUSED_KERNEL "triton") and, with clipping
    divisors and a skipped step, ends where the same steps through torch._fused_adamw_ (FUSED_KERNEL "torch") end."""
    from cookmind.kernels import adamw as kernel_module
    from cookmind.optim import adamw as adamw_module

    monkeypatch.setattr(adamw_module, "TRITON_MIN_ELEMENTS", 0)  # the tiny model's group takes the kernel too
    calls = []
    real = kernel_module.adamw_triton_
    monkeypatch.setattr(kernel_module, "adamw_triton_", lambda *a, **k: calls.append(1) or real(*a, **k))
    finals = {}
    for impl in ("triton", "torch"):
        monkeypatch.setattr(adamw_module, "FUSED_KERNEL", impl)
        torch.manual_seed(0)
        model = tiny_lm().cuda()
        opt = AdamW(param_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95), fused=True)
        for i in range(20):
            opt.zero_grad(set_to_none=True)
            ids = torch.randint(0, 64, (2, 16), device="cuda")
            model(ids, labels=ids).loss.backward()
            opt.step(
                found_inf=torch.tensor(float(i == 5), device="cuda"),
                grad_divisor=torch.tensor(1.0 if i % 2 else 3.0, device="cuda"),
            )
        finals[impl] = [p.detach().clone() for p in model.parameters()]
    assert calls, "the Triton kernel never ran"
    for a, b in zip(finals["triton"], finals["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_triton_adamw_path_is_taken_only_where_it_can_run_and_pays(monkeypatch):
    """use_triton_kernel: a group of at least TRITON_MIN_ELEMENTS contiguous float32 tensors where the kernel runs;
    a smaller group (a small model: torch's one launch group), a bf16 parameter, a non-contiguous tensor, a device
    without the kernel or FUSED_KERNEL "torch" keep torch._fused_adamw_. Master weights' groups (bf16 outs) take
    the kernel at any size, while their outs are contiguous."""
    from cookmind.kernels import adamw as kernel_module
    from cookmind.optim import adamw as adamw_module

    monkeypatch.setattr(kernel_module, "available", lambda device: True)
    monkeypatch.setattr(adamw_module, "TRITON_MIN_ELEMENTS", 100)

    def group(*tensors):
        return (list(tensors), list(tensors), list(tensors), list(tensors))

    big, small = torch.zeros(10, 10), torch.zeros(99)
    assert adamw_module.use_triton_kernel(group(big))
    assert not adamw_module.use_triton_kernel(group(small))
    assert adamw_module.use_triton_kernel(group(small), outs=[small.bfloat16()])  # master weights: any size
    assert not adamw_module.use_triton_kernel(group(small), outs=[torch.zeros(99, 2).t().bfloat16()])
    assert not adamw_module.use_triton_kernel(group(big.bfloat16()))
    assert not adamw_module.use_triton_kernel(group(torch.zeros(10, 20).t()))
    monkeypatch.setattr(adamw_module, "FUSED_KERNEL", "torch")
    assert not adamw_module.use_triton_kernel(group(big))
    monkeypatch.setattr(adamw_module, "FUSED_KERNEL", "triton")
    monkeypatch.setattr(kernel_module, "available", lambda device: False)
    assert not adamw_module.use_triton_kernel(group(big))
