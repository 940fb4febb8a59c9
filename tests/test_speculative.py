"""Speculative decoding in the engine (#19 item 3): greedy output equals plain decoding token for token, with the
n-gram proposer and with draft models (the target itself accepts everything, a random one still changes nothing),
across stop tokens, max_new_tokens, the context's end, the prefix cache and mixed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lm_fixtures import sharp_tiny_lm, tiny_lm
from test_prefix_cache import check_accounting

from cookmind.infer import generate
from cookmind.infer.cuda_graphs import CudaGraphVerifier
from cookmind.infer.engine import Engine, TokenEvent
from cookmind.infer.sampling import SamplingParams
from cookmind.infer.speculative import NgramIndex, SpeculativeConfig, load_draft_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

CTX = 64
# prompts of different lengths, some repeating themselves (the n-gram proposer finds matches there)
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7],
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 11, 12, 13],
    [40, 3],
    [30, 31, 32, 30, 31, 32, 30, 31, 32, 30, 31, 33, 34, 35, 36, 37, 38, 30, 31],
    [70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 70, 71, 72],
]
LENS = [20, 13, 30, 9, 25]


@pytest.fixture(scope="module")
def model():
    return sharp_tiny_lm()


def plain(model, prompt, params):
    """The reference: the plain decoding loop over the model's own KV cache, one prompt at a time."""
    return generate(model, [prompt], params, engine="builtin", keep_stop_token=True)[0]


def run(eng, prompts, params_list):
    reqs = [eng.submit(p, params) for p, params in zip(prompts, params_list)]
    eng.run_until_idle()
    outs = []
    for req in reqs:
        outs.append([ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)])
        if req.stop_token is not None:
            outs[-1].append(req.stop_token)
    return outs, reqs


def engine(model, spec, **kw):
    kw = dict(num_slots=3, max_seq_len=CTX, block_size=4, prefill_chunk=16, kv_budget_bytes=64 * 1024) | kw
    return Engine(model, speculative=spec, **kw)


def naive_lookup(seq, k, lo, hi):
    """Longest suffix (hi down to lo) that occurred earlier; the k tokens after its latest earlier occurrence that
    has k tokens after it, else after its earliest."""
    n = len(seq)
    for size in range(min(hi, n - 1), lo - 1, -1):
        suffix = seq[n - size :]
        starts = [i for i in range(n - size) if seq[i : i + size] == suffix]
        if starts:
            full = [i for i in starts if i + size + k <= n]
            start = full[-1] if full else starts[0]
            return seq[start + size : start + size + k]
    return []


def lookup(seq, k, lo, hi):
    index = NgramIndex((lo, lo - 1))
    index.extend(seq)
    return index.lookup(k, lo, hi)


def test_ngram_index_matches_a_naive_search_as_the_sequence_grows():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        seq = rng.integers(0, int(rng.integers(2, 6)), size=n).tolist()
        k, lo = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 4))
        index = NgramIndex((lo, lo - 1))
        for i in range(n):  # one token at a time, as decoding extends it
            index.extend(seq[i : i + 1])
            prefix = seq[: i + 1]
            assert index.lookup(k, lo, hi) == naive_lookup(prefix, k, lo, hi), (prefix, k, lo, hi)
            if lo > 1:  # may_propose's question: did the last lo - 1 tokens occur before, with a token after?
                assert bool(index.earlier_ends(lo - 1)) == bool(naive_lookup(prefix, 1, lo - 1, lo - 1)), prefix
    assert lookup([1, 2, 3, 9, 1, 2], 3, 2, 3) == [3, 9, 1]
    assert lookup([7, 5, 5, 5, 5, 5], 3, 2, 2) == [5, 5, 5]  # not the latest match's one token
    assert lookup([1, 2, 3, 9, 4, 2], 3, 2, 3) == []  # only a 1-token suffix occurred before


