"""Structured outputs (constraints.py): grammars enforced in the engine's batched sampling, and response_format
through the real `openai` client on a loopback server.

The masks are checked against hand-computed token sets and against llguidance's own token-by-token verdicts;
the outputs are parsed with `json` and validated with `jsonschema`, both independent of our code.
"""

from __future__ import annotations

import json
import threading
import time

import jsonschema
import llguidance
import openai
import pytest
import torch
import uvicorn
from gloo_fixtures import find_free_port
from lm_fixtures import sharp_tiny_lm, tiny_lm
from structured_fixtures import RESPONSE_FORMAT, SCHEMA, VOCAB, YES_NO

from cookmind.infer import SamplingParams, generate
from cookmind.infer.constraints import GrammarMatcher, constrain_logits, grammar_for_response_format, ll_tokenizer
from cookmind.infer.engine import Engine
from cookmind.infer.server import create_app
from cookmind.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

MODEL = "tiny-json"


@pytest.fixture(scope="module")
def tok(tok_dir) -> Tokenizer:
    return Tokenizer.load(tok_dir)


def allowed_ids(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().flatten().tolist())


def prefixes_of(tok: Tokenizer, words: list[bytes]) -> set[int]:
    """Hand-computed reference: the ordinary tokens whose bytes start one of ``words``."""
    specials = set(tok.special_tokens.values())
    return {i for i, b in tok.vocab.items() if i not in specials and b and any(w.startswith(b) for w in words)}


def test_yes_no_mask_is_the_hand_computed_token_set(tok):
    m = GrammarMatcher(tok, VOCAB, YES_NO, [tok.eos_id])
    logits = torch.randn(1, VOCAB)
    assert allowed_ids(constrain_logits(logits, [m])[0]) == prefixes_of(tok, [b"yes", b"no"])
    assert m.consume(tok.encode("y")[0])
    # the rest, "es", is forced: llguidance allows only its canonical tokenization's first token (not "e" + "s")
    assert allowed_ids(constrain_logits(logits, [m])[0]) == {tok.encode("es")[0]}
    for t in tok.encode("es"):
        assert m.consume(t)
    assert m.is_accepting() and m.is_stopped()
    assert allowed_ids(constrain_logits(logits, [m])[0]) == {tok.eos_id}  # complete: only the end is allowed
    m.rollback(len(tok.encode("es")))
    assert allowed_ids(constrain_logits(logits, [m])[0]) == {tok.encode("es")[0]}


def test_schema_mask_equals_llguidance_token_by_token(tok):
    """Masked logits equal a naive mask: each token tried alone on llguidance's matcher; a free row is untouched, and
    a third row (two masks filled at once, in parallel) gets its own grammar's tokens."""
    grammar = grammar_for_response_format(RESPONSE_FORMAT)
    prefix = tok.encode('{"ok": true, "n": ')
    m = GrammarMatcher(tok, VOCAB, grammar, [tok.im_end_id])
    assert m.try_consume(prefix) == len(prefix)
    ref = llguidance.LLMatcher(ll_tokenizer(tok, VOCAB, [tok.im_end_id]), grammar)
    assert ref.try_consume_tokens(prefix) == len(prefix)
    expected = torch.full((VOCAB,), float("-inf"))
    logits = torch.randn(3, VOCAB)
    for t in range(VOCAB):
        if ref.try_consume_tokens([t]) == 1:
            expected[t] = logits[1, t]
            ref.rollback(1)
    out = constrain_logits(logits, [None, m, GrammarMatcher(tok, VOCAB, YES_NO, [tok.im_end_id])])
    assert torch.equal(out[0], logits[0])
    assert torch.equal(out[1], expected)
    assert allowed_ids(out[2]) == prefixes_of(tok, [b"yes", b"no"])
    # by hand: one digit 0..9, then the next key (properties in schema order) and a colour
    words = [
        bytes([d]) + b', "colour": "' + c + b'", "note": "' for d in b"0123456789" for c in (b"red", b"green", b"blue")
    ]
    assert allowed_ids(out[1]) == prefixes_of(tok, words)


