"""Prefix caching in the paged KV cache: the same tokens and logprobs as without it, honest block
accounting, LRU eviction, and prompt tokens that are really not computed again."""

from __future__ import annotations

import pytest
from lm_fixtures import sharp_tiny_lm

from cookmind.infer import generate
from cookmind.infer.engine import Engine, PromptLogprobsEvent, TokenEvent
from cookmind.infer.paged_cache import BlockAllocator
from cookmind.infer.prefix_cache import ROOT_KEY, PrefixCache, chain_keys
from cookmind.infer.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

BS = 4
SYSTEM = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19, 71, 69]  # 22: 5 full blocks
TAILS = [[5, 9, 11], [7, 7], [42, 1, 2, 3, 4, 5, 6], [8], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69]]
PROMPTS = [SYSTEM + t for t in TAILS] + [SYSTEM[:20], SYSTEM[:12] + [1, 2]]  # one whole-block prompt, one shorter
LENS = [6, 9, 4, 11, 5, 7, 8]


def engine(model, prefix, **kw):
    kw = dict(num_slots=2, max_seq_len=64, block_size=BS, prefill_chunk=8, kv_budget_bytes=60 * 1024) | kw
    return Engine(model, prefix_cache=prefix, **kw)


def tokens(req):
    return [ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)]


def check_accounting(eng):
    """free + cached (idle) + used == total; refcounts == the running requests that hold each cached block;
    a block is shared only when it is cached; promised blocks never exceed the pool."""
    kv = eng.kv_blocks()
    assert kv["kv_blocks_free"] + kv["kv_blocks_cached"] + kv["kv_blocks_used"] == kv["kv_blocks_total"]
    running = [r for r in eng.slots if r is not None]
    held = [b for r in running for b in r.blocks]
    assert kv["kv_blocks_used"] == len(set(held))
    pc = eng.prefix
    for bid, entry in pc._entries.items():
        assert entry.refcount == sum(bid in r.blocks for r in running)
        assert (entry.refcount == 0) == (bid in pc._idle)
    for b in set(held):
        if held.count(b) > 1:
            assert pc.is_cached(b)
    free = set(eng.runner.cache.allocator._free)
    assert not free & set(held) and not free & set(pc._idle)
    promised = pc.num_held + sum(r.reserved_blocks for r in running)
    assert kv["kv_blocks_unreserved"] == kv["kv_blocks_total"] - promised >= 0


def run_checked(eng):
    while eng.has_work():
        eng.step()
        check_accounting(eng)


def test_chain_keys_and_match_stop_at_the_first_difference_and_before_the_last_token():
    a, b = chain_keys(SYSTEM, BS, 5), chain_keys(SYSTEM[:8] + [0] + SYSTEM[9:], BS, 5)
    assert [k for k, _, _ in a[:2]] == [k for k, _, _ in b[:2]] and all(x[0] != y[0] for x, y in zip(a[2:], b[2:]))
    assert a[0][1] == ROOT_KEY and a[1][1] == a[0][0] and a[1][2] == tuple(SYSTEM[4:8])
    pc = PrefixCache(BlockAllocator(16), BS)
    blocks = [pc.allocate() for _ in range(5)]
    for bid, (key, parent, toks) in zip(blocks, a):
        assert pc.register(bid, key, parent, toks)
    assert pc.match(SYSTEM + [1]) == blocks  # 23 tokens: all 5 blocks
    assert pc.match(SYSTEM[:20]) == blocks[:4]  # 20 tokens = 5 full blocks, but the last token is computed
    assert pc.match(SYSTEM[:9] + [0] * 10) == blocks[:2]
    assert pc.match([1] + SYSTEM) == []


def test_a_hash_collision_is_caught_by_the_exact_check():
    pc = PrefixCache(BlockAllocator(8), BS)
    ((key, parent, _),) = chain_keys(SYSTEM, BS, 1)
    bid = pc.allocate()
    assert pc.register(bid, key, parent, (9, 9, 9, 9))  # a block whose key collides with SYSTEM's first
    assert pc.match(SYSTEM) == [] and pc.match([9, 9, 9, 9, 1]) == []  # the second: its own key differs
    assert not pc.register(pc.allocate(), key, parent, tuple(SYSTEM[:4]))  # the key is taken: stays private


def test_prefix_cache_needs_the_paged_layout():
    with pytest.raises(ValueError, match="paged"):
        Engine(sharp_tiny_lm(), num_slots=2, max_seq_len=32, kv_cache="slots", prefix_cache=True)