@pytest.mark.parametrize(
    "prefix_cache,graphs,slots", [(False, False, 3), (True, False, 3), (False, True, 3), (False, True, 1)]
)
def test_ngram_greedy_equals_plain_decoding(model, prefix_cache, graphs, slots):
    """graphs: the CUDA-graph decoder's state (run eagerly on CPU) and overlapped steps, for the steps where a
    request finds no n-gram and decodes plainly between speculative steps (alone in its batch: slots=1)."""
    params = [SamplingParams(temperature=0, max_new_tokens=n) for n in LENS]
    want = [plain(model, p, sp) for p, sp in zip(PROMPTS, params)]
    spec = SpeculativeConfig("ngram", num_tokens=4, ngram_min=1 + graphs, ngram_max=3)
    eng = engine(model, spec, prefix_cache=prefix_cache, cuda_graphs=graphs, overlap=graphs, num_slots=slots)
    got, _ = run(eng, PROMPTS, params)
    assert got == want
    m = eng.metrics()
    assert m["spec_accepted_tokens_total"] > 0  # drafts were taken ...
    assert m["spec_accepted_tokens_total"] < m["spec_draft_tokens_total"]  # ... and some were rejected
    assert m["spec_acceptance_rate"] == m["spec_accepted_tokens_total"] / m["spec_draft_tokens_total"]
    assert m["spec_tokens_per_step"] == pytest.approx(m["spec_mean_accepted_per_step"] + 1)
    assert m["generated_tokens_total"] == sum(LENS)
    if prefix_cache:  # a second wave reuses the cached prompt blocks: verification wrote none of them
        reqs = [eng.submit(p, sp) for p, sp in zip(PROMPTS, params)]
        while eng.has_work():
            eng.step()
            check_accounting(eng)
            for r in eng.slots:  # never more blocks than the request's prompt and max_new_tokens can fill
                assert r is None or len(r.blocks) <= eng.blocks.blocks_needed(len(r.prompt_ids), r.max_new_tokens)
        again = [[ev.token_id for ev in r.events(timeout=0) if isinstance(ev, TokenEvent)] for r in reqs]
        assert again == want and sum(r.cached_tokens for r in reqs) > 0
    kv = eng.kv_blocks()
    assert kv["kv_blocks_unreserved"] == kv["kv_blocks_total"]  # every reservation came back


def test_stop_tokens_and_the_context_end_cut_where_plain_decoding_does(model):
    spec = SpeculativeConfig("ngram", num_tokens=5, ngram_min=1, ngram_max=2)
    base = [plain(model, p, SamplingParams(temperature=0, max_new_tokens=30)) for p in PROMPTS[:3]]
    # a stop token from the middle of each plain output (it may occur earlier too: the first one stops it)
    params = [SamplingParams(temperature=0, max_new_tokens=30, stop_token_ids=(out[12],)) for out in base]
    want = [plain(model, p, sp) for p, sp in zip(PROMPTS[:3], params)]
    got, reqs = run(engine(model, spec), PROMPTS[:3], params)
    assert got == want and all(r.finish_reason == "stop" for r in reqs)
    # long prompts that reach the end of a 48-token context part-way through a step
    short_ctx = [p * 2 for p in PROMPTS[:3]]
    params = [SamplingParams(temperature=0, max_new_tokens=40)] * 3
    want = [plain(model, p, sp)[: 48 - len(p)] for p, sp in zip(short_ctx, params)]
    got, reqs = run(engine(model, spec, max_seq_len=48), short_ctx, params)
    assert got == want and all(r.finish_reason == "length" for r in reqs)


def test_a_draft_that_is_the_target_accepts_everything(model):
    params = [SamplingParams(temperature=0, max_new_tokens=n) for n in LENS]
    want = [plain(model, p, sp) for p, sp in zip(PROMPTS, params)]
    eng = engine(model, SpeculativeConfig("draft", num_tokens=3, draft_model=model), prefix_cache=True)
    got, _ = run(eng, PROMPTS, params)
    assert got == want
    m = eng.metrics()
    assert m["spec_draft_tokens_total"] > 0 and m["spec_acceptance_rate"] == 1.0


def test_a_random_draft_model_changes_nothing(model):
    torch.manual_seed(1)
    draft = tiny_lm(vocab_size=97, num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1)
    params = [SamplingParams(temperature=0, max_new_tokens=n) for n in LENS]
    want = [plain(model, p, sp) for p, sp in zip(PROMPTS, params)]
    for kv_cache in ("paged", "slots"):
        eng = engine(model, SpeculativeConfig("draft", num_tokens=4, draft_model=draft.eval()), kv_cache=kv_cache)
        got, _ = run(eng, PROMPTS, params)
        assert got == want, kv_cache
        assert eng.metrics()["spec_acceptance_rate"] < 1
    assert sum(eng.spec.proposer.blocks, []) == []  # the draft's blocks went back when its requests ended