def test_engine_batch_mixes_constrained_and_free_rows(tok):
    """One batch (graph decoder and overlap on, as on CUDA): the free row decodes exactly as alone (reference: the
    plain loop), the schema row validates, the yes/no row says yes or no."""
    model = sharp_tiny_lm(vocab_size=VOCAB, max_position_embeddings=256)
    prompt = tok.encode("The cook stirs the soup.")
    stop = (tok.eos_id,)
    free = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=stop)
    reference = generate(model, [prompt], free, tok, engine="builtin", keep_stop_token=True)[0]
    engine = Engine(model, num_slots=4, max_seq_len=256, tokenizer=tok, cuda_graphs=True, overlap=True)
    schema_grammar = grammar_for_response_format(RESPONSE_FORMAT)
    reqs = [
        engine.submit(prompt, free),
        engine.submit(prompt, free.replace(max_new_tokens=120, grammar=schema_grammar)),
        engine.submit(prompt, free.replace(temperature=1.0, seed=3, grammar=YES_NO)),
    ]
    engine.run_until_idle()
    assert reqs[0].output_ids + ([reqs[0].stop_token] if reqs[0].stop_token is not None else []) == reference
    assert reqs[1].finish_reason == "stop"
    jsonschema.validate(json.loads(tok.decode(reqs[1].output_ids)), SCHEMA)
    assert reqs[2].finish_reason == "stop" and tok.decode(reqs[2].output_ids) in ("yes", "no")


def test_bad_requests_fail_at_submit_with_the_reason(tok):
    model = tiny_lm(vocab_size=VOCAB)
    with pytest.raises(ValueError, match="needs the engine's tokenizer"):
        Engine(model, num_slots=1).submit([1, 2], SamplingParams(grammar=YES_NO))
    engine = Engine(model, num_slots=1, tokenizer=tok)
    with pytest.raises(ValueError, match='unknown name: "nothere"'):
        engine.submit([1, 2], SamplingParams(grammar="start: nothere"))
    assert not engine.has_work()
    with pytest.raises(ValueError, match="grammar=.* must be None or non-empty"):
        SamplingParams(grammar=3)
    with pytest.raises(ValueError, match="serving engine only"):
        generate(model, [[1, 2]], SamplingParams(grammar=YES_NO), tok, engine="builtin")
    with pytest.raises(ValueError, match="pass tokenizer="):
        generate(model, [[1, 2]], SamplingParams(grammar=YES_NO))
    for rf, problem in [
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objectx"}}}, "objectx"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a"}}, "json_schema.schema is missing"),  # constrained nothing
    ]:
        with pytest.raises(ValueError, match=problem):
            grammar_for_response_format(rf)


def test_generate_auto_routes_a_grammar_to_the_engine(tok):
    """engine="auto" on CPU would take the plain loop; with a grammar it takes the engine and honours it."""
    model = sharp_tiny_lm(vocab_size=VOCAB, max_position_embeddings=256)
    params = SamplingParams(temperature=1.0, seed=0, max_new_tokens=8, stop_token_ids=(tok.eos_id,), grammar=YES_NO)
    outs = generate(model, [tok.encode("Tom has"), tok.encode("A cook")], params, tok)
    assert [tok.decode(o) in ("yes", "no") for o in outs] == [True, True]


class LiveServer:
    """uvicorn in a thread on a loopback port, with an openai client for it."""

    def __init__(self, app):
        self.port = find_free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(tok):
    model = sharp_tiny_lm(vocab_size=VOCAB, max_position_embeddings=512)
    live = LiveServer(create_app(Engine(model, num_slots=8, max_seq_len=512), tok, MODEL))
    yield live
    live.close()


def test_chat_json_schema_through_openai(server):
    messages = [{"role": "user", "content": "Is the soup hot?"}]
    out = server.client.chat.completions.create(
        model=MODEL, messages=messages, response_format=RESPONSE_FORMAT, max_tokens=150, n=3, temperature=1.0, seed=5
    )
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    stream = server.client.chat.completions.create(
        model=MODEL, messages=messages, response_format=RESPONSE_FORMAT, max_tokens=150, temperature=0.0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_completions_json_schema_and_text_through_openai(server):
    out = server.client.completions.create(
        model=MODEL, prompt="Tom has", max_tokens=150, temperature=0.0, extra_body={"response_format": RESPONSE_FORMAT}
    )
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMA)
    free = server.client.completions.create(model=MODEL, prompt="Tom has", max_tokens=10, temperature=0.0)
    text = server.client.completions.create(
        model=MODEL, prompt="Tom has", max_tokens=10, temperature=0.0, extra_body={"response_format": {"type": "text"}}
    )
    assert text.choices[0].text == free.choices[0].text


def test_invalid_schema_is_a_400_naming_the_problem(server):
    bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objectx"}}}
    with pytest.raises(openai.BadRequestError, match="objectx") as exc:
        server.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], response_format=bad
        )
    assert exc.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="response_format.type"):
        server.client.completions.create(model=MODEL, prompt="hi", extra_body={"response_format": {"type": "yaml"}})
    # a json_schema without its schema was accepted and constrained nothing (the reply was "0"); OpenAI requires it
    no_schema = {"type": "json_schema", "json_schema": {"name": "x"}}
    with pytest.raises(openai.BadRequestError, match="response_format.json_schema.schema is missing") as exc:
        server.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], response_format=no_schema
        )
    assert exc.value.body["param"] == "response_format.json_schema.schema"


