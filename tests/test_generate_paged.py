"""The paged KV cache: budget arithmetic, block accounting, waiting for blocks, and the same tokens as
the slot cache and as generate() (the model's own KV-cache path)."""

from __future__ import annotations

import pytest
import torch
from lm_fixtures import sharp_tiny_lm

from cookmind.infer import generate
from cookmind.infer.engine import Engine, FinishEvent, PromptLogprobsEvent, TokenEvent
from cookmind.infer.paged_cache import BlockAllocator, blocks_for_budget
from cookmind.infer.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


tiny_model = sharp_tiny_lm


PROMPTS = [[5, 9, 11], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7], [42], [7, 7, 7, 7, 7, 7], [8, 1, 2, 8]]
LENS = [9, 5, 14, 3, 11]
# per block: 2 (K, V) * 2 layers * 2 kv heads * 4 positions * 8 head dim * 4 bytes (fp32) = 1024 bytes
BLOCK_BYTES = 2 * 2 * 2 * 4 * 8 * 4


def tokens(req):
    return [ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)]


def test_blocks_for_budget_hand_computed():
    assert BLOCK_BYTES == 1024
    assert blocks_for_budget(10 * 1024 + 1023, 2, 2, 4, 8, torch.float32) == 10
    assert blocks_for_budget(10 * 1024, 2, 2, 4, 8, torch.bfloat16) == 20  # half the bytes per element
    # GPT-2-small shape, bf16, 16-token blocks: 2*12*12*16*64*2 = 589,824 bytes -> 455 blocks in 256 MiB
    assert blocks_for_budget(256 * 2**20, 12, 12, 16, 64, torch.bfloat16) == 455
    with pytest.raises(ValueError, match="at least 2"):
        blocks_for_budget(1500, 2, 2, 4, 8, torch.float32)
    engine = Engine(tiny_model(), max_seq_len=48, kv_budget_bytes=50 * 1024, block_size=4)
    assert engine.kv_blocks()["kv_blocks_total"] == 49  # 50 blocks, one of them scratch


def test_allocator_rejects_double_free():
    alloc = BlockAllocator(4)
    a, b = alloc.allocate(), alloc.allocate()
    assert {a, b} <= {1, 2, 3} and alloc.num_free == 1
    alloc.free([a])
    with pytest.raises(RuntimeError, match="twice"):
        alloc.free([a, a])
    with pytest.raises(ValueError, match="not a pool block"):
        alloc.free([0])


@pytest.mark.parametrize("overlap,graphs", [(False, False), (True, True)])
def test_paged_equals_slots_and_generate_mixed_lengths(overlap, graphs):
    model = tiny_model()
    outs = {}
    for kv in ("paged", "slots"):
        engine = Engine(
            model,
            num_slots=3,
            max_seq_len=48,
            prefill_chunk=5,
            block_size=4,
            kv_cache=kv,
            overlap=overlap,
            cuda_graphs=graphs,
        )
        reqs = [engine.submit(p, SamplingParams(temperature=0), n) for p, n in zip(PROMPTS, LENS)]
        engine.run_until_idle()  # 5 requests through 3 rows, prompts chunked, many block boundaries
        outs[kv] = [tokens(r) for r in reqs]
    assert outs["paged"] == outs["slots"]
    greedy = SamplingParams(temperature=0)
    assert outs["paged"] == [generate(model, [p], greedy.replace(max_new_tokens=n))[0] for p, n in zip(PROMPTS, LENS)]


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "num_key_value_heads": 1}, {"head_dim": 16}])
def test_decode_kernel_path_equals_generate(overrides):
    """decode_attention="kernel" (fused projections, deferred residual, RoPE + cache write + attention in
    paged_decode_attention; its PyTorch twin on CPU) gives generate()'s greedy tokens, with and without
    graphs' self-advancing state, for MHA, GQA with QK-norm, and a head dim the Triton kernel takes."""
    model = tiny_model(**overrides)
    want = [generate(model, [p], SamplingParams(temperature=0, max_new_tokens=n))[0] for p, n in zip(PROMPTS, LENS)]
    for graphs in (False, True):
        engine = Engine(
            model,
            num_slots=3,
            max_seq_len=48,
            prefill_chunk=5,
            block_size=4,
            cuda_graphs=graphs,
            decode_attention="kernel",
        )
        assert engine.runner.decode_attention == "kernel" and engine.runner.fused[0].qkv is not None
        reqs = [engine.submit(p, SamplingParams(temperature=0), n) for p, n in zip(PROMPTS, LENS)]
        engine.run_until_idle()
        assert [tokens(r) for r in reqs] == want