def test_a_step_drafts_num_tokens_and_emits_one_more(model):
    """num_tokens is k, the drafts per step: a draft model that is the target accepts all k and the step emits k + 1
    tokens (the first token comes from prefill; 20 more in 5 steps of 4)."""
    params = SamplingParams(temperature=0, max_new_tokens=21)
    eng = engine(model, SpeculativeConfig("draft", num_tokens=3, draft_model=model), num_slots=1)
    got, _ = run(eng, PROMPTS[:1], [params])
    assert got == [plain(model, PROMPTS[0], params)]
    m = eng.metrics()
    assert m["spec_draft_tokens_total"] == 15 and m["spec_tokens_per_step"] == 4


@pytest.mark.parametrize(
    "method,kv_cache,attention",
    [("ngram", "paged", "auto"), ("draft", "paged", "auto"), ("ngram", "slots", "auto"), ("ngram", "paged", "kernel")],
)
def test_the_graph_path_run_eagerly_equals_the_eager_path(model, method, kv_cache, attention):
    """cuda_graphs=True on CPU runs the code the graphs capture (slots 0..B-1, every row padded to k + 1 tokens, the
    draft model's feed and k - 1 steps in one call) with capture=False: the same tokens and the same drafts as
    the eager path, and plain decoding's tokens. attention="kernel": the verify forwards attend through the paged
    decode kernel (its PyTorch twin on CPU), so the verifier needs no length buckets."""
    draft = tiny_lm(vocab_size=97, num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1)
    spec = SpeculativeConfig(method, num_tokens=4, ngram_min=1, draft_model=draft.eval() if method == "draft" else None)
    params = [SamplingParams(temperature=0, max_new_tokens=n) for n in LENS]
    want = [plain(model, p, sp) for p, sp in zip(PROMPTS, params)]
    results = []
    for graphs in (False, True):
        eng = engine(model, spec, cuda_graphs=graphs, kv_cache=kv_cache, decode_attention=attention)
        calls = []
        assert (eng.spec.verifier is not None) == graphs
        assert eng.runner.kernel_reads(spec.num_tokens + 1) == (attention == "kernel")
        if graphs and attention == "kernel":
            assert eng.spec.verifier.length_buckets == [CTX]
        if graphs:  # the graph path is the one taken, uncaptured on CPU
            assert not eng.spec.verifier.capture and not eng.spec.verifier.graphs
            verify = eng.spec.verifier.verify
            eng.spec.verifier.verify = lambda *a: calls.append(1) or verify(*a)
            if method == "draft":
                assert eng.spec.proposer.graphs is not None
                propose = eng.spec.proposer.graphs.propose
                eng.spec.proposer.graphs.propose = lambda *a: calls.append(2) or propose(*a)
        got, _ = run(eng, PROMPTS, params)
        assert got == want, graphs
        m = eng.metrics()
        results.append((m["spec_draft_tokens_total"], m["spec_accepted_tokens_total"], m["spec_tokens_per_step"]))
        if graphs:
            assert calls.count(1) > 0 and (method == "ngram" or calls.count(2) > 0)
    assert results[0] == results[1] and results[0][1] > 0


