"""train.master_weights: bf16 parameters, fp32 masters in AdamW, fp32 gradient accumulation; checked against torch's
AdamW on fp32 copies, hand-computed sums, the autocast run, an uninterrupted run and two gloo ranks."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from lm_fixtures import TINY, tiny_lm
from test_train_resume import StopAt
from torch import nn
from triton_fixtures import kernel_device, needs_kernel

from cookmind.model import load_model, save_model
from cookmind.optim import AdamW, clip_divisor, global_grad_norm, param_groups
from cookmind.optim.master_weights import accumulate_grads_in_fp32, grad_of, to_bf16_with_masters
from cookmind.store import write_store
from cookmind.train import TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread", "keep_threads")

BF16 = torch.bfloat16


# -- the optimizer ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["foreach", "single", "fused"])
def test_adamw_over_masters_equals_torch_adamw_on_fp32_copies_and_writes_the_rounded_masters(mode):
    """20 steps of bf16 gradients (clipping divisors, one skipped step): the masters end where torch.optim.AdamW
    on fp32 copies of the starting weights, fed the same gradients in fp32, ends; the model's parameters are the
    masters rounded to bf16, bit for bit; the moments are fp32."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 5), nn.LayerNorm(5))
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    masters = to_bf16_with_masters(model)
    assert all(p.dtype == BF16 for p in model.parameters())
    assert [m.dtype for m in masters.values()] == [torch.float32] * 4
    assert all(torch.equal(m, r) for m, r in zip(masters.values(), ref))  # the masters are the fp32 start
    groups = [{**g, "params": [masters[p] for p in g["params"]]} for g in param_groups(model, 0.1)]
    kw = dict(lr=3e-2, betas=(0.9, 0.95), eps=1e-8)
    model_params = {m: p for p, m in masters.items()}
    opt = AdamW(groups, foreach=mode == "foreach", fused=mode == "fused", model_params=model_params, **kw)
    ref_groups = [{"params": ref[0:1], "weight_decay": 0.1}, {"params": ref[1:], "weight_decay": 0.0}]
    opt_ref = torch.optim.AdamW(ref_groups, foreach=False, **kw)
    g = torch.Generator().manual_seed(1)
    for i in range(20):
        grads = [torch.randn(p.shape, generator=g).to(BF16) for p in model.parameters()]
        for p, x in zip(model.parameters(), grads):
            p.grad = x.clone()
        divisor = torch.tensor(3.0 if i % 3 == 0 else 1.0)
        skip = i == 4
        opt.step(found_inf=torch.tensor(float(skip)) if mode == "fused" or skip else None, grad_divisor=divisor)
        opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
        if skip:
            continue
        for r, x in zip(ref, grads):
            r.grad = x.float() / divisor
        opt_ref.step()
    for p, r in zip(model.parameters(), ref):
        m = masters[p]
        torch.testing.assert_close(m, r.detach(), rtol=1e-5, atol=1e-6)
        assert torch.equal(p.detach(), m.to(BF16))
        assert opt.state[m]["exp_avg"].dtype == torch.float32
    assert float(opt.state[next(iter(model_params))]["step"]) == 19


def test_masters_of_a_model_in_mixed_dtypes_start_from_its_values():
    """fp32 parameters hand their own tensor over as the master (no copy) and become bf16; a bf16 one (a model loaded
    in bf16) gets an fp32 copy of itself; a frozen one becomes bf16 without a master; buffers keep their dtype."""
    lin, gain = nn.Linear(3, 2), nn.Parameter(torch.tensor([1.5, -2.25], dtype=BF16))
    frozen = nn.Parameter(torch.tensor([0.1, 0.2]), requires_grad=False)
    model = nn.Module()
    model.lin, model.gain, model.frozen = lin, gain, frozen
    model.register_buffer("table", torch.tensor([0.3]))
    fp32_storage = lin.weight.data_ptr()
    masters = to_bf16_with_masters(model)
    assert [id(p) for p in masters] == [id(gain), id(lin.weight), id(lin.bias)]  # model order
    assert masters[lin.weight].data_ptr() == fp32_storage and masters[lin.weight].dtype == torch.float32
    assert torch.equal(masters[gain], torch.tensor([1.5, -2.25])) and gain.dtype == BF16
    assert frozen.dtype == BF16 and model.table.dtype == torch.float32
    assert all(p.dtype == BF16 for p in model.parameters())


