"""Per-row LoRA update kernels (``kernels.lora_bgmv``, #19 item 4) and ``lora_update="kernel"``.

The reference is a naive loop in float64, row by row and part by part: y + scale[i] * (x A[i]^T) B[i]^T in each
targeted part's slice for a row served by adapter i, nothing for adapter 0. float32 matches it within 1e-5; float16
within 2e-3 and bfloat16 within 1e-2, relative and absolute (the output is rounded to the dtype, whose half-step is
2^-11 or 2^-9 of the value, after a float32 sum). The kernel tests run on CUDA, or on CPU under TRITON_INTERPRET=1
with triton installed.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from lm_fixtures import sharp_tiny_lm
from test_multi_lora import NEW, _adapter, _run, serves_a_mixed_batch_from_graphs_like_the_merged_models
from test_multi_lora import _reference as greedy_reference
from triton_fixtures import kernel_device, needs_kernel

from cookmind.infer import multi_lora
from cookmind.infer.engine import Engine
from cookmind.infer.loading import load_adapters
from cookmind.infer.multi_lora import LowRankDelta
from cookmind.kernels import lora_bgmv

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _case(n, width, specs, dtype, device, seed=0):
    """parts of a fused projection for LowRankDelta: specs in output order, (out, r) for a targeted part or an int
    width for a part no adapter targets; n adapters, stacked after index 0 (the base, zeros). Adapter 1 has rank
    r - 1 in every part (zero-padded, as attach_adapters stacks a smaller rank); adapter 2 targets only the parts
    after the first (zeros in the first)."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for k, spec in enumerate(specs):
        if isinstance(spec, int):
            parts.append(spec)
            continue
        out, r = spec
        a = torch.randn(n + 1, r, width, generator=gen)
        b = torch.randn(n + 1, out, r, generator=gen)
        a[0], b[0] = 0, 0
        a[1, r - 1 :], b[1, :, r - 1 :] = 0, 0
        if k == 0 and n >= 2:
            a[2], b[2] = 0, 0
        scale = torch.rand(n + 1, generator=gen) + 0.5
        parts.append((a.to(device, dtype), b.to(device, dtype), scale.to(device)))
    return parts, gen


def _reference(parts, rows, x, y):
    """Row by row, part by part, in float64 from the same (rounded) inputs."""
    out = y.double().clone()
    for row, i in enumerate(rows[: x.shape[0]].tolist()):
        start = 0
        for p in parts:
            width = p if isinstance(p, int) else p[1].shape[1]
            if not isinstance(p, int) and i != 0:
                a, b, s = (t.double() for t in p)
                out[row, ..., start : start + width] += s[i] * (x[row].double() @ a[i].T) @ b[i].T
            start += width
    return out