def test_the_graphed_forwards_never_read_the_device_on_the_host(model):
    """What a CUDA graph captures must not copy a device value to the host (item, nonzero, masked_select, a tensor of
    repeats) nor a host value to the device (torch.tensor): every aten op the verify and draft steps run, recorded
    on CPU, is free of those."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func.name())
            return func(*args, **(kwargs or {}))

    draft = tiny_lm(vocab_size=97, num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1)
    spec = SpeculativeConfig("draft", num_tokens=3, draft_model=draft.eval())
    eng = engine(model, spec, cuda_graphs=True)
    syncing = {"_local_scalar_dense", "item", "nonzero", "masked_select", "lift_fresh", "_unique2", "unique_dim"}
    for steps in (eng.spec.verifier, eng.spec.proposer.graphs):
        with torch.inference_mode(), Ops() as ops:
            steps._run(2, CTX)
        assert "aten::scaled_dot_product_attention" in ops.seen  # the recording saw the forward
        assert {n.split("::")[1].split(".")[0] for n in ops.seen}.isdisjoint(syncing), ops.seen
        assert "aten::repeat_interleave.Tensor" not in ops.seen  # (int repeats expand on the device)


@pytest.mark.parametrize(
    "device,graphs", [("cpu", False), ("cpu", True), pytest.param("cuda", None, marks=pytest.mark.gpu)]
)
def test_speculation_serves_each_rows_lora_adapter(tmp_path, device, graphs):
    """One batch mixing two adapters and the base, with n-gram drafts: each request's greedy tokens equal its merged
    model's (a full-recompute loop, test_multi_lora's reference), and equal the same engine's without speculation.
    graphs=True on CPU: the graph path run eagerly; on CUDA (float32) the verify graphs are captured and replayed,
    the adapter of each row read from the device inside them."""
    import copy

    from test_multi_lora import NEW, _adapter, _reference

    from cookmind.infer.loading import load_adapters

    base = sharp_tiny_lm()
    refs = {
        None: base,
        "chef": _adapter(base, tmp_path / "chef", 1, r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"]),
        "baker": _adapter(base, tmp_path / "baker", 2, r=2, alpha=4.0, targets=["o_proj", "up_proj"]),
    }
    jobs = [(PROMPTS[3], "chef"), (PROMPTS[0], None), (PROMPTS[4], "baker"), (PROMPTS[1], "chef")]
    n = 4 * NEW
    want = [_reference(refs[a], p, n)[0] for p, a in jobs]
    assert len({tuple(w) for w in want[:3]}) == 3
    params = SamplingParams(temperature=0, max_new_tokens=n)
    outs = []
    for spec in (None, SpeculativeConfig("ngram", num_tokens=3, ngram_min=1, ngram_max=3)):
        adapters = load_adapters(base, {"chef": tmp_path / "chef", "baker": tmp_path / "baker"})
        eng = engine(copy.deepcopy(base).to(device), spec, num_slots=4, adapters=adapters, cuda_graphs=graphs)
        if spec is not None and device == "cuda":
            assert eng.spec.verifier.capture and eng.spec.verifier.graphs and eng.runner.compile_error is None
        reqs = [eng.submit(p, params, adapter=a) for p, a in jobs]
        eng.run_until_idle()
        outs.append([[e.token_id for e in r.events(timeout=0) if isinstance(e, TokenEvent)] for r in reqs])
        if spec is not None:
            assert eng.metrics()["spec_accepted_tokens_total"] > 0
    assert outs[0] == want and outs[1] == want


def test_greedy_and_sampled_requests_speculate_in_one_step(model):
    """With sampled=True a step verifies greedy and sampled rows together: each accepts against its own drafts
    (the greedy rows still equal plain decoding). The graph path (run eagerly) accepts greedy rows on the device
    and sampled ones on the host, from the same draws: the same tokens as the eager path."""
    spec = SpeculativeConfig("ngram", num_tokens=3, ngram_min=1, ngram_max=3, sampled=True)
    outs = []
    for graphs in (False, True):
        params = [
            SamplingParams(temperature=0.9, seed=1, max_new_tokens=20),
            SamplingParams(temperature=0, max_new_tokens=20),
            SamplingParams(temperature=0.9, seed=2, max_new_tokens=20),
        ]
        eng = engine(model, spec, cuda_graphs=graphs)
        got, _ = run(eng, [PROMPTS[3], PROMPTS[0], PROMPTS[4]], params)
        assert got[1] == plain(model, PROMPTS[0], params[1])
        assert all(len(g) == 20 for g in got) and eng.metrics()["spec_accepted_tokens_total"] > 0
        outs.append(got)
    assert outs[0] == outs[1]


def scripted(eng, drafts_for):
    """Make the engine's proposer draft drafts_for(req, k) for every request (and say a draft may always exist)."""
    proposer = eng.spec.proposer
    proposer.may_propose = lambda req: True
    proposer.propose = lambda reqs, ks: [drafts_for(r, k) if k else [] for r, k in zip(reqs, ks)]