def test_fp32_accumulation_adds_bf16_gradients_in_fp32_hand_computed():
    """Gradients 1 and 2^-9 of two micro-batches: their bf16 sum rounds to 1 (bf16 keeps 8 bits), the fp32 buffer
    holds 1 + 2^-9 exactly; .grad is dropped; the norm and the optimizer read the buffer; zero_grad clears it."""
    p = nn.Parameter(torch.ones(4))
    masters = to_bf16_with_masters(nn.ParameterList([p]))
    hooks = accumulate_grads_in_fp32([p])
    for scale in (1.0, 2.0**-9):
        (p * scale).sum().backward()
        assert p.grad is None
    want = torch.full((4,), 1 + 2.0**-9)
    assert grad_of(p).dtype == torch.float32 and torch.equal(grad_of(p), want)
    assert (torch.ones(4, dtype=BF16) + 2.0**-9).float().eq(1.0).all()  # what bf16 accumulation would have kept
    assert global_grad_norm([p]).item() == pytest.approx(2 * (1 + 2.0**-9), rel=1e-7)  # sqrt(4) (1 + 2^-9)
    master = masters[p]
    ref = master.clone().requires_grad_()
    opt = AdamW([master], lr=0.1, weight_decay=0.0, model_params={master: p})
    opt.step()
    ref.grad = want.clone()
    torch.optim.AdamW([ref], lr=0.1, weight_decay=0.0).step()
    torch.testing.assert_close(master, ref.detach(), rtol=0, atol=0)
    opt.zero_grad()
    assert grad_of(p) is None
    for h in hooks:
        h.remove()


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
def test_the_triton_adamw_kernel_writes_the_rounded_master_into_the_bf16_parameter():
    """adamw_triton_ with outs, bf16 gradients, a clipping divisor and a skipped step: the masters and moments equal
    the same kernel's without outs on fp32 copies of the gradients, and each out is its master rounded to bf16."""
    from cookmind.kernels.adamw import adamw_triton_

    dev = kernel_device()
    g = torch.Generator().manual_seed(3)
    shapes = [(37, 5), (300,)]
    start = [torch.randn(s, generator=g).to(dev) for s in shapes]
    runs = {}
    for with_out in (True, False):
        ps = [t.clone() for t in start]
        outs = [t.to(BF16) for t in start]
        ms, vs = [torch.zeros_like(t) for t in ps], [torch.zeros_like(t) for t in ps]
        steps = [torch.zeros((), device=dev) for _ in ps]
        gen = torch.Generator().manual_seed(4)
        for i in range(6):
            grads = [torch.randn(s, generator=gen).to(BF16).to(dev) for s in shapes]
            if not with_out:
                grads = [x.float() for x in grads]
            found_inf = torch.tensor(float(i == 2), device=dev)
            torch._foreach_add_(steps, 1)
            adamw_triton_(
                ps, grads, ms, vs, steps, lr=torch.tensor(1e-2, device=dev), beta1=0.9, beta2=0.95,
                weight_decay=0.1, eps=1e-8, grad_scale=torch.tensor(2.0, device=dev), found_inf=found_inf,
                outs=outs if with_out else None, block=64,
            )  # fmt: skip
            torch._foreach_sub_(steps, [found_inf] * len(steps))
        runs[with_out] = (ps, ms, vs, outs)
    for a, b in zip(runs[True][:3], runs[False][:3]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    for p, out, s in zip(runs[True][0], runs[True][3], start):
        assert not torch.equal(p, s)
        if dev == "cuda":  # a GPU rounds to nearest even, as torch does
            assert torch.equal(out, p.to(BF16))
        else:  # Triton's interpreter truncates its fp32 -> bf16 casts: within one bf16 step of the master
            assert torch.all((out.float() - p).abs() <= p.abs() * 2.0**-7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; run on the device machine")
def test_adamw_master_weights_on_cuda_triton_path_equals_the_foreach_path(monkeypatch):
    """On CUDA the fused master-weight step goes through the Triton kernel (with its bf16 output): over the tiny
    model's parameter shapes, 10 steps of the same bf16 gradients (clipping divisors, one skipped step) end with the
    foreach path's masters, and each parameter is its master rounded to bf16 (the GPU rounds to nearest even)."""
    from cookmind.kernels import adamw as kernel_module

    calls = []  # the tiny model is far below TRITON_MIN_ELEMENTS: master weights take the kernel at any size
    real = kernel_module.adamw_triton_
    monkeypatch.setattr(kernel_module, "adamw_triton_", lambda *a, **k: calls.append(k["outs"]) or real(*a, **k))
    finals = {}
    for fused in (True, False):
        torch.manual_seed(0)
        model = tiny_lm().cuda()
        masters = to_bf16_with_masters(model)
        groups = [{**g, "params": [masters[p] for p in g["params"]]} for g in param_groups(model, 0.1)]
        opt = AdamW(groups, lr=3e-3, fused=fused, model_params={m: p for p, m in masters.items()})
        g = torch.Generator(device="cuda").manual_seed(1)
        for i in range(10):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g, device="cuda").to(BF16)
            divisor = clip_divisor(global_grad_norm(list(model.parameters())), 0.5 if i % 2 else 1e6)
            if fused:  # the skip decided on the device
                opt.step(found_inf=torch.tensor(float(i == 3), device="cuda"), grad_divisor=divisor)
            elif i != 3:
                opt.step(grad_divisor=divisor)
            opt.zero_grad()
        finals[fused] = [masters[p].clone() for p in model.parameters()]
        for p in model.parameters():
            assert torch.equal(p.detach(), masters[p].to(BF16))
    assert calls and all(outs is not None for outs in calls), "the Triton kernel never wrote the bf16 parameters"
    for a, b in zip(finals[True], finals[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# -- the trainer ---------------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    """A learnable pretraining store (repeated counting patterns, so the loss falls) and an init checkpoint."""
    rng = np.random.default_rng(0)
    steps, starts = rng.integers(1, 4, 16), rng.integers(1, 60, 16)
    seqs = [{"sequence": (np.arange(48) * int(k) + int(s)) % 63 + 1} for k, s in zip(steps, starts)]
    write_store(tmp_path / "seq", "seq", seqs, vocab_size=64)
    dpo = []
    for _ in range(16):
        mask = np.zeros(12, np.int64)
        mask[6:] = 1
        dpo.append({"chosen": rng.integers(1, 64, 12), "rejected": rng.integers(1, 64, 12), "chosen_mask": mask,
                    "rejected_mask": mask})  # fmt: skip
    write_store(tmp_path / "dpo", "dpo", dpo, vocab_size=64)
    torch.manual_seed(123)
    save_model(tmp_path / "init", tiny_lm())
    return tmp_path


def _cfg(root, name, master=True, objective="pretrain", resume=None, **train):
    d = {
        "model": dict(TINY),
        "data": {"window_size": 16, "train_path": str(root / "seq")},
        "train": {"max_steps": 12, "micro_batch_size": 4, "seed": 7, "precision": "bf16", "master_weights": master}
        | {"device": "cpu", **train},
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "checkpoint": {"every": 2, "keep_last": 2, "resume": resume},
        "logging": {"run_dir": str(root / name), "progress": False, "report": False, "log_every": 1},
    }
    if objective != "pretrain":
        d["model"] = {}
        d["train"].update(objective="dpo", init_from=str(root / "init"))
        d["data"]["train_path"] = str(root / "dpo")
        if objective == "dpo-lora":
            d["lora"] = {"enabled": True, "r": 4, "alpha": 8}
    return TrainConfig.from_dict(d)


def _losses(root, name):
    rows = [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("split") == "train"]


def _device_side(trainer):
    """Put a CPU trainer on the CUDA path: fused AdamW deciding the skip and clipping on the device."""
    for g in trainer.optimizer.param_groups:
        g["fused"] = True
    trainer._skip_on_device = True
    return trainer


@pytest.mark.parametrize("device_side", [False, True])
def test_a_master_weight_run_tracks_the_autocast_run_and_saves_fp32_masters(store, device_side):
    """12 steps with gradient accumulation 2 (fp32 buffers): each step's loss within 2% of the bf16-autocast run
    over fp32 weights (bf16 weights and residual stream round differently; measured <= 0.45%), the loss falls; the
    model is bf16, the checkpoint's model.safetensors holds the fp32 masters, which round to the live weights."""
    auto = Trainer(_cfg(store, "auto", master=False, grad_accum_steps=2, micro_batch_size=2))
    auto.fit()
    mw = Trainer(_cfg(store, "mw", grad_accum_steps=2, micro_batch_size=2))
    if device_side:
        _device_side(mw)
    mw.fit()
    a, b = _losses(store, "auto"), _losses(store, "mw")
    assert len(a) == len(b) == 12 and b[-1] < b[0] - 0.3
    for x, y in zip(a, b):
        assert y == pytest.approx(x, rel=0.02)
    assert {p.dtype for p in mw.bare_model.parameters()} == {BF16}
    assert {s["exp_avg"].dtype for s in mw.optimizer.state.values()} == {torch.float32}
    saved = load_model(store / "mw" / "checkpoints" / "step_00000012").state_dict()
    live = mw.bare_model.state_dict()
    masters = {id(p): m for m, p in mw.optimizer.model_params.items()}
    for name, p in mw.bare_model.named_parameters():
        assert saved[name].dtype == torch.float32 and torch.equal(saved[name], masters[id(p)]), name
        assert torch.equal(saved[name].to(BF16), live[name]), name


def test_accumulating_two_micro_batches_equals_one_micro_batch_of_both(store):
    """Gradient accumulation 2 x 2 sequences (fp32 buffers) ends within bf16 rounding of 1 x 4 sequences (the same
    sequences each step: the sampler deals them in the same order)."""
    one = Trainer(_cfg(store, "one", max_steps=6))
    one.fit()
    two = Trainer(_cfg(store, "two", max_steps=6, grad_accum_steps=2, micro_batch_size=2))
    two.fit()
    a, b = _losses(store, "one"), _losses(store, "two")
    for x, y in zip(a, b):
        assert y == pytest.approx(x, rel=5e-3)
    ma, mb, m0 = _masters(one), _masters(two), _masters(Trainer(_cfg(store, "start", max_steps=6)))
    assert max((ma[k] - m0[k]).abs().max().item() for k in ma) > 1e-2  # training moved the weights
    _assert_close_but_a_few(ma, mb)


def _assert_close_but_a_few(a: dict, b: dict, atol: float = 2e-3, share: float = 0.01) -> None:
    """All but ``share`` of the elements within ``atol``: where an element's gradient is about 0, a change of bf16
    rounding can flip the sign of its Adam update (m / sqrt(v) is about +-1 whatever the gradient's size), so a few
    elements move by up to 2 lr a step apart (seen: 3 of 2048 in one matrix)."""
    far = sum(int(((a[k] - b[k]).abs() > atol).sum()) for k in a)
    total = sum(a[k].numel() for k in a)
    assert far <= share * total, f"{far} of {total} elements differ by more than {atol}"


def _masters(trainer) -> dict[str, torch.Tensor]:
    """The trainer's fp32 masters by parameter name."""
    by_param = {id(p): m for m, p in trainer.optimizer.model_params.items()}
    return {n: by_param[id(p)] for n, p in trainer.bare_model.named_parameters()}


@pytest.mark.parametrize("case", ["pretrain-accum", "pretrain-device-side", "dpo-lora"])
def test_interrupt_and_resume_with_master_weights_is_bit_identical(store, case):
    """Stopped at step 3 (checkpoints every 2) and resumed: the same bf16 weights and fp32 masters as one run."""
    kw = {"pretrain-accum": dict(grad_accum_steps=2, micro_batch_size=2), "pretrain-device-side": {}}.get(case, {})
    objective = "dpo-lora" if case == "dpo-lora" else "pretrain"
    prep = _device_side if case == "pretrain-device-side" else (lambda t: t)
    full = prep(Trainer(_cfg(store, "full", objective=objective, max_steps=6, **kw)))
    full.fit()
    prep(Trainer(_cfg(store, "cut", objective=objective, max_steps=6, **kw), callbacks=[StopAt(3)])).fit()
    resumed = prep(Trainer(_cfg(store, "cut", objective=objective, max_steps=6, resume="auto", **kw)))
    assert resumed.step == 3
    resumed.fit()
    a, b = full.bare_model.state_dict(), resumed.bare_model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{case}: {k} differs after resume"
    for (ma, pa), mb in zip(full.optimizer.model_params.items(), resumed.optimizer.model_params):
        assert torch.equal(ma, mb) and pa.dtype == BF16
    if case == "dpo-lora":  # masters for the adapters only; the frozen base is bf16 without one
        assert all("lora_" in n for n, p in full.bare_model.named_parameters() if p.requires_grad)
        assert len(full.optimizer.model_params) == sum(p.requires_grad for p in full.bare_model.parameters())
        assert {p.dtype for p in full.bare_model.parameters()} == {BF16}


def test_samples_come_from_the_bf16_model(store):
    """Greedy generation from the trained bf16 model equals generation from its checkpoint loaded in bf16 (the
    fp32 masters rounded): the engine runs the bf16 model as it runs any bf16 model."""
    from cookmind.infer import SamplingParams, generate

    t = Trainer(_cfg(store, "gen", max_steps=4))
    t.fit()
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    ours = generate(t.bare_model.eval(), prompts, params, engine="builtin")
    loaded = load_model(store / "gen" / "checkpoints" / "step_00000004", dtype=BF16).eval()
    assert ours == generate(loaded, prompts, params, engine="builtin")
    assert all(len(o) == 8 for o in ours)


# -- what it refuses -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, names",
    [
        (["train.precision=fp32"], "train.precision"),
        (["train.precision=fp16"], "train.precision"),
        (["parallel.fsdp=true"], "parallel.fsdp"),
        (["parallel.zero1=true"], "parallel.zero1"),
        (["optim.impl=torch"], "optim.impl"),
        (["checkpoint.format=sharded"], "checkpoint.format"),
    ],
)
def test_master_weights_refuses_what_it_cannot_go_with_in_one_line(overrides, names):
    with pytest.raises(ValueError) as err:
        TrainConfig.load(None, ["train.precision=bf16", "train.master_weights=true", *overrides])
    msg = str(err.value)
    assert "\n" not in msg and "train.master_weights" in msg and names in msg


# -- train.master_weights=auto (the GPU presets) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.precision=fp32"],
        ["parallel.fsdp=true"],
        ["parallel.zero1=true"],
        ["optim.impl=torch"],
        ["checkpoint.format=sharded", "parallel.fsdp=true"],
    ],
)
def test_auto_is_off_without_an_error_where_true_is_refused(overrides):
    from cookmind.train.config import uses_master_weights

    cfg = TrainConfig.load(None, ["train.precision=bf16", "train.master_weights=auto", *overrides])  # no error
    assert not uses_master_weights(cfg, torch.device("cuda"))


