"""On CUDA: decode steps replayed from CUDA graphs give the same tokens and logits as eager decoding."""

from __future__ import annotations

import pytest
import torch
from lm_fixtures import sharp_tiny_lm

from cookmind.infer import generate
from cookmind.infer.cuda_graphs import CudaGraphDecoder
from cookmind.infer.engine import Engine, TokenEvent
from cookmind.infer.runner import ModelRunner
from cookmind.infer.sampling import SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 11], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [42], [7, 7, 7, 7], [8, 1, 2]]


def tiny_cuda_model():
    return sharp_tiny_lm(hidden_size=64, intermediate_size=128).cuda()


def test_graph_replay_equals_eager_forward():
    model = tiny_cuda_model()
    runner = ModelRunner(model, num_slots=8, max_seq_len=32)
    last_tok = torch.zeros(8, dtype=torch.long, device="cuda")
    graphs = CudaGraphDecoder(runner, last_tok)
    for slot, seq in enumerate(PROMPTS):
        runner.forward(
            torch.tensor([seq], device="cuda"), torch.arange(len(seq), device="cuda")[None], slot, attn_len=len(seq)
        )
    b = len(PROMPTS)
    last_tok[:b] = torch.tensor([s[-1] for s in PROMPTS], device="cuda")
    graphs.load([len(s) for s in PROMPTS], [1] * b)
    seqs = [s + [s[-1]] for s in PROMPTS]
    for _ in range(3):  # 5 rows in the bucket of 8; the graph advances its own inputs between replays
        replayed = graphs.decode(b).clone()
        for slot, seq in enumerate(seqs):
            with torch.no_grad():
                ref = model(torch.tensor([seq], device="cuda")).logits[0, -1]
            torch.testing.assert_close(replayed[slot], ref, atol=2e-4, rtol=2e-4)
            seq.append(int(ref.argmax()))
        assert last_tok[:b].tolist() == [s[-1] for s in seqs]


@pytest.mark.parametrize("overlap", [True, False])
def test_engine_with_graphs_equals_generate(overlap):
    model = tiny_cuda_model()
    engine = Engine(model, num_slots=4, max_seq_len=48, cuda_graphs=True, overlap=overlap)
    assert engine.graphs is not None
    reqs = [engine.submit(p, SamplingParams(temperature=0), 9) for p in PROMPTS]
    engine.run_until_idle()
    for req, prompt in zip(reqs, PROMPTS):
        toks = [ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)]
        assert toks == generate(model, [prompt], SamplingParams(temperature=0, max_new_tokens=9))[0]


def long_cuda_model():
    return sharp_tiny_lm(hidden_size=64, intermediate_size=128, max_position_embeddings=256).cuda()


@pytest.mark.parametrize(
    "kv_cache,decode_attention,compile_attention",
    [("paged", "kernel", False), ("paged", "gather", False), ("slots", "gather", False), ("paged", "gather", True)],
)
def test_compiled_graphs_equal_generate(kv_cache, decode_attention, compile_attention):
    """Compiled layers captured in graphs, 16-token blocks, and (gather path) rows crossing the 64 -> 128
    length bucket; the paged decode kernel needs one graph per batch size."""
    model = long_cuda_model()
    engine = Engine(
        model,
        num_slots=4,
        max_seq_len=160,
        cuda_graphs=True,
        compile=True,
        kv_cache=kv_cache,
        compile_attention=compile_attention,
        decode_attention=decode_attention,
    )
    assert engine.runner.compiled and engine.runner.compile_error is None
    assert engine.runner.decode_attention == decode_attention
    assert engine.graphs.length_buckets == ([160] if decode_attention == "kernel" else [64, 128, 160])
    lens = [90, 70, 100, 85, 60]
    reqs = [engine.submit(p, SamplingParams(temperature=0), n) for p, n in zip(PROMPTS, lens)]  # 5 through 4 rows
    engine.run_until_idle()
    for req, prompt, n in zip(reqs, PROMPTS, lens):
        toks = [ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)]
        assert toks == generate(model, [prompt], SamplingParams(temperature=0, max_new_tokens=n))[0]
    if kv_cache == "paged":
        blocks = engine.kv_blocks()
        assert blocks["kv_blocks_free"] == blocks["kv_blocks_total"] == blocks["kv_blocks_unreserved"]


def test_compiled_logits_close_to_eager():
    model = long_cuda_model()
    eager = Engine(model, num_slots=2, max_seq_len=160, cuda_graphs=False, compile=False)
    fast = Engine(model, num_slots=2, max_seq_len=160, cuda_graphs=True, compile=True)
    outs = []
    for engine in (eager, fast):
        req = engine.submit(PROMPTS[1], SamplingParams(temperature=0, logprobs=True, top_logprobs=2), 20)
        engine.run_until_idle()
        outs.append([(ev.token_id, ev.logprob) for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)])
    assert [t for t, _ in outs[0]] == [t for t, _ in outs[1]]
    torch.testing.assert_close(
        torch.tensor([lp for _, lp in outs[1]]), torch.tensor([lp for _, lp in outs[0]]), atol=1e-3, rtol=1e-3
    )