SPECS = [(8, 3), (4, 2), 4, (6, 3)]  # q, k, a part no adapter targets, v: 22 wide, R = 8


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("lead", [(7, 1), (7, 4), (5, 16), (7,)], ids=["decode", "verify-4", "verify-16", "head"])
def test_kernels_add_each_rows_update_like_a_row_loop(dtype, lead):
    """A decode step (B, 1, in), verify steps of 4 and 16 tokens a row and a head's (B, in), through the fused
    projection's two launches: every targeted part's update in its slice (adapters of a smaller rank, an adapter
    that targets only some parts, a part no adapter targets), rows of adapter 0 left bit for bit as they were,
    and rows past the batch in the table ignored."""
    dev = kernel_device()
    parts, gen = _case(n=3, width=37, specs=SPECS, dtype=dtype, device=dev)
    rows = torch.tensor([0, 1, 2, 3, 0, 2, 1, 3, 3], device=dev)  # 9 slots; a batch uses the first B
    delta = LowRankDelta(parts, rows, masked=False, kernel=True)
    x = torch.randn(*lead, 37, generator=gen).to(dev, dtype)
    y = torch.randn(*lead, 22, generator=gen).to(dev, dtype)
    want = _reference(parts, rows, x, y)
    assert delta.uses_kernel(x)
    got = delta(x, y.clone())
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    base = rows[: lead[0]] == 0
    assert torch.equal(got[base], y[base])  # adapter 0: no work, nothing written


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_folds_every_adapter_down_projection_is_read_in_place_of_the_shrink(dtype, monkeypatch):
    """Where the projection's GEMM gave y and every adapter's x A^T side by side (A's rows below the weight's: the
    fold), the expand reads each row's own columns there and no shrink runs; the output is y's own width. The
    reference takes x A^T as the GEMM gave it (in bf16 rounded: that rounding is the fold's, not the kernel's)."""
    dev = kernel_device()
    parts, gen = _case(n=3, width=37, specs=SPECS, dtype=dtype, device=dev, seed=1)
    rows = torch.tensor([2, 0, 3, 1, 1], device=dev)
    delta = LowRankDelta(parts, rows, masked=False, kernel=True)
    x = torch.randn(5, 2, 37, generator=gen).to(dev, dtype)
    y = torch.randn(5, 2, 22, generator=gen).to(dev, dtype)

    def no_shrink(*args):
        raise AssertionError("the shrink ran though the fold gave x A^T")

    monkeypatch.setattr(lora_bgmv, "lora_shrink", no_shrink)
    wide = torch.cat([y, F.linear(x, delta.stack_A.flatten(0, 1))], dim=-1)  # (5, 2, 22 + 4 * 8)
    lows = wide[..., 22:].double().view(5, 2, 4, 8)  # (B, T, n+1, R): every adapter's rank columns
    want = y.double().clone()
    for row, i in enumerate(rows.tolist()):
        targeted = [span for span in delta.spans if span[2] is not None]
        for (start, end, (r0, r1)), (_, b, scale) in zip(targeted, [p for p in parts if not isinstance(p, int)]):
            want[row, :, start:end] += scale[i].double() * lows[row, :, i, r0:r1] @ b[i].double().T
    got = delta(x, wide)
    assert got.shape == y.shape
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype])


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
def test_shrink_and_expand_at_the_largest_rank_and_an_uneven_width():
    """Three parts of rank 64 (R = 192: the shrink's rank blocks, the expand's widest rank tile), an input width
    of 300 (a last partial block of the shrink's loop), 3 tokens a row; the shrink alone equals x A[i]^T."""
    dev = kernel_device()
    parts, gen = _case(n=2, width=300, specs=[(40, 64), (24, 64), (24, 64)], dtype=torch.float32, device=dev)
    rows = torch.tensor([1, 0, 2, 2, 1, 0], device=dev)
    delta = LowRankDelta(parts, rows, masked=False, kernel=True)
    x = torch.randn(6, 3, 300, generator=gen).to(dev)
    y = torch.randn(6, 3, 88, generator=gen).to(dev)
    low = lora_bgmv.lora_shrink(x, rows, delta.stack_A).view(6, 3, -1)
    for row, i in enumerate(rows.tolist()):
        if i:
            want = x[row].double() @ delta.stack_A[i].double().T  # sums of 300 float32 products: 1e-4 absolute
            torch.testing.assert_close(low[row].double(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(delta(x, y.clone()).double(), _reference(parts, rows, x, y), rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize("folded", [False, True], ids=["shrink", "folded"])
def test_compiled_kernel_update_adds_into_the_projections_output(folded):
    """Compiled as the runner compiles (dynamic shapes), the custom op's in-place add reaches what the projection
    returns: decode and verify steps through the kernels (from the shrink, or from a weight with every adapter's A
    below its rows), a 20-token prefill through the gathered pairs, all equal to the row loop."""
    dev = kernel_device()
    parts, gen = _case(n=3, width=37, specs=SPECS, dtype=torch.float32, device=dev, seed=2)
    rows = torch.tensor([3, 0, 1, 2, 2, 1, 0], device=dev)
    delta = LowRankDelta(parts, rows, masked=False, kernel=True)
    w = torch.randn(22, 37, generator=gen).to(dev)
    weight = torch.cat([w, delta.stack_A.flatten(0, 1)]) if folded else w
    compiled = torch.compile(lambda x: delta(x, F.linear(x, weight)), dynamic=True)
    for lead in [(7, 1), (7, 4), (7, 20)]:
        x = torch.randn(*lead, 37, generator=gen).to(dev)
        want = _reference(parts, rows, x, x @ w.T)
        torch.testing.assert_close(compiled(x).double(), want, rtol=1e-5, atol=1e-4)


def test_the_kernels_refuse_what_they_do_not_take():
    """More than MAX_TOKENS tokens a row, or a rank past MAX_RANK, is a ValueError naming the limit (checked
    before anything launches)."""
    parts, gen = _case(n=1, width=5, specs=[(4, 2)], dtype=torch.float32, device="cpu")
    layout = lora_bgmv.expand_layout([(0, 0, parts[0][1])])
    x, y = torch.randn(2, 17, 5), torch.randn(2, 17, 4)
    with pytest.raises(ValueError, match="up to 16 tokens a row, got 17"):
        lora_bgmv.add_lora_update_(y, x, torch.ones(2, dtype=torch.long), parts[0][0], parts[0][2][:, None], layout)
    with pytest.raises(ValueError, match="rank up to 64 a part, got 65; use lora_update='auto'"):
        lora_bgmv.expand_layout([(0, 0, torch.zeros(2, 4, 65))])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no kernel can run")
def test_kernel_update_on_a_cpu_model_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    base = sharp_tiny_lm()
    adapter = multi_lora.LoRAAdapter("chef", None, 2.0, {"model.layers.0.self_attn.q_proj": (torch.zeros(2, 32),) * 2})
    with pytest.raises(ValueError, match=r"lora_update='kernel' runs Triton kernels: the model is on cpu.*'auto'"):
        multi_lora.attach_adapters(base, [adapter], num_slots=2, update="kernel")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny base, two adapters saved to disk (chef: q, v, down at rank 4; baker: k, o, gate, up at rank 2)
    and each one's merged model, the reference."""
    tmp = tmp_path_factory.mktemp("lora-kernel")
    # CUDA: head dim 16, the paged decode kernel's smallest (a CUDA graph can hold no fallback); the interpreter
    # keeps head dim 8 and the PyTorch twin of that kernel (Triton 3.6's interpreter mis-runs its loops)
    base = sharp_tiny_lm(head_dim=16 if torch.cuda.is_available() else 8)
    refs = {
        None: copy.deepcopy(base),
        "chef": _adapter(base, tmp / "chef", 1, r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"]),
        "baker": _adapter(base, tmp / "baker", 2, r=2, alpha=4.0, targets=["k_proj", "o_proj", "gate_proj", "up_proj"]),
    }
    return base, tmp, refs


def count_launches(monkeypatch) -> dict[str, list[int]]:
    """Record every shrink and expand launch (the expand's tokens a row) from inside the custom op's body, which a
    compiled forward still calls: patching ``torch.ops.cookmind.lora_bgmv_add_`` itself would hand the compiler a
    plain function, which it cannot trace, and the engine would fall back to eager."""
    launches = {"shrink": [], "expand": []}
    shrink, expand = lora_bgmv.lora_shrink, lora_bgmv.lora_expand_

    def counted_shrink(x, *args):
        launches["shrink"].append(x.shape[1] if x.dim() == 3 else 1)
        return shrink(x, *args)

    def counted_expand(*args):
        launches["expand"].append(args[-1])
        return expand(*args)

    monkeypatch.setattr(lora_bgmv, "lora_shrink", counted_shrink)
    monkeypatch.setattr(lora_bgmv, "lora_expand_", counted_expand)
    return launches


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
@pytest.mark.parametrize(
    "kw, share",
    [({"kv_cache": "paged", "decode_attention": "kernel"}, 1.0), ({"kv_cache": "slots"}, 0.0)],
    ids=["fused-folded", "unfused-shrink"],
)
def test_engine_with_the_kernel_update_equals_each_merged_model(served, kw, share, monkeypatch):
    """lora_update="kernel": one batch of two adapters and the base equals each merged model (greedy tokens; log
    probabilities within 1e-4, float32). Fused q/k/v and gate/up projections with every adapter's A folded into
    their GEMMs (the expand reads the fold's x A^T), or separate projections and no fold (a shrink each); prefill
    gathers each row's pair either way."""
    monkeypatch.setattr(multi_lora, "FOLD_MAX_SHARE", share)
    base, tmp, refs = served
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    engine = Engine(copy.deepcopy(base).to(kernel_device()), num_slots=4, adapters=adapters, lora_update="kernel", **kw)
    deltas = [m for m in engine.runner.model.modules() if isinstance(m, LowRankDelta)]
    if engine.runner.fused is not None:
        deltas += [f.qkv_delta for f in engine.runner.fused] + [f.gate_up_delta for f in engine.runner.fused]
    assert deltas and all(d.kernel and not d.masked for d in deltas)
    launches = count_launches(monkeypatch)
    prompts = [[5, 9, 14, 3, 22, 7], [5, 9, 14, 3, 40], [11, 2, 30, 8, 8, 19, 4], [5, 9, 14, 3, 22, 7]]
    jobs = list(zip(prompts, ["chef", None, "baker", "baker"]))
    differs = False
    for (prompt, name), (toks, lps, prompt_lp) in zip(jobs, _run(engine, jobs)):
        ref_toks, ref_lps, ref_prompt_lp = greedy_reference(refs[name], prompt, NEW)
        assert toks == ref_toks, (name, prompt)
        assert max(abs(a - b) for a, b in zip(lps + prompt_lp, ref_lps + ref_prompt_lp)) < 1e-4, name
        differs |= name is not None and toks != greedy_reference(refs[None], prompt, NEW)[0]
    assert differs, "the adapters did not change any output: the comparison would prove nothing"
    assert launches["expand"] and (launches["shrink"] == []) == (share > 0)  # folded: no shrink anywhere
    assert engine.runner.compile_error is None  # the op traced (on CUDA the engine compiles)


@pytest.mark.gpu
@pytest.mark.parametrize("rows_n, tokens", [(256, 1), (64, 16)], ids=["decode-256", "verify-64x16"])
def test_kernel_update_replays_from_a_cuda_graph_at_serving_sizes(rows_n, tokens):
    """CUDA, bf16, a 768-wide fused q/k/v of three rank-64 parts and 4 adapters: captured once while every row is
    the base's, the graph replays each new mix of adapters written into the rows tensor (no host sync, shapes
    fixed), equal to the row loop; with every row back on the base the output is the input, bit for bit."""
    parts, gen = _case(n=4, width=768, specs=[(768, 64), (256, 64), (256, 64)], dtype=torch.bfloat16, device="cuda")
    rows = torch.zeros(rows_n, dtype=torch.long, device="cuda")
    delta = LowRankDelta(parts, rows, masked=False, kernel=True)
    x = torch.randn(rows_n, tokens, 768, generator=gen).to("cuda", torch.bfloat16)
    y0 = torch.randn(rows_n, tokens, 1280, generator=gen).to("cuda", torch.bfloat16)
    y = y0.clone()
    delta(x, y)  # compiles the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        delta(x, y)
    for seed in (1, 2):
        mix = torch.randint(0, 5, (rows_n,), generator=torch.Generator().manual_seed(seed))
        rows.copy_(mix)
        y.copy_(y0)
        graph.replay()
        torch.testing.assert_close(y.double(), _reference(parts, rows, x, y0), rtol=1e-2, atol=1e-2)
    rows.zero_()
    y.copy_(y0)
    graph.replay()
    assert torch.equal(y, y0)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [32, 64], ids=["head-dim-8-gather", "head-dim-16-kernel-fused"])
def test_cuda_graphs_and_compile_serve_each_rows_adapter_through_the_kernels(tmp_path, hidden):
    """On CUDA (graphs captured once, layers compiled) an engine with adapters and lora_update left at "auto" takes
    the kernels; a mixed batch equals each merged model (float32; 1e-3 for the GPU's reduction order), every
    decode step replays a captured graph, and the compiler took the custom op (no compile error). Head dim 16 fuses
    q/k/v and gate/up, every adapter's A folded into the GEMMs."""
    base = sharp_tiny_lm(hidden_size=hidden)
    refs = {
        None: base,
        "chef": _adapter(base, tmp_path / "chef", 1, r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"]),
        "baker": _adapter(base, tmp_path / "baker", 2, r=2, alpha=4.0, targets=["k_proj", "o_proj", "up_proj"]),
    }
    adapters = load_adapters(base, {"chef": tmp_path / "chef", "baker": tmp_path / "baker"})
    engine = Engine(copy.deepcopy(base).cuda(), num_slots=4, adapters=adapters)  # lora_update "auto"
    assert engine.graphs is not None and engine.graphs.capture and engine.runner.compiled
    deltas = [m for m in engine.runner.model.modules() if isinstance(m, LowRankDelta)]
    assert deltas and all(d.kernel and not d.masked for d in deltas)
    serves_a_mixed_batch_from_graphs_like_the_merged_models(engine, refs)


@needs_kernel
@pytest.mark.gpu
@pytest.mark.triton_interpretable
def test_speculative_verify_steps_run_each_rows_adapter_through_the_kernels(served, monkeypatch):
    """n-gram speculation (3 drafts: verify forwards of 4 tokens a row) over a batch of two adapters and the base
    with lora_update="kernel": each request's greedy tokens equal its merged model's, and both decode (1 token a
    row) and verify (4) forwards ran the kernels."""
    from test_speculative import PROMPTS, engine

    from cookmind.infer.engine import TokenEvent
    from cookmind.infer.sampling import SamplingParams
    from cookmind.infer.speculative import SpeculativeConfig

    base, tmp, refs = served
    launches = count_launches(monkeypatch)
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    spec = SpeculativeConfig("ngram", num_tokens=3, ngram_min=1, ngram_max=3)
    eng = engine(copy.deepcopy(base).to(kernel_device()), spec, num_slots=4, adapters=adapters, lora_update="kernel")
    jobs = [(PROMPTS[3], "chef"), (PROMPTS[0], None), (PROMPTS[4], "baker")]
    reqs = [eng.submit(p, SamplingParams(temperature=0, max_new_tokens=2 * NEW), adapter=a) for p, a in jobs]
    eng.run_until_idle()
    for req, (prompt, name) in zip(reqs, jobs):
        got = [e.token_id for e in req.events(timeout=0) if isinstance(e, TokenEvent)]
        assert got == greedy_reference(refs[name], prompt, 2 * NEW)[0], name
    assert eng.metrics()["spec_accepted_tokens_total"] > 0
    assert {1, 4} <= set(launches["expand"]), launches["expand"]  # tokens a row of each expand
    assert eng.runner.compile_error is None