def test_auto_is_on_on_a_cuda_device_in_bf16_and_off_on_the_cpu():
    from cookmind.train.config import uses_master_weights

    cfg = TrainConfig.load(None, ["train.precision=bf16", "train.master_weights=auto"])
    assert uses_master_weights(cfg, torch.device("cuda"))
    assert not uses_master_weights(cfg, torch.device("cpu"))
    for value, on in (("true", True), ("false", False), (True, True), (False, False)):  # YAML's bools too
        cfg = TrainConfig.from_dict({"train": {"precision": "bf16", "master_weights": value}})
        assert cfg.train.master_weights == str(value).lower()
        assert uses_master_weights(cfg, torch.device("cpu")) is on


def test_a_master_weights_value_other_than_false_true_auto_is_refused_naming_them():
    with pytest.raises(ValueError) as err:
        TrainConfig.load(None, ["train.precision=bf16", "train.master_weights=yes-please"])
    msg = str(err.value)
    assert "train.master_weights" in msg and "auto" in msg and "\n" not in msg


@pytest.mark.parametrize("preset", ["qwen3-0.6b", "llama-1.3b"])
def test_the_gpu_presets_take_master_weights_where_they_can(preset):
    from cookmind.train.config import uses_master_weights

    cfg = TrainConfig.load(preset)
    assert uses_master_weights(cfg, torch.device("cuda"))
    fsdp = TrainConfig.load(preset, ["parallel.fsdp=true"])  # a preset run under FSDP2 starts, without them
    assert not uses_master_weights(fsdp, torch.device("cuda"))