def test_decode_kernel_logits_equal_gather_logits():
    """One decode step of rows at different lengths: the kernel path's logits equal the gather + SDPA path's."""
    from cookmind.infer.runner import ModelRunner

    model = tiny_model(head_dim=16)
    logits = {}
    for mode in ("gather", "kernel"):
        runner = ModelRunner(model, 2, 48, kv_cache="paged", num_blocks=30, block_size=4, decode_attention=mode)
        runner.cache.set_row(0, [3, 7, 1, 9, 2])
        runner.cache.set_row(1, [5, 4, 6])
        runner.cache.sync_tables()
        prompts = torch.tensor([PROMPTS[1][:13], PROMPTS[1][:9] + [0] * 4])
        pos = torch.arange(13).expand(2, 13)
        cols = pos.clone()
        cols[1, 9:] = runner.scratch_col  # row 1's prompt is 9 tokens: padding writes go to scratch
        runner.forward(prompts, pos, 0, 13, write_cols=cols)
        step = torch.tensor([[13], [9]])
        logits[mode] = runner.forward(torch.tensor([[4], [8]]), step, 0, 14)
    torch.testing.assert_close(logits["kernel"], logits["gather"], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_the_decode_kernel_asked_for_with_a_head_dim_it_cannot_take_is_refused_on_cuda():
    """On CUDA, decode_attention="kernel" with head dim 8 is a ValueError naming the range and "auto": falling back
    to the PyTorch twin (which reads each row's length on the host) broke CUDA graph capture mid-serve."""
    with pytest.raises(ValueError, match=r"head dim from 16 to 256.*this model's is 8.*'auto'"):
        Engine(tiny_model().cuda(), num_slots=2, max_seq_len=32, block_size=4, decode_attention="kernel")
    assert Engine(tiny_model().cuda(), num_slots=2, max_seq_len=32, block_size=4).runner.decode_attention == "gather"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "num_key_value_heads": 1}])