def unigram_lm(tok: Tokenizer, order: list[int]) -> torch.nn.Module:
    """A CookMindLM whose next-token logits are the same everywhere: the ids in ``order`` rank first, in that order,
    all others below (residual stream = a constant embedding; attention and MLP outputs zeroed)."""
    model = tiny_lm(vocab_size=VOCAB, tie_word_embeddings=False).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = -1.0
        for rank, t in enumerate(order):
            model.lm_head.weight[t, 0] = float(len(order) - rank)
    return model


def test_json_object_mode_is_a_json_object(tok):
    """A model that always prefers a quote, then a closing brace, writes only quotes unconstrained; in json_object
    mode its greedy path through the grammar is, by hand: brace (forced), two quotes (the empty key), colon and
    space (forced), two quotes (the empty string), closing brace."""
    quote, close = tok.encode('"')[0], tok.encode("}")[0]
    live = LiveServer(create_app(Engine(unigram_lm(tok, [quote, close]), num_slots=2, max_seq_len=64), tok, MODEL))
    try:
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20, temperature=0.0)
        free = live.client.chat.completions.create(**kw)
        assert free.choices[0].message.content == '"' * 20
        out = live.client.chat.completions.create(**kw, response_format={"type": "json_object"})
    finally:
        live.close()
    assert out.choices[0].message.content == '{"": ""}'
    assert out.choices[0].finish_reason == "stop" and json.loads(out.choices[0].message.content) == {"": ""}


def test_strict_false_is_enforced_like_strict_true(tok):
    """strict: false (OpenAI's default) is enforced, as in vLLM and SGLang: the model that writes only quotes when
    free answers the schema's one object, by hand: brace, key "a" (forced), colon and space, the empty string, brace.
    A strict that is not a boolean is a 400 naming the field."""
    quote, close = tok.encode('"')[0], tok.encode("}")[0]
    live = LiveServer(create_app(Engine(unigram_lm(tok, [quote, close]), num_slots=2, max_seq_len=64), tok, MODEL))
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20, temperature=0.0)
    try:
        answers = [
            live.client.chat.completions.create(
                **kw, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, **extra}}
            )
            .choices[0]
            .message.content
            for extra in ({"strict": False}, {}, {"strict": True})
        ]
        bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": "no"}}
        with pytest.raises(openai.BadRequestError, match="json_schema.strict must be true or false") as exc:
            live.client.chat.completions.create(**kw, response_format=bad)
    finally:
        live.close()
    assert answers == ['{"a": ""}'] * 3
    jsonschema.validate(json.loads(answers[0]), schema)
    assert exc.value.body["param"] == "response_format"


def test_a_slow_schema_compile_does_not_hold_a_plain_request(server, monkeypatch):
    """A schema whose first compile takes SLOW seconds (llguidance's compile slowed down) is in flight when a plain
    request arrives through the async openai client: the plain one is answered while the compile still runs (on
    the event loop it would wait out the whole compile), and the schema one still validates."""
    import asyncio

    from cookmind.infer import constraints

    slow, real, started = 3.0, constraints.LLMatcher, threading.Event()

    class SlowCompile:  # llguidance's LLMatcher cannot be subclassed: a stand-in that compiles after a pause
        grammar_from_json_schema = staticmethod(real.grammar_from_json_schema)
        validate_grammar = staticmethod(real.validate_grammar)

        def __new__(cls, *args, **kw):
            started.set()
            time.sleep(slow)
            return real(*args, **kw)

    monkeypatch.setattr(constraints, "LLMatcher", SlowCompile)
    schema = {**SCHEMA, "title": "first seen here"}  # a grammar no earlier test compiled (and cached)
    rf = {"type": "json_schema", "json_schema": {"name": "slow", "schema": schema}}

    async def both():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Is the soup hot?"}]
        constrained = asyncio.create_task(
            client.chat.completions.create(
                model=MODEL, messages=messages, response_format=rf, max_tokens=150, temperature=0.0
            )
        )
        assert await asyncio.to_thread(started.wait, 30), "the schema's compile never started"
        t0 = time.monotonic()
        plain = await client.completions.create(model=MODEL, prompt="Tom has", max_tokens=2, temperature=0.0)
        waited, compile_running = time.monotonic() - t0, not constrained.done()
        return plain, waited, compile_running, await constrained

    plain, waited, compile_running, out = asyncio.run(both())
    assert plain.choices[0].finish_reason == "length"
    assert waited < slow / 2 and compile_running, f"the plain request waited {waited:.2f} s for the compile"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