@pytest.mark.parametrize("mode, on", [("auto", False), ("true", True)])
def test_on_the_cpu_auto_trains_fp32_parameters_and_the_summary_says_what_ran(store, mode, on):
    t = Trainer(_cfg(store, f"{mode}-cpu", master=mode, max_steps=1))
    summary = t.fit()
    want = torch.bfloat16 if on else torch.float32
    assert all(p.dtype == want for p in t.bare_model.parameters())
    assert summary["master_weights"] is on and summary["cuda_graph"] is False  # no graph off CUDA


def _ddp_on_rank(rank: int, root: str) -> dict:
    """On each of two gloo ranks, under torch's DDP and under ours: a master-weight run of 2 sequences a rank (bf16
    all-reduces; checkpoints at steps 2 and 4), and one of 2 micro-batches of 1 (the fp32 buffers averaged)."""
    from pathlib import Path

    from cookmind.optim import master_weights

    out, reduced = {}, []
    average = master_weights.all_reduce_fp32_grads
    master_weights.all_reduce_fp32_grads = lambda params, group=None: (reduced.append(1), average(params, group))
    for kind in ("torch", "ours"):
        for accum in (1, 2):
            cfg = _cfg(Path(root), f"ddp-{kind}-{accum}", max_steps=4, micro_batch_size=2 // accum)
            cfg.train.grad_accum_steps = accum
            cfg.parallel.ddp = kind
            t = Trainer(cfg)
            t.fit()
            out[f"{kind}-{accum}"] = _masters(t)
            t.close()
    out["reduced"] = len(reduced)
    return out


def test_two_gloo_ranks_with_master_weights_equal_one_process_with_and_without_accumulation(store, tmp_path):
    """Under both DDPs, two ranks of 2 sequences a step against one process of the same 4:
    - without accumulation DDP all-reduces the bf16 gradients: within bf16 rounding of one micro-batch of 4,
      checkpoints between steps included (they swap the masters in without touching the parameters DDP hooks);
    - with 2 micro-batches of 1 a rank the fp32 buffers (which DDP's all-reduce of ``.grad`` would miss: they empty
      it after each micro-batch) are averaged once a step: one process accumulating 4 micro-batches of 1, to the
      last bit but for a rare element. fp32 sums of a few bf16 gradients are exact in any order only while their
      exponents lie within fp32's extra 16 bits of each other; on a machine with AMX-BF16 (this project's, since
      session 22) one element of 2048 in the embedding ends 4.7e-10 apart (one fp32 step). A buffer averaged
      twice, or not at all, would move every trained element by orders of magnitude more."""
    from gloo_fixtures import run_on_gloo_ranks

    ranks = run_on_gloo_ranks(functools.partial(_ddp_on_rank, root=str(store)), 2, tmp_path)
    one = Trainer(_cfg(store, "one", max_steps=4))
    one.fit()
    ours, start = _masters(one), _masters(Trainer(_cfg(store, "start", max_steps=4)))
    assert max((ours[k] - start[k]).abs().max().item() for k in ours) > 1e-2  # training moved the weights
    four = Trainer(_cfg(store, "four", max_steps=4, micro_batch_size=1, grad_accum_steps=4))
    four.fit()
    accumulated = _masters(four)
    for run in ("torch-1", "ours-1", "torch-2", "ours-2"):
        for k, a in ranks[0][run].items():
            assert torch.equal(a, ranks[1][run][k]), (run, k)
    for kind in ("torch", "ours"):
        _assert_close_but_a_few(ranks[0][f"{kind}-1"], ours)
        differ = 0
        for k, a in ranks[0][f"{kind}-2"].items():
            gap = (a - accumulated[k]).abs()
            assert gap.max().item() <= 1e-8, (kind, k, gap.max().item())  # weights ~0.1: an fp32 step is 7.5e-9
            differ += int((gap > 0).sum())
        assert differ <= 4, (kind, differ)
    assert [r["reduced"] for r in ranks] == [8, 8]  # 4 steps x 2 DDPs averaged the buffers


def test_grpo_with_master_weights_rolls_out_the_bf16_model_and_resumes_bit_for_bit(tmp_path):
    """GRPO (rollouts through the engine, KL to a frozen copy of the start) on the bf16 model: interrupted after 2 of
    4 steps and resumed, the same weights and masters bit for bit as the straight run, and the weights moved."""
    from test_align_grpo import _grpo_trainer

    from cookmind.align import GRPOConfig

    gcfg = GRPOConfig(
        group_size=4, max_new_tokens=4, template="{question}", stop_strings=(), kl_coef=0.1, reference="copy"
    )
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 9)]
    mw = {"train": {"precision": "bf16", "master_weights": True}}
    straight = _grpo_trainer(tmp_path / "a", 4, problems=problems, prompts_per_step=2, gcfg=gcfg, **mw)
    start = {k: v.clone() for k, v in straight.bare_model.state_dict().items()}
    straight.fit()
    _grpo_trainer(tmp_path / "b", 2, problems=problems, prompts_per_step=2, gcfg=gcfg, **mw).fit()
    resumed = _grpo_trainer(
        tmp_path / "b", 4, problems=problems, prompts_per_step=2, gcfg=gcfg, checkpoint={"resume": "auto"}, **mw
    )
    resumed.fit()
    assert straight.objective.reference.model.lm_head.weight.dtype == BF16
    a, b = straight.bare_model.state_dict(), resumed.bare_model.state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)
    for k in a:
        assert a[k].dtype == BF16 and torch.equal(a[k], b[k]), k
    for ma, mb in zip(straight.optimizer.model_params, resumed.optimizer.model_params):
        assert torch.equal(ma, mb)