@pytest.mark.parametrize("mode,overlap", [("sequential", False), ("interleaved", False), ("interleaved", True)])
def test_greedy_and_seeded_outputs_equal_without_prefix_cache(mode, overlap):
    model = sharp_tiny_lm()
    params = [SamplingParams(temperature=0)] * 4 + [
        SamplingParams(temperature=0.9, top_p=0.9, seed=s) for s in (1, 2, 3)
    ]
    outs, engines = {}, {}
    for prefix in (False, True):
        # overlap: a decode step is launched before the last one's tokens are read, through the graph decoder's
        # eager steps (what CUDA runs, minus capture): finished requests release blocks with a step in flight
        eng = engines[prefix] = engine(model, prefix, overlap=overlap, cuda_graphs=overlap)
        reqs = []
        for p, n, sp in zip(PROMPTS, LENS, params):
            reqs.append(eng.submit(p, sp, n))
            if mode == "sequential":
                run_checked(eng) if prefix else eng.run_until_idle()
        run_checked(eng) if prefix else eng.run_until_idle()
        outs[prefix] = [tokens(r) for r in reqs]
    assert outs[True] == outs[False]
    assert outs[True][:4] == [
        generate(model, [p], SamplingParams(temperature=0, max_new_tokens=n))[0] for p, n in zip(PROMPTS[:4], LENS[:4])
    ]
    m = engines[True].metrics()
    if mode == "sequential":  # after the first: SYSTEM's 5 blocks four times, 4 (20-token prompt: its last
        # block is recomputed), 3 (12 shared tokens)
        assert m["prefix_cache_hit_tokens"] == BS * (5 + 5 + 5 + 5 + 4 + 3)
    else:  # two rows: later requests hit the blocks the first ones registered after prefill
        assert m["prefix_cache_hit_tokens"] > 0
    assert m["prefix_cache_queries"] == len(PROMPTS)
    kv = engines[True].kv_blocks()  # every block returned: free or cached, none used, all promisable
    assert kv["kv_blocks_used"] == 0 and kv["kv_blocks_unreserved"] == kv["kv_blocks_total"]
    assert kv["kv_blocks_free"] + kv["kv_blocks_cached"] == kv["kv_blocks_total"] and kv["kv_blocks_cached"] > 0


def test_a_hit_skips_the_cached_tokens_compute():
    model = sharp_tiny_lm()
    counted = []  # tokens through the embedding: every token the model processes passes there once
    hook = model.model.embed_tokens.register_forward_hook(lambda m, inp, out: counted.append(inp[0].numel()))
    try:
        per_engine = {}
        for prefix in (False, True):
            eng = engine(model, prefix, num_slots=1)
            first = eng.submit(PROMPTS[0], SamplingParams(temperature=0), 3)
            eng.run_until_idle()
            counted.clear()
            second = eng.submit(PROMPTS[1], SamplingParams(temperature=0), 3)
            eng.run_until_idle()
            per_engine[prefix] = (sum(counted), tokens(first), tokens(second), second.cached_tokens)
    finally:
        hook.remove()
    # the second prompt (24 tokens) shares SYSTEM's 5 full blocks = 20 tokens with the first
    assert per_engine[False][0] == len(PROMPTS[1]) + 2  # prompt + two decode steps (the first token comes from prefill)
    assert per_engine[True][0] == per_engine[False][0] - 20 and per_engine[True][3] == 20
    assert per_engine[True][1:3] == per_engine[False][1:3]