@pytest.mark.parametrize("backoff_max", [0, 32])
def test_a_request_with_nothing_to_copy_keeps_its_overlapped_steps(model, backoff_max):
    """A proposer that never finds a draft though one may exist (ordinary text whose last tokens occurred before):
    with back-off the engine reads a step in flight for a proposal at most ceil(log2(48)) + 1 = 7 times in 48
    tokens (after waits of 1, 2, 4, ... tokens), not at every step (backoff_max=0); the output is plain decoding's."""
    params = SamplingParams(temperature=0, max_new_tokens=48)
    want = plain(model, PROMPTS[2], params)
    spec = SpeculativeConfig("ngram", num_tokens=4, backoff_max=backoff_max)
    eng = engine(model, spec, cuda_graphs=True, overlap=True, num_slots=1)
    scripted(eng, lambda r, k: [])
    got, _ = run(eng, PROMPTS[2:3], [params])
    assert got == [want]
    forced = eng.metrics()["spec_forced_reads_total"]
    assert forced <= 7 if backoff_max else forced >= 40


@pytest.mark.parametrize("backoff_max", [0, 32])
def test_rejected_drafts_back_off_and_a_kept_draft_ends_it(model, backoff_max):
    """Drafts that are all wrong for the first 24 tokens, then right: with back-off at most 5 verify steps reject
    everything (after waits of 1, 2, 4, 8 tokens), and from the first kept draft on the request verifies at every
    step again (each verify starts where the one before ended); the output is plain decoding's."""
    params = SamplingParams(temperature=0, max_new_tokens=48)
    want = plain(model, PROMPTS[2], params)
    vocab = model.config.vocab_size

    def drafts(req, k):
        right = want[len(req.output_ids) : len(req.output_ids) + k]
        return [(t + 1) % vocab for t in right] if len(req.output_ids) < 24 else right

    spec = SpeculativeConfig("ngram", num_tokens=4, backoff_max=backoff_max)
    eng = engine(model, spec, cuda_graphs=True, overlap=True, num_slots=1)
    scripted(eng, drafts)
    verified = []  # (tokens the request had, drafts kept) of each verify step
    eng.spec.proposer.verified = lambda req, a: verified.append((req.n_sampled, a))
    got, _ = run(eng, PROMPTS[2:3], [params])
    assert got == [want]
    first = next(i for i, (_, a) in enumerate(verified) if a > 0)
    if not backoff_max:
        assert first >= 20  # nearly every step verified a rejected draft
        return
    assert 2 <= first <= 5
    after = verified[first:]
    assert all(a > 0 for _, a in after) and len(after) > 1
    assert all(n2 == n1 + a1 + 1 for (n1, a1), (n2, _) in zip(after, after[1:]))


@pytest.mark.parametrize("slots", [1, 3])
def test_a_verify_keeps_the_decode_graphs_state_valid(model, slots):
    """Right drafts at every third token, none between (no back-off): plain steps follow verify steps over and over.
    The verify graph moves each row's place in the decode graph's state on the device, so the decoder loads its
    state from the host only when its batch changes (alone: once), every decode step finds each row's place where
    the host's count puts it, and the output is plain decoding's."""
    params = [SamplingParams(temperature=0, max_new_tokens=n) for n in (40, 30, 35)][:slots]
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1]][:slots]
    want = [plain(model, p, sp) for p, sp in zip(prompts, params)]

    def drafts(req, k):
        n = len(req.output_ids)
        return want[prompts.index(req.prompt_ids)][n : n + k] if n % 3 == 0 else []

    eng = engine(
        model,
        SpeculativeConfig("ngram", num_tokens=3, backoff_max=0),
        cuda_graphs=True,
        overlap=True,
        num_slots=slots,
    )
    scripted(eng, drafts)
    loads, stale = [], []
    load, decode = eng.graphs.load, eng.graphs.decode
    eng.graphs.load = lambda *a: loads.append(1) or load(*a)

    def checked_decode(b, length):  # each active row's place and write column, as a reload would set them
        for r in eng.slots:
            if r is not None and r.state == "decode" and r.id not in eng.spec.claimed:
                place = len(r.prompt_ids) + r.n_sampled - 1
                if eng.graphs.state[:2, r.slot].tolist() != [place, place]:
                    stale.append((r.slot, eng.graphs.state[:2, r.slot].tolist(), place))
        return decode(b, length)

    eng.graphs.decode = checked_decode
    got, _ = run(eng, prompts, params)
    assert got == want and not stale
    m = eng.metrics()
    assert m["spec_accepted_tokens_total"] > 10 and m["spec_tokens_per_step"] > 2
    if slots == 1:
        assert len(loads) == 1