def test_a_few_tokens_per_row_attend_through_the_decode_kernel_as_the_model_does(monkeypatch, overrides, device):
    """A verify-sized forward (5 tokens per row, rows at different places, scattered blocks) and a short prefill
    attend through the paged decode kernel (the Triton kernel on CUDA, its PyTorch twin on CPU), one query per
    token, each seeing the tokens before it in the same forward: every place's logits equal the model's own forward
    over the whole sequence. A prefill longer than KERNEL_MAX_TOKENS gathers (each token's query would read the
    whole prefix)."""
    import cookmind.infer.runner as runner_module
    from cookmind.infer.runner import ModelRunner

    model = tiny_model(head_dim=16, **overrides).to(device)  # a head dim the Triton kernel takes
    calls = []
    kernel = runner_module.paged_decode_attention
    monkeypatch.setattr(runner_module, "paged_decode_attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    runner = ModelRunner(model, 2, 48, kv_cache="paged", num_blocks=30, block_size=4, decode_attention="kernel")
    runner.cache.set_row(0, [3, 7, 1, 9, 2, 11, 12, 13, 14])
    runner.cache.set_row(1, [5, 4, 6, 8])
    runner.cache.sync_tables()
    seqs = [[(7 * i + 3) % 97 for i in range(27)], PROMPTS[1][:11]]
    starts = [22, 6]  # row 0's prompt is longer than the kernel takes: it prefills through the gather path
    for row, (seq, n) in enumerate(zip(seqs, starts)):
        runner.forward(torch.tensor([seq[:n]], device=device), torch.arange(n, device=device)[None], row, n)
        assert len(calls) == (0 if n > runner.KERNEL_MAX_TOKENS else len(model.model.layers))
        calls.clear()
    tokens = torch.tensor([seq[n : n + 5] for seq, n in zip(seqs, starts)], device=device)
    positions = torch.stack([torch.arange(n, n + 5) for n in starts]).to(device)
    got = runner.forward(tokens, positions, 0, 27, last_only=False)
    assert len(calls) == len(model.model.layers)  # one kernel call per layer, no gather
    tol = 1e-4 if device == "cpu" else 1e-3  # float32 either way; CUDA sums in another order
    for row, (seq, n) in enumerate(zip(seqs, starts)):
        with torch.no_grad():
            want = model(torch.tensor([seq[: n + 5]], device=device)).logits[0, n:].float()
        torch.testing.assert_close(got[row], want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kv_cache", ["paged", "slots"])
def test_the_gather_path_never_repeats_keys_per_query_head(kv_cache):
    """Grouped-query attention through the gather path (a prefill, a verify-sized forward, a decode step): the
    group's query heads attend as extra queries of their kv head, so no tensor of keys or values repeated to every
    query head (B, heads, L, D) is ever made, and every place's logits still equal the model's own forward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from cookmind.infer.runner import ModelRunner

    model = tiny_model(num_attention_heads=4, num_key_value_heads=1)
    cfg = model.config
    shapes = []

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                shapes.append(tuple(out.shape))
            return out

    blocks = {"num_blocks": 30, "block_size": 4} if kv_cache == "paged" else {}
    runner = ModelRunner(model, 1, 48, kv_cache=kv_cache, decode_attention="gather", **blocks)
    if kv_cache == "paged":
        runner.cache.set_row(0, [3, 7, 1, 9, 2, 11, 12])
        runner.cache.sync_tables()
    seq = PROMPTS[1] + [4, 4, 2, 7, 1, 8]
    got = []
    for lo, hi in ((0, 9), (9, 14), (14, 15)):  # 9-token prefill, 5 tokens (a chunk, a verify step), one decode step
        shapes.clear()
        with Shapes():
            # attending to 3 columns more than needed (masked): the keys' length differs from any query count
            got.append(runner.forward(torch.tensor([seq[lo:hi]]), torch.arange(lo, hi)[None], 0, hi + 3, False))
        assert (1, cfg.num_key_value_heads, hi + 3, cfg.resolved_head_dim) in shapes  # the gathered keys, once
        assert (1, cfg.num_attention_heads, hi + 3, cfg.resolved_head_dim) not in shapes  # ... not for every head
    with torch.no_grad():
        want = model(torch.tensor([seq[:15]])).logits[0].float()
    torch.testing.assert_close(torch.cat(got, 1)[0], want, rtol=1e-4, atol=1e-4)


def test_fused_projections_leave_the_model_unchanged_and_savable(tmp_path):
    """The runner re-points q/k/v and gate/up weights at rows of fused tensors: the model's own forward,
    its parameters' identity and save_model/load_model round trips are unaffected."""
    from cookmind.model import load_model, save_model

    model = tiny_model()
    x = torch.tensor([PROMPTS[1]])
    before = model(x).logits if hasattr(model(x), "logits") else model(x)
    q_param = model.model.layers[0].self_attn.q_proj.weight
    engine = Engine(model, num_slots=2, max_seq_len=48, block_size=4, decode_attention="kernel")
    fused = engine.runner.fused[0]
    assert model.model.layers[0].self_attn.q_proj.weight is q_param
    assert q_param.untyped_storage().data_ptr() == fused.qkv.untyped_storage().data_ptr()
    after = model(x).logits if hasattr(model(x), "logits") else model(x)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    again = Engine(model, num_slots=2, max_seq_len=48, block_size=4, decode_attention="kernel")
    shared = again.runner.fused[0].qkv  # a second runner shares the fused memory: no copy to go stale
    assert shared.data_ptr() == fused.qkv.data_ptr() and torch.equal(shared, fused.qkv)
    assert again.runner.fused[0].gate_up.data_ptr() == fused.gate_up.data_ptr()
    loaded = load_model(save_model(tmp_path / "ckpt", model))
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_blocks_grow_with_the_sequence_and_all_return_after_finish_and_cancel():
    model = tiny_model()
    engine = Engine(model, num_slots=3, max_seq_len=48, block_size=4, kv_budget_bytes=40 * BLOCK_BYTES, overlap=False)
    total = engine.kv_blocks()["kv_blocks_total"]
    a = engine.submit(PROMPTS[1], SamplingParams(temperature=0), 20)  # 14 + 20 = 34 positions: 9 blocks reserved
    b = engine.submit(PROMPTS[0], SamplingParams(temperature=0), 30)
    c = engine.submit(PROMPTS[2], SamplingParams(temperature=0), 5)
    engine.step()  # a and b prefill and sample one token each
    for _ in range(4):
        engine.step()
    # a holds its 14 prompt positions + 4 decoded ones = 18 positions -> ceil(18/4) = 5 blocks, not 9
    assert len(a.blocks) == 5 and len(b.blocks) == -(-(3 + 4) // 4)
    assert engine.kv_blocks()["kv_blocks_free"] == total - len(a.blocks) - len(b.blocks) - len(c.blocks)
    engine.cancel(b)
    engine.cancel(c)
    engine.run_until_idle()
    assert tokens(a) == generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=20))[0]
    blocks = engine.kv_blocks()
    assert blocks["kv_blocks_free"] == blocks["kv_blocks_unreserved"] == total
    assert all(len(r.blocks) == 0 for r in (a, b, c))


def test_request_that_cannot_get_blocks_waits_in_the_queue():
    model = tiny_model()
    # 10 blocks, 9 usable; each request can fill 3 + 13 = 16 positions = 4 blocks: two run at once
    engine = Engine(model, num_slots=4, max_seq_len=48, block_size=4, kv_budget_bytes=10 * BLOCK_BYTES)
    prompts = [PROMPTS[0], PROMPTS[4][:3], [11, 12, 13], [20, 21, 22]]
    reqs = [engine.submit(p, SamplingParams(temperature=0), 13) for p in prompts]
    engine.step()
    running = [r for r in engine.slots if r is not None]
    assert len(running) == 2 and len(engine.waiting) == 2  # rows are free; blocks are not
    engine.run_until_idle()
    greedy = SamplingParams(temperature=0, max_new_tokens=13)
    assert [tokens(r) for r in reqs] == [generate(model, [p], greedy)[0] for p in prompts]
    assert engine.kv_blocks()["kv_blocks_free"] == 9
    with pytest.raises(ValueError, match="pool holds 9"):
        engine.submit(PROMPTS[1], None, 30)  # could fill 44 positions = 11 blocks: never fits


def test_prompt_logprobs_across_prefill_chunks():
    model = tiny_model()
    engine = Engine(model, num_slots=2, max_seq_len=48, prefill_chunk=4, block_size=4)
    prompt = PROMPTS[1]
    req = engine.submit(prompt, SamplingParams(temperature=0), 0, prompt_logprobs=3)  # scoring only
    engine.run_until_idle()
    events = list(req.events(timeout=0))
    assert isinstance(events[0], PromptLogprobsEvent) and isinstance(events[-1], FinishEvent)
    assert events[-1].reason == "length" and len(events) == 2
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), -1)
    ev = events[0]
    assert ev.logprobs[0] is None and ev.top[0] is None and len(ev.logprobs) == len(prompt)
    for i in range(1, len(prompt)):
        assert ev.logprobs[i] == pytest.approx(logp[i - 1, prompt[i]].item(), abs=1e-4)
        assert [t for t, _ in ev.top[i]] == logp[i - 1].topk(3).indices.tolist()