def test_prompt_logprobs_equal_with_and_without_and_still_fill_the_cache():
    model = sharp_tiny_lm()
    results = {}
    for prefix in (False, True):
        eng = engine(model, prefix)
        warm = eng.submit(PROMPTS[0], SamplingParams(temperature=0), 2)  # caches SYSTEM
        eng.run_until_idle()
        scored = eng.submit(PROMPTS[2], SamplingParams(temperature=0), 4, prompt_logprobs=2)
        eng.run_until_idle()
        events = list(scored.events(timeout=0))
        ev = [e for e in events if isinstance(e, PromptLogprobsEvent)][0]
        out = [e.token_id for e in events if isinstance(e, TokenEvent)]
        after = eng.submit(PROMPTS[2], SamplingParams(temperature=0), 4)  # hits what the scored one registered
        eng.run_until_idle()
        results[prefix] = (ev, tokens(warm), out, tokens(after), scored.cached_tokens, after.cached_tokens)
    (ev0, *rest0), (ev1, *rest1) = results[False], results[True]
    assert ev1.logprobs[0] is None and ev1.logprobs[1:] == pytest.approx(ev0.logprobs[1:], abs=1e-5)
    assert [[t for t, _ in top] for top in ev1.top[1:]] == [[t for t, _ in top] for top in ev0.top[1:]]
    assert rest1[:3] == rest0[:3]
    assert rest1[3] == 0 and rest1[4] == BS * ((len(PROMPTS[2]) - 1) // BS)  # scored: no lookup; then all 7 blocks


def test_lru_eviction_under_a_small_pool_keeps_outputs_equal():
    model = sharp_tiny_lm()
    systems = [SYSTEM, [s + 1 for s in SYSTEM], [s + 2 for s in SYSTEM]]
    prompts = [systems[i % 3] + [i, i + 1] for i in range(7)] + [systems[0] + [9]]
    outs, engines = {}, {}
    for prefix in (False, True):
        # 18 usable blocks: a request can fill 24 + 6 = 30 positions = 8 blocks and leaves 6 cached, so the
        # third prefix already evicts the first one's tail
        eng = engines[prefix] = engine(model, prefix, num_slots=2, kv_budget_bytes=19 * 1024)
        reqs = []
        for p in prompts:
            reqs.append(eng.submit(p, SamplingParams(temperature=0), 6))
            run_checked(eng) if prefix else eng.run_until_idle()
        outs[prefix] = [tokens(r) for r in reqs]
    assert outs[True] == outs[False]
    m = engines[True].metrics()
    assert m["prefix_cache_evictions"] > 0 and m["prefix_cache_hit_tokens"] > 0
    kv = engines[True].kv_blocks()
    assert kv["kv_blocks_free"] + kv["kv_blocks_cached"] == kv["kv_blocks_total"] == 18


def test_eviction_takes_the_least_recently_used_chain_from_its_end():
    model = sharp_tiny_lm()
    eng = engine(model, True, num_slots=1, kv_budget_bytes=13 * 1024)  # 12 usable blocks
    a, b = SYSTEM[:12] + [1], [s + 1 for s in SYSTEM[:12]] + [1]  # 3 full blocks each
    for p in (a, b, a):  # a used last: b is the least recently used
        eng.submit(p, SamplingParams(temperature=0), 2)
        eng.run_until_idle()
    pc = eng.prefix
    b_blocks = pc.match(b)
    assert len(b_blocks) == 3 and len(pc.match(a)) == 3
    # 6 blocks free, 6 cached (idle, LRU order b3 b2 b1 a3 a2 a1); a fresh request that fills 28 + 4 = 32
    # positions = 8 blocks takes the 6 free ones, then evicts two
    fresh = [90 + i % 5 for i in range(28)]
    req = eng.submit(fresh, SamplingParams(temperature=0), 4)
    eng.run_until_idle()
    assert tokens(req) == generate(model, [fresh], SamplingParams(temperature=0, max_new_tokens=4))[0]
    assert eng.metrics()["prefix_cache_evictions"] == 2
    assert len(pc.match(a)) == 3  # the recently used chain survives
    assert pc.match(b) == b_blocks[:1]  # b lost its last two blocks, tail first


def test_a_failed_step_forgets_the_cache_and_returns_every_block():
    model = sharp_tiny_lm()
    eng = engine(model, True)
    eng.submit(PROMPTS[0], SamplingParams(temperature=0), 2)
    eng.run_until_idle()
    assert eng.kv_blocks()["kv_blocks_cached"] == 6
    forward = eng.runner.forward

    def failing(*args, **kwargs):  # a device error in the middle of a prefill
        eng.runner.forward = forward
        raise RuntimeError("injected failure")

    eng.runner.forward = failing
    eng.start()
    try:
        failed = eng.submit(PROMPTS[1], SamplingParams(temperature=0), 3)
        assert list(failed.events(timeout=30))[-1].reason == "error"
        kv = eng.kv_blocks()  # what the failed step wrote is not trusted: nothing cached, every block free
        assert kv["kv_blocks_cached"] == kv["kv_blocks_used"] == 0 and kv["kv_blocks_free"] == kv["kv_blocks_total"]
        again = eng.submit(PROMPTS[1], SamplingParams(temperature=0), 3)
        assert [e.token_id for e in again.events(timeout=30) if isinstance(e, TokenEvent)] == generate(
            model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=3)
        )[0]
        assert again.cached_tokens == 0
    finally:
        eng.stop()


@pytest.mark.gpu
def test_cuda_compiled_graphs_with_prefix_cache_equal_generate():
    """On CUDA with the serving defaults (compiled layers, CUDA graphs, overlapped steps): the same tokens
    with and without the prefix cache, and as generate(). Written without a GPU to run it on this session."""
    model = sharp_tiny_lm(hidden_size=64, intermediate_size=128, max_position_embeddings=256).cuda()
    system = [(7 * i + 3) % 97 for i in range(70)]  # 4 full 16-token blocks
    prompts = [system + [i, i + 1, i + 2] for i in range(6)] + [system[:64], system[:40]]
    outs, hits = {}, {}
    for prefix in (False, True):
        eng = Engine(model, num_slots=4, max_seq_len=160, prefix_cache=prefix)
        assert eng.graphs is not None and eng.runner.compiled and eng.overlap
        first = eng.submit(prompts[0], SamplingParams(temperature=0), 20)
        eng.run_until_idle()
        reqs = [first] + [eng.submit(p, SamplingParams(temperature=0), 20) for p in prompts[1:]]
        eng.run_until_idle()
        outs[prefix] = [tokens(r) for r in reqs]
        hits[prefix] = eng.metrics().get("prefix_cache_hit_tokens", 0)
        kv = eng.kv_blocks()
        assert kv["kv_blocks_unreserved"] == kv["kv_blocks_total"]
    assert outs[True] == outs[False]
    assert outs[True] == [generate(model, [p], SamplingParams(temperature=0, max_new_tokens=20))[0] for p in prompts]
    assert hits[True] == 16 * (4 * 5 + 3 + 2)  # five full hits, the 64-token prompt recomputes its last block