@pytest.mark.parametrize("compiled", [False, True])
def test_the_verify_graph_accepts_on_the_device_as_by_hand(model, compiled):
    """The verify step's acceptance, bonus token and decode-state move, against hand-computed values: a forward whose
    argmax at each place is a fixed table; row 0 drafts all of it (keeps 3, bonus after them), row 1 the first
    two then a wrong one (keeps 2), row 2 is not judged (a sampled row), row 3 drafts one that is right, and its
    padding (token 0) equals the table after it but is never judged (keeps 1). compiled: the verifier of a compiled
    runner (the engine's on CUDA) runs the acceptance through torch.compile (one compiled region, not ~20 kernels)."""
    eng = engine(model, SpeculativeConfig("ngram", num_tokens=3), cuda_graphs=True, num_slots=4)
    v, vocab, w = eng.spec.verifier, model.config.vocab_size, 4
    if compiled:  # the runner's layers stay eager here (compute is replaced below): only the acceptance compiles
        eng.runner.compiled = True
        v = CudaGraphVerifier(eng.runner, w, [4], False, last_tok=eng._last_tok, decode_state=eng.graphs.state)
        torch._dynamo.reset()
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    table = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 0, 0, 0]])
    eng.runner.compute = lambda tokens, *a, **k: torch.nn.functional.one_hot(table[: tokens.shape[0]], vocab).float()
    rows = v.stage_rows(4)
    drafts = [[5, 6, 7], [9, 10, 99], [13, 14, 15], [17]]
    places = [10, 20, 30, 40]
    for i, (d, p) in enumerate(zip(drafts, places)):
        rows[i, 0] = 3
        rows[i, 1 : 1 + len(d)] = d
        rows[i, w : 2 * w] = range(p, p + w)
        rows[i, 2 * w : 2 * w + 1 + len(d)] = range(p, p + 1 + len(d))
        rows[i, 3 * w] = 0 if i == 2 else len(d)
    scratch = eng.runner.scratch_col
    with torch.inference_mode():
        eng._last_tok.copy_(torch.tensor([1, 2, 3, 4]))
        eng.graphs.state[:, :4] = torch.tensor([places, [10, scratch, 30, 40], [1, 0, 1, 1]])
    _, result = v.verify(4, 64)
    assert result[:, w].tolist() == [3, 2, 0, 1]
    assert result[:, :w].tolist() == table.tolist()
    assert eng._last_tok.tolist() == [8, 11, 3, 0]  # the table after the kept drafts; row 2 untouched
    assert eng.graphs.state[0, :4].tolist() == [14, 23, 30, 42]  # one past the kept drafts
    assert eng.graphs.state[1, :4].tolist() == [14, scratch, 30, 42]  # an inactive row keeps writing the scratch
    if compiled:  # compiled, not run eagerly after a compile failure
        assert eng.runner.compile_error is None
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames


def test_the_verifier_keeps_full_logits_only_for_speculative_sampling(model):
    """Greedy rows need only the argmax: without sampled=True the verify graph holds no (slots, k + 1, V) logits
    buffer, only its (slots, k + 2) result (the argmax at each place and the accepted count)."""
    for sampled in (False, True):
        eng = engine(model, SpeculativeConfig("ngram", num_tokens=4, sampled=sampled), cuda_graphs=True)
        v = eng.spec.verifier
        assert v.result.shape == (3, 6)
        if sampled:
            assert v.logits.shape == (3, 5, model.config.vocab_size)
        else:
            assert v.logits is None


def test_sampled_and_penalised_requests_decode_normally_in_the_same_steps(model):
    spec = SpeculativeConfig("ngram", num_tokens=4, ngram_min=1, ngram_max=3)
    params = [
        SamplingParams(temperature=0, max_new_tokens=20),
        SamplingParams(temperature=0.8, seed=3, max_new_tokens=20),
        SamplingParams(temperature=0, repetition_penalty=1.3, max_new_tokens=20),
        SamplingParams(temperature=0, logprobs=True, max_new_tokens=20),
    ]
    want, _ = run(engine(model, None, num_slots=4), PROMPTS[:4], params)
    eng = engine(model, spec, num_slots=4)
    got, _ = run(eng, PROMPTS[:4], params)
    assert got == want
    assert want[0] == plain(model, PROMPTS[0], params[0])
    assert eng.metrics()["spec_draft_tokens_total"] > 0


