"""The continuous-batching engine against generate() (the model's own KV cache path)."""

from __future__ import annotations

import pytest
import torch
from lm_fixtures import sharp_tiny_lm

from cookmind.infer import generate
from cookmind.infer.engine import Engine, FinishEvent, QueueFullError, TokenEvent
from cookmind.infer.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


tiny_model = sharp_tiny_lm

PROMPTS = [[5, 9, 11], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [42], [7, 7, 7, 7]]


def collect(req):
    toks, fin = [], None
    for ev in req.events(timeout=0):
        if isinstance(ev, TokenEvent):
            toks.append(ev.token_id)
        else:
            fin = ev
    return toks, fin


@pytest.mark.parametrize("overlap,graphs", [(False, False), (True, False), (False, True), (True, True)])
def test_requests_join_and_leave_between_steps_greedy_equals_generate(overlap, graphs):
    """graphs=True on CPU runs the graph decoder's step eagerly: its self-advancing state is what is tested."""
    model = tiny_model()
    engine = Engine(model, num_slots=3, max_seq_len=48, prefill_chunk=4, overlap=overlap, cuda_graphs=graphs)
    lens = [6, 3, 9, 5]
    reqs = [engine.submit(PROMPTS[0], SamplingParams(temperature=0), lens[0])]
    engine.step()
    engine.step()
    reqs.append(engine.submit(PROMPTS[1], SamplingParams(temperature=0), lens[1]))  # joins mid-run, chunked
    engine.step()
    reqs += [engine.submit(p, SamplingParams(temperature=0), n) for p, n in zip(PROMPTS[2:], lens[2:])]
    engine.run_until_idle()  # 4 requests through 3 slots: the last waits for a slot to free
    for req, prompt, n in zip(reqs, PROMPTS, lens):
        toks, fin = collect(req)
        assert toks == generate(model, [prompt], SamplingParams(temperature=0, max_new_tokens=n))[0]
        assert fin.reason == "length"
    assert all(s is None for s in engine.slots)


@pytest.mark.parametrize("overlap", [False, True])
def test_stop_token_finishes_with_stop(overlap):
    model = tiny_model()
    free = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    engine = Engine(model, num_slots=2, max_seq_len=48, overlap=overlap)
    req = engine.submit(PROMPTS[1], SamplingParams(temperature=0), 8, stop_token_ids=[free[4]])
    engine.run_until_idle()
    toks, fin = collect(req)
    assert toks == free[: free.index(free[4])] and fin.reason == "stop"


@pytest.mark.parametrize("overlap", [False, True])
def test_cancel_frees_the_slot_for_the_next_request(overlap):
    model = tiny_model()
    engine = Engine(model, num_slots=1, max_seq_len=48, overlap=overlap)
    a = engine.submit(PROMPTS[0], SamplingParams(temperature=0), 40)
    b = engine.submit(PROMPTS[2], SamplingParams(temperature=0), 4)
    for _ in range(3):
        engine.step()
    assert engine.slots[0] is a and b.state == "waiting"
    engine.cancel(a)
    engine.step()  # a leaves, b takes its slot
    assert a.state == "done" and engine.slots[0] is b
    engine.run_until_idle()
    toks_a, fin_a = collect(a)
    toks_b, fin_b = collect(b)
    assert fin_a.reason == "cancelled" and len(toks_a) < 40
    assert toks_b == generate(model, [PROMPTS[2]], SamplingParams(temperature=0, max_new_tokens=4))[0]


def test_per_request_seed_is_independent_of_batch_companions():
    model = tiny_model()
    p = SamplingParams(temperature=1.0, top_k=20, seed=11)

    def run(with_companions, overlap=False):
        engine = Engine(model, num_slots=4, max_seq_len=48, overlap=overlap, cuda_graphs=overlap)
        if with_companions:
            engine.submit(PROMPTS[1], SamplingParams(temperature=0.7, top_p=0.8, seed=3), 10)
            engine.submit(PROMPTS[3], SamplingParams(temperature=0), 10)
        req = engine.submit(PROMPTS[0], p, 10)
        engine.run_until_idle()
        return collect(req)[0]

    assert run(False) == run(True) == run(True, overlap=True)
    assert (
        run(False)
        == generate(model, [PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=1.0, top_k=20, seed=11))[0]
    )


@pytest.mark.parametrize("overlap", [False, True])
def test_penalty_matches_generate(overlap):
    model = tiny_model()
    engine = Engine(model, num_slots=2, max_seq_len=48, overlap=overlap, cuda_graphs=overlap)
    req = engine.submit(PROMPTS[3], SamplingParams(temperature=0, repetition_penalty=3.0, frequency_penalty=1.0), 8)
    other = engine.submit(PROMPTS[0], SamplingParams(temperature=0), 8)
    engine.run_until_idle()
    ref = generate(
        model,
        [PROMPTS[3]],
        SamplingParams(temperature=0, max_new_tokens=8, repetition_penalty=3.0, frequency_penalty=1.0),
    )[0]
    assert collect(req)[0] == ref
    assert collect(other)[0] == generate(model, [PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=8))[0]