def test_fp8_blocks_train_the_bf16_weights_the_masters_write(tmp_path, monkeypatch):
    """Emulated float8 blocks (torchao on the CPU) over master weights: each Float8Linear's weight is a parameter
    AdamW writes back to (torchao reuses the module's parameter), it moved, and it is its master rounded."""
    import functools

    from cookmind.model import float8_blocks as F8

    try:
        F8.import_torchao_float8()
    except ImportError as exc:
        pytest.skip(str(exc))
    monkeypatch.setattr(F8, "fp8_blocks_problem", lambda device: None)
    monkeypatch.setattr(F8, "convert_blocks_to_float8", functools.partial(F8.convert_blocks_to_float8, emulate=True))
    cfg = TrainConfig.from_dict(
        {
            "model": TINY,
            "data": {"window_size": 16},
            "train": {"max_steps": 2, "micro_batch_size": 2, "device": "cpu", "fp8_blocks": True}
            | {"precision": "bf16", "master_weights": True},
            "logging": {"run_dir": str(tmp_path / "run"), "progress": False, "report": False},
        }
    )
    data = [{"input_ids": torch.arange(16) % 7, "labels": torch.arange(16) % 7} for _ in range(4)]
    trainer = Trainer(cfg, train_dataset=data)
    linears = [m for m in trainer.bare_model.modules() if type(m).__name__ == "Float8Linear"]
    assert len(linears) == 14
    start = [m.weight.detach().clone() for m in linears]
    trainer.fit()
    masters = {id(p): m for m, p in trainer.optimizer.model_params.items()}
    for m, w0 in zip(linears, start):
        assert m.weight.dtype == BF16 and not torch.equal(m.weight, w0)
        assert torch.equal(m.weight.detach(), masters[id(m.weight)].to(BF16))