def test_bad_configs_are_refused(model):
    with pytest.raises(ValueError, match="num_tokens"):
        SpeculativeConfig("ngram", num_tokens=0)
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig("medusa")
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig("draft")
    big = tiny_lm(vocab_size=200)
    with pytest.raises(ValueError, match="vocabulary"):
        engine(model, SpeculativeConfig("draft", draft_model=big))


def test_a_draft_checkpoint_with_another_tokenizer_is_refused(tmp_path, tok_dir):
    from cookmind.model import save_model
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, TokenizerError, train_bpe

    ckpt = save_model(tmp_path / "draft", tiny_lm(vocab_size=320))
    Tokenizer.load(tok_dir).save(ckpt)  # the draft was trained with tok_dir's tokenizer
    (tmp_path / "other.txt").write_text("numbers like 12 and 345 add up: 12 + 345 = 357. " * 30)
    vocab, merges = train_bpe(tmp_path / "other.txt", 275, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    other = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    with pytest.raises(TokenizerError, match="draft model"):
        load_draft_model(ckpt, other)
    assert load_draft_model(ckpt, Tokenizer.load(tok_dir)).config.vocab_size == 320


def test_a_draft_checkpoint_without_a_tokenizer_and_a_smaller_vocabulary_is_refused(tmp_path, tok_dir):
    # a draft folder with no tokenizer files (nothing to compare) and 300 tokens for a 320-token tokenizer was
    # accepted: the server started, and every greedy request then failed with a 500 (IndexError: index 301 is out of
    # bounds for dimension 0 with size 300), the draft unable to read the model's tokens
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    ckpt = save_model(tmp_path / "draft", tiny_lm(vocab_size=300))
    with pytest.raises(ValueError, match=r"300 tokens, fewer than the 320 of the model's tokenizer.*--draft-model"):
        load_draft_model(ckpt, tok)
    ckpt = save_model(tmp_path / "fits", tiny_lm(vocab_size=320))  # no tokenizer either, but every id fits
    assert load_draft_model(ckpt, tok).config.vocab_size == 320


def test_serve_with_speculation_answers_as_plain_decoding_and_reports_metrics(tmp_path, tok_dir):
    import argparse

    import httpx
    import openai
    from test_server import LiveServer

    from cookmind.cli import finish_model_argument
    from cookmind.infer import cli_serve
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    model = sharp_tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=128)
    with torch.no_grad():  # end-of-text and end-of-turn never win: long answers
        model.lm_head.weight[[tok.eos_id, tok.im_end_id]] = -1e3 * model.lm_head.weight.abs().max()
    ckpt = save_model(tmp_path / "cook", model)
    tok.save(ckpt)

    def parse(*argv):
        parser = argparse.ArgumentParser()
        cli_serve.add_arguments(parser)
        args = parser.parse_args([str(a) for a in argv])
        finish_model_argument(parser, args)
        return args

    with pytest.raises(ValueError, match="--draft-model"):
        cli_serve.build_app(parse(ckpt, "--device", "cpu", "--speculative", "draft"))
    with pytest.raises(ValueError, match="--speculative draft"):
        cli_serve.build_app(parse(ckpt, "--device", "cpu", "--draft-model", ckpt))
    args = parse(ckpt, "--device", "cpu", "--max-batch", "2", "--speculative", "ngram", "--num-speculative-tokens", "3")
    app, eng = cli_serve.build_app(args)
    assert eng.spec is not None and eng.spec.config.num_tokens == 3
    prompt = "The cook stirs the soup. The cook stirs the soup. The cook"
    want = plain(model, tok.encode(prompt), SamplingParams(temperature=0, max_new_tokens=24))
    server = LiveServer(app)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        out = client.completions.create(model="cook", prompt=prompt, max_tokens=24, temperature=0)
        assert out.choices[0].text == tok.decode(want)
        metrics = httpx.get(server.url + "/metrics").text
        assert "cookmind_spec_acceptance_rate" in metrics and "cookmind_spec_draft_tokens_total" in metrics
    finally:
        server.close()
    # the draft model given by path goes through the tokenizer check and is used
    _, eng = cli_serve.build_app(
        parse(ckpt, "--device", "cpu", "--max-batch", "1", "--speculative", "draft", "--draft-model", ckpt)
    )
    assert eng.spec.config.method == "draft" and eng.spec.config.draft_model is not None


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["ngram", "draft", "random-draft"])
def test_on_cuda_speculation_equals_the_plain_engine(method):
    """CUDA graphs, compiled layers and the paged decode kernel in the plain steps and in the verify forward (one
    query per token), itself replayed from CUDA graphs like the draft model's steps (float32: bf16 rounding may flip
    a near-tie between the two paths)."""
    model = sharp_tiny_lm(hidden_size=64, intermediate_size=128).cuda()
    draft = {"ngram": None, "draft": model}.get(method)
    if method == "random-draft":  # rejects most drafts: the draft graph's one-token feeds
        torch.manual_seed(1)
        draft = tiny_lm(vocab_size=97, num_hidden_layers=1, hidden_size=32, num_attention_heads=2).cuda().eval()
    method = "ngram" if draft is None else "draft"
    spec = SpeculativeConfig(method, num_tokens=4, ngram_min=2, draft_model=draft)
    params = [SamplingParams(temperature=0, max_new_tokens=n) for n in LENS]
    mixed = params[:4] + [SamplingParams(temperature=0.7, seed=5, max_new_tokens=LENS[4])]
    want, _ = run(engine(model, None), PROMPTS, mixed)
    eng = engine(model, spec, prefix_cache=True)
    assert eng.spec.verifier.capture and len(eng.spec.verifier.graphs) > 0  # the verify forwards replay graphs
    assert eng.runner.decode_attention == "kernel" and eng.spec.verifier.length_buckets == [CTX]  # any length
    if method == "draft":  # and so do the draft model's k steps
        assert eng.spec.proposer.graphs.capture and len(eng.spec.proposer.graphs.graphs) > 0
    got, _ = run(eng, PROMPTS, mixed)
    assert got == want
    assert eng.runner.compile_error is None
    assert want[:4] == [plain(model, p, sp) for p, sp in zip(PROMPTS[:4], params[:4])]
    assert eng.metrics()["spec_accepted_tokens_total"] > 0