@pytest.mark.parametrize("overlap", [False, True])
def test_rows_joining_a_running_batch_bring_their_own_min_new_tokens_and_logprobs(overlap):
    """What a batch's rows ask for beyond sampling (min_new_tokens' ban, logprobs) is known per batch, not looked up
    per row every step: a request that joins a running batch gets it from its first token, and its companions never
    do."""
    model = tiny_model()
    greedy = SamplingParams(temperature=0)
    stop = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0][0]  # its first token
    engine = Engine(model, num_slots=3, max_seq_len=48, overlap=overlap, cuda_graphs=overlap)
    a = engine.submit(PROMPTS[0], greedy, 12)
    engine.step()
    engine.step()
    b = engine.submit(PROMPTS[1], SamplingParams(temperature=0, min_new_tokens=3), 8, stop_token_ids=[stop])
    c = engine.submit(PROMPTS[2], SamplingParams(temperature=0, logprobs=True), 4)
    engine.run_until_idle()
    ev_a, ev_b, ev_c = ([ev for ev in r.events(timeout=0) if isinstance(ev, TokenEvent)] for r in (a, b, c))
    banned = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=3, stop_token_ids=(stop,))
    want_b = generate(model, [PROMPTS[1]], banned, engine="builtin")[0]
    assert [ev.token_id for ev in ev_b] == want_b and len(want_b) >= 3
    for evs, prompt, n in ((ev_a, PROMPTS[0], 12), (ev_c, PROMPTS[2], 4)):
        alone = generate(model, [prompt], SamplingParams(temperature=0, max_new_tokens=n))[0]
        assert [ev.token_id for ev in evs] == alone
    assert len(ev_c) == 4 and all(ev.logprob is not None for ev in ev_c)
    assert all(ev.logprob is None for ev in ev_a + ev_b)


@pytest.mark.parametrize("graphs", [False, True])
def test_logprobs_equal_model_log_softmax(graphs):
    model = tiny_model()
    engine = Engine(model, num_slots=1, max_seq_len=48, cuda_graphs=graphs)
    req = engine.submit(PROMPTS[0], SamplingParams(temperature=0, logprobs=True, top_logprobs=3), 3)
    engine.run_until_idle()
    seq = list(PROMPTS[0])
    for ev in req.events(timeout=0):
        if isinstance(ev, FinishEvent):
            break
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1], -1)
        assert ev.logprob == pytest.approx(ref[ev.token_id].item(), abs=1e-4)
        assert [t for t, _ in ev.top_logprobs] == ref.topk(3).indices.tolist()
        seq.append(ev.token_id)


def test_queue_full_and_bad_prompts():
    engine = Engine(tiny_model(), num_slots=1, max_seq_len=16, max_waiting=2)
    engine.submit([1], None, 2)
    engine.submit([1], None, 2)
    with pytest.raises(QueueFullError):
        engine.submit([1], None, 2)
    with pytest.raises(ValueError, match="context"):
        engine.submit([1] * 16, None, 2)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.submit([1000], None, 2)


def test_background_thread_serves_requests():
    model = tiny_model()
    engine = Engine(model, num_slots=2, max_seq_len=48)
    engine.start()
    try:
        reqs = [engine.submit(p, SamplingParams(temperature=0), 5) for p in PROMPTS]
        outs = [[ev.token_id for ev in r.events(timeout=30) if isinstance(ev, TokenEvent)] for r in reqs]
    finally:
        engine.stop()
    assert outs == generate(model, PROMPTS, SamplingParams(temperature=0, max_new_tokens=5))
    assert engine.metrics()["generated_tokens_total"] == 20


@pytest.mark.parametrize("overlap,graphs", [(False, False), (True, False), (True, True)])
def test_slot_reused_after_a_stop_in_flight(overlap, graphs):
    """With overlap, the step after a stop token is already running when the stop is read; the next
    request in that slot must not see its leftovers."""
    model = tiny_model()
    free = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    engine = Engine(model, num_slots=1, max_seq_len=48, overlap=overlap, cuda_graphs=graphs)
    a = engine.submit(PROMPTS[1], SamplingParams(temperature=0), 8, stop_token_ids=[free[3]])
    b = engine.submit(PROMPTS[0], SamplingParams(temperature=0), 6)
    c = engine.submit(PROMPTS[3], SamplingParams(temperature=0), 5)
    engine.run_until_idle()
    assert collect(a)[0] == free[: free.index(free[3])]
    assert collect(b)[0] == generate(model, [PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=6))[0]
    assert collect(c)[0] == generate(model, [PROMPTS[3]], SamplingParams(temperature=0, max_new_tokens=5))[0]