def test_a_second_trainer_over_the_same_model_trains_it_as_a_fresh_model(store):
    """Expert iteration trains one model through a Trainer per round. With master weights and accumulation the
    second Trainer's fp32-accumulation hooks must not stack on the first's (a second hook found ``.grad`` taken):
    its 2 steps equal, bit for bit, those of a fresh model started from the same weights."""
    torch.manual_seed(0)
    model = tiny_lm()
    kw = dict(max_steps=2, micro_batch_size=2, grad_accum_steps=2)
    Trainer(_cfg(store, "round1", **kw), model=model).fit()
    fresh = tiny_lm()
    fresh.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    again = Trainer(_cfg(store, "round2", **kw), model=model)
    again.fit()
    new = Trainer(_cfg(store, "fresh", **kw), model=fresh)
    new.fit()
    a, b = again.bare_model.state_dict(), new.bare_model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for ma, mb in zip(again.optimizer.model_params, new.optimizer.model_params):
        assert torch.equal(ma, mb)


def test_a_plain_trainer_after_a_master_weights_one_trains_the_model_as_a_fresh_model(store, capsys):
    """A master-weights Trainer with accumulation leaves the model bf16 and its fp32-accumulation hooks on the
    parameters. A later Trainer of the same model without master weights makes the trained parameters fp32 again,
    saying so (its AdamW failed on a dtype mismatch deep in a foreach kernel), and takes the hooks off (they took each
    gradient into a buffer its optimizer never reads: the model did not train). Its 2 steps equal, bit for bit, those
    of a fresh fp32 model started from the same weights."""
    torch.manual_seed(0)
    model = tiny_lm()
    Trainer(_cfg(store, "round1", max_steps=2, micro_batch_size=2, grad_accum_steps=2), model=model).fit()
    assert all(p.dtype == BF16 for p in model.parameters())
    fresh = tiny_lm()
    fresh.load_state_dict(model.state_dict())  # the bf16 values, in fp32 parameters
    before = {k: v.float() for k, v in model.state_dict().items()}
    capsys.readouterr()
    kw = dict(master=False, max_steps=2, micro_batch_size=2, grad_accum_steps=2)
    again = Trainer(_cfg(store, "round2", **kw), model=model)
    n = sum(p.numel() for p in model.parameters())
    assert f"trained parameters ({n / 1e6:.1f}M) arrived as bfloat16 and train as float32" in capsys.readouterr().err
    again.fit()
    new = Trainer(_cfg(store, "fresh", **kw), model=fresh)
    new.fit()
    a, b = again.bare_model.state_dict(), new.bare_model.state_dict()
    assert any(not torch.equal(a[k], before[k]) for k in a)  # it trained
    for k in a:
        assert a[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k
    assert all(getattr(p, "grad_fp32", None) is None for p in again.bare_model.parameters())