def test_block_manager_reserves_grows_and_releases_by_hand_counts():
    """A pool of 9 blocks (8 usable) of 4 positions: hand-counted reservations, growth and release."""
    from types import SimpleNamespace

    from cookmind.infer.block_manager import BlockManager
    from cookmind.infer.paged_cache import PagedKVCache

    manager = BlockManager(PagedKVCache(1, 9, 4, 1, 2, num_rows=2, max_seq_len=32), max_seq_len=32)

    def request(slot, prompt_len, max_new):
        return SimpleNamespace(
            prompt_ids=[1] * prompt_len,
            max_new_tokens=max_new,
            prompt_logprobs=None,
            slot=slot,
            blocks=[],
            reserved_blocks=0,
        )

    a, b = request(0, 6, 7), request(1, 3, 10)  # 13 positions -> 4 blocks; 13 -> 4 blocks
    manager.check_fits(a)
    manager.check_fits(b)
    assert (a.reserved_blocks, b.reserved_blocks) == (4, 4)
    assert manager.try_reserve(a) and manager.try_reserve(b) and manager.unreserved == 0
    c = request(0, 1, 1)
    manager.check_fits(c)
    assert not manager.try_reserve(c)  # nothing left to promise
    manager.grow(a, 5)  # positions 0..5 need 2 blocks
    assert len(a.blocks) == 2 and manager.accounting()["kv_blocks_free"] == 6
    manager.release(a)
    assert a.blocks == [] and manager.unreserved == 4 and manager.accounting()["kv_blocks_free"] == 8
    with pytest.raises(ValueError, match="can fill 8 KV blocks but the pool holds 4"):
        BlockManager(PagedKVCache(1, 5, 4, 1, 2, num_rows=1, max_seq_len=32), 32).check_fits(request(0, 20, 20))