def chi2_bound(df: int, z: float = 3.09) -> float:
    """The 0.999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty)."""
    c = 2 / (9 * df)
    return df * (1 - c + z * c**0.5) ** 3


def test_speculative_sampling_draws_from_the_target_distribution():
    """2000 seeded requests sampled with n-gram drafts (kept or rejected at random) against the exact joint
    distribution of their 3 tokens, computed from the model's plain forward with temperature and top-k by hand."""
    torch.manual_seed(3)
    model = tiny_lm(vocab_size=5).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6)  # distributions neither flat nor one-hot
    prompt, temperature, top_k = [0, 1, 2, 3, 4, 0, 1], 0.8, 4
    with torch.no_grad():  # every (t1, t2) continuation, one forward: log p of t1, t2, t3
        seqs = torch.tensor([prompt + [a, b] for a in range(5) for b in range(5)])
        logits = model(seqs).logits[:, -3:].double() / temperature
    logits = logits.masked_fill(logits < logits.topk(top_k, dim=-1).values[..., -1:], float("-inf"))
    p = logits.softmax(-1).view(5, 5, 3, 5)  # [t1, t2, place, token]
    exact = {
        (a, b, c): float(p[0, 0, 0, a] * p[a, 0, 1, b] * p[a, b, 2, c])
        for a in range(5)
        for b in range(5)
        for c in range(5)
    }
    n = 2000
    spec = SpeculativeConfig("ngram", num_tokens=2, ngram_min=1, ngram_max=2, sampled=True)
    eng = Engine(model, num_slots=128, max_seq_len=16, block_size=4, max_waiting=n, speculative=spec)
    params = [SamplingParams(temperature=temperature, top_k=top_k, max_new_tokens=3, seed=i) for i in range(n)]
    outs, _ = run(eng, [prompt] * n, params)
    m = eng.metrics()
    assert 0 < m["spec_accepted_tokens_total"] < m["spec_draft_tokens_total"]  # drafts kept and rejected
    counts: dict = {}
    for o in outs:
        counts[tuple(o)] = counts.get(tuple(o), 0) + 1
    assert set(counts) <= {k for k, v in exact.items() if v > 0}
    big = [k for k, v in exact.items() if v * n >= 5]  # cells expected 5+ times; the rest pooled into one
    observed = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    expected = [exact[k] * n for k in big] + [n - sum(exact[k] * n for k in big)]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    assert stat < chi2_bound(len(observed) - 1), (stat, len(observed))
