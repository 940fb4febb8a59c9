"""The OpenAI-compatible server, driven by the official `openai` package over a loopback port.

A tiny random-weight CookMindLM and a tokenizer trained here on a little text; every answer is
checked against generate() (the model's own KV-cache path) decoded with the tokenizer.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
import torch
import uvicorn
from lm_fixtures import sharp_tiny_lm

from cookmind.infer import SamplingParams, generate
from cookmind.infer.engine import Engine
from cookmind.infer.reasoning import split_reasoning
from cookmind.infer.server import create_app
from cookmind.infer.stop import control_token_ids
from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


TEXT = (
    "The cook stirs the soup. The soup is hot and the bread is fresh. "
    "A cook bakes bread every morning; the kitchen smells of bread and soup.\n"
) * 20
API_KEY = "test-key"
MODEL = "tiny-cook"


def make_tokenizer(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    (d / "corpus.txt").write_text(TEXT)
    vocab, merges = train_bpe(d / "corpus.txt", 300, DEFAULT_SPECIAL_TOKENS, progress=False)
    return Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)


def make_model(vocab_size, max_pos=2048, rare_ids=()):
    """Random weights scaled up (sharp distributions). rare_ids get logit 0 against large others, so a
    long generation is not cut short by a random end-of-turn token."""
    model = sharp_tiny_lm(vocab_size=vocab_size, max_position_embeddings=max_pos, tie_word_embeddings=not rare_ids)
    with torch.no_grad():
        for t in rare_ids:
            model.lm_head.weight[t] = 0
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn in a thread on a loopback port."""

    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory)
    model = make_model(tok.vocab_size, rare_ids=sorted(control_token_ids(tok)))  # a chat reply ends at any of them
    engine = Engine(model, num_slots=8, max_seq_len=2048, max_waiting=64)
    app = create_app(engine, tok, MODEL, api_key=API_KEY)
    server = LiveServer(app)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    yield {"tok": tok, "model": model, "engine": engine, "server": server, "client": client}
    server.close()


def reference(setup, prompt_ids, max_tokens, **kw):
    tok = setup["tok"]
    ids = generate(
        setup["model"],
        [prompt_ids],
        SamplingParams(
            **{"temperature": 0.0, **kw}, max_new_tokens=max_tokens, stop_token_ids=(tok.eos_id, tok.im_end_id)
        ),
    )[0]
    return ids, tok.decode(ids)


MESSAGES = [{"role": "system", "content": "You are a cook."}, {"role": "user", "content": "What is in the soup?"}]


def chat_prompt(setup, messages=MESSAGES):
    return setup["tok"].render(messages, add_generation_prompt=True)[0]


def test_chat_completion_equals_generate(setup):
    r = setup["client"].chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    ids, text = reference(setup, chat_prompt(setup), 12)
    reasoning, content = split_reasoning(text)
    choice = r.choices[0]
    assert choice.message.content == content
    assert choice.finish_reason == ("length" if len(ids) == 12 else "stop")
    assert r.usage.prompt_tokens == len(chat_prompt(setup))
    assert r.usage.completion_tokens == len(ids) and r.usage.total_tokens == r.usage.prompt_tokens + len(ids)
    assert r.model == MODEL and r.object == "chat.completion"


def test_chat_streaming_chunks_and_usage(setup):
    stream = setup["client"].chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    ids, text = reference(setup, chat_prompt(setup), 12)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == split_reasoning(text)[1]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length" if len(ids) == 12 else "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_completion_stop_string_is_cut_and_not_returned(setup):
    tok = setup["tok"]
    prompt = "The cook"
    ids, text = reference(setup, tok.encode(prompt), 30)
    stop = text[6:9]
    assert len(stop) == 3
    r = setup["client"].completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    # streamed: the same cut, the partial stop string never shown
    s = setup["client"].completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in s if c.choices) == text[: text.index(stop)]


def test_a_stop_string_finish_counts_as_stop_not_cancelled(setup):
    # /metrics counted every stop-string finish as requests_finished_cancelled, as if the client had left
    engine, tok = setup["engine"], setup["tok"]
    _, text = reference(setup, tok.encode("The cook"), 30)
    stop = text[6:9]
    before = dict(engine.finished_by_reason)
    for stream in (False, True):
        r = setup["client"].completions.create(
            model=MODEL, prompt="The cook", max_tokens=30, temperature=0, stop=[stop], stream=stream
        )
        list(r) if stream else None
    deadline = time.time() + 20
    while engine.finished_by_reason.get("stop", 0) < before.get("stop", 0) + 2 and time.time() < deadline:
        time.sleep(0.05)
    assert engine.finished_by_reason.get("stop", 0) == before.get("stop", 0) + 2
    assert engine.finished_by_reason.get("cancelled", 0) == before.get("cancelled", 0)


def test_n_choices_and_seed(setup):
    c = setup["client"]
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, n=3, temperature=1.0, seed=5)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    again = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, n=3, temperature=1.0, seed=5)
    assert [ch.message.content for ch in r.choices] == [ch.message.content for ch in again.choices]
    # choice i uses seed + i: choice 0 equals generate() with that seed
    _, text = reference(setup, chat_prompt(setup), 8, temperature=1.0, seed=5)
    assert r.choices[0].message.content == split_reasoning(text)[1]


def test_logprobs_match_the_model(setup):
    tok = setup["tok"]
    r = setup["client"].chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    seq = chat_prompt(setup)
    for entry in r.choices[0].logprobs.content:
        with torch.no_grad():
            logp = torch.log_softmax(setup["model"](torch.tensor([seq])).logits[0, -1], -1)
        best = int(logp.argmax())
        assert entry.token == tok.decode([best])
        assert bytes(entry.bytes) == tok.decode_bytes([best])
        assert entry.logprob == pytest.approx(logp[best].item(), abs=1e-4)
        assert len(entry.top_logprobs) == 2
        seq.append(best)


def test_completion_top_logprobs_keep_the_likeliest_token_of_each_text(setup):
    """/v1/completions' top_logprobs is a dict keyed by a token's text, and byte tokens that hold part of a character
    all read U+FFFD: the last (least likely) of them overwrote the first, so the greedy token's own text showed a
    logprob below the one it was chosen with, and below other entries (a client's argmax named another token). Each
    text now keeps its likeliest token's logprob (reference: the model's log-softmax, top 5 by hand)."""
    tok, c = setup["tok"], setup["client"]
    kw = dict(model=MODEL, prompt="The cook", max_tokens=8, temperature=0, logprobs=5)
    lp = c.completions.create(**kw).choices[0].logprobs
    seq, want = tok.encode("The cook"), []
    for _ in range(8):
        with torch.no_grad():
            logp = torch.log_softmax(setup["model"](torch.tensor([seq])).logits[0, -1].float(), -1)
        top = {}
        for t in torch.topk(logp, 5).indices.tolist():  # likeliest first
            top.setdefault(tok.decode([t]), logp[t].item())
        want.append(top)
        seq.append(int(logp.argmax()))
    assert any(len(t) < 5 for t in want), "no two of the top tokens share a text: the test shows nothing"
    assert [list(t) for t in lp.top_logprobs] == [list(t) for t in want]
    for got, ref in zip(lp.top_logprobs, want):
        assert list(got.values()) == pytest.approx(list(ref.values()), abs=1e-4)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == pytest.approx(logprob, abs=1e-6) and logprob == max(top.values())  # greedy: the best
    streamed = [
        t
        for ch in c.completions.create(**kw, stream=True)
        if ch.choices[0].logprobs
        for t in ch.choices[0].logprobs.top_logprobs
    ]
    assert streamed == lp.top_logprobs


def test_completion_top_logprobs_always_hold_the_chosen_token(setup):
    """OpenAI's /v1/completions: "the API will always return the logprob of the sampled token, so there may be up to
    logprobs+1 elements". A sampled token outside the top N was missing from its top_logprobs (logprobs=0 gave {}
    for every token), so a client reading top_logprobs[token] failed."""
    c = setup["client"]
    for top in (0, 1):
        kw = dict(model=MODEL, prompt="The cook", max_tokens=12, temperature=1.0, seed=3, logprobs=top)
        for lp in [c.completions.create(**kw).choices[0].logprobs] + [
            ch.choices[0].logprobs for ch in c.completions.create(**kw, stream=True) if ch.choices[0].logprobs
        ]:
            for token, logprob, tops in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
                # a text several tokens share (U+FFFD: part of a character) shows its likeliest token's logprob
                assert tops[token] >= logprob - 1e-6 and len(tops) <= top + 1
        if top == 0:
            assert all(len(t) == 1 for t in lp.top_logprobs)


def test_models_health_metrics(setup):
    c = setup["client"]
    assert [m.id for m in c.models.list().data] == [MODEL]
    url = setup["server"].url
    assert httpx.get(url + "/health").json()["status"] == "ok"
    metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    assert "cookmind_generated_tokens_total" in metrics and "cookmind_queue_depth" in metrics


def test_models_retrieve_one_model(setup):
    # GET /v1/models/{id} (the openai client's models.retrieve) was a bare 404 "Not Found"
    c = setup["client"]
    m = c.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "cookmind"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found" and "'tiny-cook'" in e.value.body["message"]


def test_an_unknown_path_or_method_says_what_the_server_serves(setup):
    """A client whose base_url left out /v1 (OpenAI(base_url="http://127.0.0.1:8000")) got a bare 404 "Not Found", and
    a GET of a POST route a bare 405 "Method Not Allowed": neither said what was wrong nor where the API is."""
    url = setup["server"].url
    no_v1 = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        no_v1.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    msg = e.value.body["message"]
    assert "POST /chat/completions" in msg and "/v1/chat/completions" in msg and "base_url" in msg
    auth = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.get(url + "/v1/nothing", headers=auth)
    assert r.status_code == 404 and "/v1/chat/completions, /v1/completions" in r.json()["error"]["message"]
    r = httpx.get(url + "/v1/chat/completions", headers=auth)
    assert r.status_code == 405 and "GET /v1/chat/completions" in r.json()["error"]["message"]
    assert "POST" in r.json()["error"]["message"]


def test_a_failed_generation_step_says_why_to_the_client_and_on_the_servers_stderr(setup, monkeypatch, capfd):
    """A decoding step that raised (a GPU out of memory, a bug) answered 500 "generation failed" and printed nothing
    on the server's console: neither the client nor the operator learnt why. Both now read the exception."""
    engine, c = setup["engine"], setup["client"]
    real, failed = engine._prefill, []

    def prefill():
        if not failed:
            failed.append(1)
            raise RuntimeError("out of memory in the test")
        return real()

    monkeypatch.setattr(engine, "_prefill", prefill)
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert "generation failed: RuntimeError: out of memory in the test" in e.value.body["message"]
    err = capfd.readouterr().err
    assert "cookmind engine: error: a generation step failed (RuntimeError: out of memory in the test" in err
    assert c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3).choices  # the server goes on


def test_a_failed_streamed_generation_raises_in_the_client_with_its_reason(setup, monkeypatch):
    """A stream whose generation failed ended with finish_reason "error" and [DONE], and no word of why: the openai
    client read it as a finished, shorter answer and raised nothing. An error event ({"error": {...}}, as OpenAI's
    streams carry one) follows the failed choice's last chunk, and the client raises APIError with the reason."""
    engine, c = setup["engine"], setup["client"]
    real, failed = engine._prefill, []

    def prefill():
        if len(failed) < 2:
            failed.append(1)
            raise RuntimeError("out of memory in the test")
        return real()

    monkeypatch.setattr(engine, "_prefill", prefill)
    for create in (
        lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=True),
        lambda: c.completions.create(model=MODEL, prompt="The cook", max_tokens=3, stream=True),
    ):
        with pytest.raises(openai.APIError) as e:
            for _ in create():
                pass
        assert "generation failed: RuntimeError: out of memory in the test" in str(e.value)
        assert e.value.body["type"] == "server_error"
    assert list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=True))


def test_errors_are_openai_json_with_right_status(setup):
    c = setup["client"]
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="nope", messages=MESSAGES)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5000)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "max_tokens"
    # a prompt that alone fills the context names the prompt's field, not max_tokens (nor "messages" for a completion)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=[5] * 5000, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature="hot")
    assert "temperature" in e.value.body["message"]
    bad_key = openai.OpenAI(base_url=setup["server"].url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    r = httpx.post(
        setup["server"].url + "/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # nesting deeper than Python's recursion limit was a RecursionError: a plain-text 500 and a traceback (deep enough
    # for any limit: torch.compile's inductor raises it to 2000 in the process, and 1500 levels then parsed)
    deep = b'{"model": "m", "messages": [], "metadata": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = httpx.post(
            setup["server"].url + path,
            content=deep,
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"], r.text


def test_max_tokens_and_max_completion_tokens_that_differ_are_a_400_naming_both(setup):
    """A chat request with both max_tokens and max_completion_tokens (OpenAI: max_tokens is deprecated in favour of
    max_completion_tokens) was answered with max_completion_tokens's limit, the other dropped without a word. Two
    limits that differ are a 400 naming both; the same limit twice is that limit. A limit that does not fit the
    context names the field the client sent."""
    c, tok = setup["client"], setup["tok"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, max_completion_tokens=5)
    says = e.value.body["message"]
    assert e.value.body["param"] == "max_completion_tokens" and "max_tokens (3)" in says and "(got 5)" in says
    ids, text = reference(setup, chat_prompt(setup), 3)
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens == len(ids) and r.choices[0].message.content == text.removesuffix(
        tok.decode([ids[-1]]) if ids[-1] in (tok.eos_id, tok.im_end_id) else ""
    )
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=5000)
    assert e.value.body["param"] == "max_completion_tokens" and "or max_completion_tokens" in e.value.body["message"]


def test_a_completion_without_max_tokens_near_the_context_gets_what_fits(setup):
    # the default max_tokens (16) was taken as asked for: a 2040-token prompt in a 2048 context got a 400 about "16
    # for the completion" that the client never sent
    r = setup["client"].completions.create(model=MODEL, prompt=[5] * 2040, temperature=0)
    assert r.usage.completion_tokens <= 8 and r.choices[0].finish_reason in ("length", "stop")
    assert setup["client"].completions.create(model=MODEL, prompt=[5] * 20, temperature=0).usage.completion_tokens <= 16
    with pytest.raises(openai.BadRequestError) as e:  # one asked for is still refused when it does not fit
        setup["client"].completions.create(model=MODEL, prompt=[5] * 2040, max_tokens=16)
    assert e.value.body["param"] == "max_tokens"


def test_a_prompt_that_alone_fills_the_context_is_a_400_counting_its_tokens_only(setup):
    """A prompt longer than the context was "you requested 5001 tokens (5000 in the prompt, 1 for the completion)"
    for a completion that asked for none (its default 16, cut to the 1 that fitted), and "... 0 for the completion"
    for a chat without max_tokens: counts the client never sent. It now counts the prompt alone, as OpenAI words
    it ("your messages resulted in N tokens"), names its field, and the prompt's length is the tokens by hand."""
    c, tok = setup["client"], setup["tok"]
    long_text = "soup " * 3000
    messages = [{"role": "user", "content": long_text}]
    n_chat = len(tok.render(messages, add_generation_prompt=True)[0])
    n_text = len(tok.encode(long_text))
    assert n_chat > 2048 and n_text > 2048
    for call, n, what in (
        (lambda: c.chat.completions.create(model=MODEL, messages=messages), n_chat, "messages"),
        (lambda: c.completions.create(model=MODEL, prompt=long_text), n_text, "prompt"),
        (lambda: c.completions.create(model=MODEL, prompt=long_text, max_tokens=4), n_text, "prompt"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        body = e.value.body
        assert (body["code"], body["param"]) == ("context_length_exceeded", what)
        assert body["message"].startswith(
            f"This model's maximum context length is 2048 tokens. However, your {what} resulted in {n} tokens"
        ), body["message"]
        assert "in the prompt" not in body["message"] and "requested" not in body["message"]


def test_web_search_and_audio_turned_on_with_their_defaults_are_refused(setup):
    """OpenAI turns web search on with web_search_options={} (its documented form: every option at its default) and
    audio output with audio={...}; the server refused only a non-empty object, so {} was accepted and the answer came
    from the model alone, nothing said. null still means off."""
    c = setup["client"]
    for field in ("web_search_options", "audio"):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={field: {}})
        assert e.value.body["param"] == field and "not supported by this server" in e.value.body["message"]
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={field: None})


def test_openai_fields_we_do_not_implement_are_refused_not_ignored(setup):
    # they were dropped silently: a client's logit_bias or best_of changed nothing and nothing said so
    c = setup["client"]
    refused = [
        ("chat", "logit_bias", {"logit_bias": {"5": 100}}),
        ("chat", "functions", {"functions": [{"name": "f", "parameters": {"type": "object"}}]}),
        ("chat", "function_call", {"function_call": "auto"}),
        ("completions", "best_of", {"best_of": 3}),
        ("completions", "suffix", {"suffix": "the end"}),
    ]
    for api, field, extra in refused:
        with pytest.raises(openai.BadRequestError) as e:
            if api == "chat":
                c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=extra)
            else:
                c.completions.create(model=MODEL, prompt="soup", max_tokens=2, extra_body=extra)
        assert e.value.body["param"] == field and "not supported by this server" in e.value.body["message"]
    # their no-op values, which some clients send, still work
    c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"logit_bias": {}})
    c.completions.create(model=MODEL, prompt="soup", max_tokens=2, extra_body={"best_of": 1, "suffix": ""})
    # a field the server does not know (a typo, another server's parameter) is refused naming it, as OpenAI answers
    # 400 "Unrecognized request argument": ignored, {"max_token": 5} gave a reply of the default length
    unknown = [
        ("chat", "max_token", "did you mean 'max_tokens'?", {"max_token": 5}),
        ("completions", "temprature", "did you mean 'temperature'?", {"temprature": 0}),
        ("chat", "Temperature", "did you mean 'temperature'?", {"Temperature": 0}),
        ("chat", "guided_json", "not known to this server", {"guided_json": {"type": "object"}}),
        ("chat", "reasoning_effort", "not supported by this server", {"reasoning_effort": "low"}),
        ("chat", "modalities", "not supported by this server", {"modalities": ["text", "audio"]}),
        ("chat", "moderation", "not supported by this server", {"moderation": {"policy": {"mode": "block"}}}),
    ]
    for api, field, says, extra in unknown:
        with pytest.raises(openai.BadRequestError) as e:
            if api == "chat":
                c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=extra)
            else:
                c.completions.create(model=MODEL, prompt="soup", max_tokens=2, extra_body=extra)
        assert e.value.body["param"] == field and says in e.value.body["message"], e.value.body
    # OpenAI's bookkeeping fields change no output and are accepted; so are the vLLM sampling fields implemented here
    c.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
        store=False,
        metadata={"run": "test"},
        user="u1",
        service_tier="auto",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        modalities=["text"],
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1},
    )
    r = httpx.post(
        setup["server"].url + "/v1/completions",
        content=b"[1, 2]",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the request body: Input should be")


@pytest.mark.parametrize(
    ("api", "extra", "field", "types"),
    [
        ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "a string or an array of"),
        ("chat", {"stop": 5}, "stop", "a string or an array of strings"),
        ("chat", {"stop": ["a", 1]}, "stop", "a string or an array of strings"),
        ("completions", {"prompt": 1.5}, "prompt", "a string, an array of strings, an array of token ids"),
    ],
)
def test_a_wrong_type_names_the_field_sent_and_the_types_it_takes(setup, api, extra, field, types):
    # param and message named a branch of the schema's union ("messages.0.content.str", "stop.str", "prompt.str"),
    # a field the client never sent, and said only that it "should be a valid string"
    c = setup["client"]
    with pytest.raises(openai.BadRequestError) as e:
        if api == "chat":
            c.chat.completions.create(**{"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **extra})
        else:
            c.completions.create(model=MODEL, max_tokens=2, **extra)
    body = e.value.body
    assert body["param"] == field and body["message"].startswith(f"{field}: takes {types}"), body


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_recipe", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("kw", "param", "says"),
    [
        ({"messages": [*MESSAGES, {"role": "user", "contnet": "hi"}]}, "messages[2].contnet", "'content'"),
        ({"messages": [{"rolee": "user", "content": "hi"}]}, "messages[0].rolee", "'role'"),
        ({"messages": [{"role": "user", "Content": "hi"}]}, "messages[0].Content", "'content'"),  # not a union's tag
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "txt": "hi"}]}]},
            "messages[0].content[0].txt",
            "'text'",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "argumnts": "{}"})]}]},
            "messages[0].tool_calls[0].function.argumnts",
            "'arguments'",
        ),
        (
            {"stream": True, "stream_options": {"include_usgae": True}},
            "stream_options.include_usgae",
            "'include_usage'",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "paramters": {"type": "object"}}}]},
            "tools[0].function.paramters",
            "'parameters'",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "shema": {"type": "object"}}}},
            "response_format.json_schema.shema",
            "'schema'",
        ),
        ({"tool_choice": {"type": "function", "function": {"nme": "f"}}}, "tool_choice.function.nme", "'name'"),
    ],
)
def test_an_unknown_field_inside_a_request_object_is_refused_naming_its_path(setup, kw, param, says):
    # only the top level was checked: {"contnet": "hi"} was a message with no content, {"include_usgae": true} sent
    # no usage, and nothing said why
    with pytest.raises(openai.BadRequestError) as e:
        setup["client"].chat.completions.create(**{"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **kw})
    body = e.value.body
    assert body["param"] == param and body["message"].startswith(f"{param}: not known"), body
    assert f"did you mean {says}?" in body["message"], body


def test_a_reply_sent_back_in_the_history_is_accepted_with_its_reply_fields(setup):
    """A client keeps the conversation by appending the reply's message object: the openai package sends all of its
    fields back (refusal, annotations, audio, function_call: null, ...), each declared by OpenAI for a message."""
    c = setup["client"]
    kw = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    reply = c.chat.completions.create(messages=MESSAGES, **kw).choices[0].message
    assert c.chat.completions.create(messages=[*MESSAGES, reply, {"role": "user", "content": "more"}], **kw).choices
    echoed = {"role": "assistant", "content": [{"type": "text", "text": "Soup."}], "refusal": None}
    echoed |= {"annotations": [], "audio": None, "function_call": None, "tool_calls": [CALL]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "bread"}]}
    assert c.chat.completions.create(messages=[*MESSAGES, echoed, tool], **kw).choices
    # a client that rebuilds the assistant's turn from a stream keeps each tool call's delta "index" in it
    rebuilt = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **CALL}]}
    assert c.chat.completions.create(messages=[*MESSAGES, rebuilt, tool], **kw).choices
    # a refusal is what the assistant said in its turn
    refused = [*MESSAGES, {"role": "assistant", "content": None, "refusal": "No."}, {"role": "user", "content": "Hm."}]
    said = [*MESSAGES, {"role": "assistant", "content": "No."}, {"role": "user", "content": "Hm."}]
    assert c.chat.completions.create(messages=refused, **kw).usage.prompt_tokens == len(chat_prompt(setup, said))


@pytest.mark.parametrize(
    ("messages", "extra", "says"),
    [
        # a participant's name: OpenAI shows it to the model; the chat template has no place for it, and it was dropped
        ([{"role": "user", "content": "Hi", "name": "Alice"}], {}, "messages[0].name"),
        ([{"role": "system", "content": "Be brief.", "name": "rules"}], {}, "messages[0].name"),
        # a turn without content was rendered as an empty turn
        ([{"role": "user", "content": None}], {}, "a user message needs content"),
        ([{"role": "system"}, {"role": "user", "content": "Hi"}], {}, "a system message needs content"),
        # a tool result that answers no call of the assistant turn before it
        ([*MESSAGES, {"role": "tool", "tool_call_id": "call_9", "content": "3"}], {}, "answers no tool call"),
        (
            [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
            + [{"role": "user", "content": "and?"}, {"role": "tool", "tool_call_id": "call_1", "content": "3"}],
            {},
            "answers no tool call",
        ),
        # usage in a stream, asked for on a reply that is not streamed
        (MESSAGES, {"stream_options": {"include_usage": True}}, "stream_options needs stream=true"),
        # fields of another role's turn: the chat template shows them on that role only, and they were dropped
        ([{"role": "user", "content": "Hi", "reasoning_content": "long thoughts"}], {}, "reasoning_content belongs"),
        ([{"role": "user", "content": "Hi", "tool_calls": [CALL]}], {}, "tool_calls belong to an assistant turn"),
        ([{"role": "user", "content": "Hi", "tool_call_id": "call_1"}], {}, "tool_call_id belongs to a tool result"),
        ([{"role": "system", "content": "Be brief.", "refusal": "no"}], {}, "refusal belongs to an assistant turn"),
    ],
)
def test_a_message_the_server_would_render_otherwise_than_asked_is_refused(setup, messages, extra, says):
    with pytest.raises(openai.BadRequestError) as e:
        setup["client"].chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **extra)
    assert says in e.value.body["message"], e.value.body


def test_a_refusal_of_the_requests_own_checks_names_the_field_not_the_whole_body(setup):
    """A check across the request's fields (a tool result answering no call, stream_options without stream) said
    "the request body: ... (got {'model': 'tiny-cook', 'messages': [{'role': ..." with the body's first 100 characters
    cut mid-way, and no param: the message now names the field alone, and param is it."""
    c = setup["client"]
    tool = [*MESSAGES, {"role": "tool", "tool_call_id": "call_9", "content": "3"}]
    cases = [
        (lambda: c.chat.completions.create(model=MODEL, messages=tool, max_tokens=2), "messages[2]"),
        (
            lambda: c.completions.create(
                model=MODEL, prompt="The", max_tokens=2, stream_options={"include_usage": True}
            ),
            "stream_options",
        ),
    ]
    for call, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        body = e.value.body
        assert body["param"] == param and body["message"].startswith(param), body
        assert "the request body" not in body["message"] and "(got {" not in body["message"], body


def test_a_lone_surrogate_escape_is_named_as_such(setup):
    """JSON text with half a UTF-16 pair ("\\ud800", as a cut emoji is escaped) got "the request body: Invalid JSON:
    unexpected end of hex escape at line 1 column 60 (got b'{...')": no hex escape had ended early, and the body's
    bytes followed. It now says what is wrong with the escape, without the body."""
    body = b'{"model": "%s", "max_tokens": 2, ' % MODEL.encode()
    body += b'"messages": [{"role": "user", "content": "cake \\ud83c"}]}'
    r = httpx.post(
        setup["server"].url + "/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    msg = r.json()["error"]["message"]
    assert r.status_code == 400 and msg.startswith("the request body is not valid JSON: "), msg
    assert "half of a UTF-16 surrogate pair" in msg and "(got b'" not in msg, msg


def test_a_tool_result_may_carry_its_function_name(setup):
    # a tool message's name is the function's, which its tool_call_id already identifies: accepted
    kw = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    call = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    plain = [*call, {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    named = [*call, {"role": "tool", "tool_call_id": "call_1", "content": "3", "name": "get_recipe"}]
    c = setup["client"]
    assert c.chat.completions.create(messages=named, **kw).usage.prompt_tokens == (
        c.chat.completions.create(messages=plain, **kw).usage.prompt_tokens
    )
    with pytest.raises(openai.BadRequestError, match="stream_options needs stream=true"):
        c.completions.create(model=MODEL, prompt="The", max_tokens=2, stream_options={"include_usage": True})


@pytest.mark.parametrize(
    ("part", "says"),
    [
        ({"type": "image_url", "image_url": {"url": "https://example.com/soup.png"}}, "image_url content"),
        ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "input_audio content"),
        ({"type": "file", "file": {"file_id": "f1"}}, "file content"),
        ({"type": "text"}, "needs its 'text'"),
    ],
)
def test_content_the_server_cannot_read_is_a_400_naming_the_part(setup, part, says):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    with pytest.raises(openai.BadRequestError) as e:
        setup["client"].chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    body = e.value.body
    assert body["param"] == "messages[0].content[1]" and says in body["message"], body


def test_streamed_chat_logprobs_go_out_with_their_text(setup):
    # a token whose text was held back (a possible stop string here; an unfinished UTF-8 character alike) had its
    # logprobs sent at once in a chunk with an empty delta, and its text came later without them
    c = setup["client"]
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=1)
    stop = ["e#", " #"]  # text ending in "e" or " " is held until the next token shows no stop string
    whole = c.chat.completions.create(**kw, stop=stop).choices[0]
    chunks = [ch.choices[0] for ch in c.chat.completions.create(**kw, stop=stop, stream=True) if ch.choices]
    shown, scored = "", b""
    last = max(k for k, ch in enumerate(chunks) if ch.logprobs)  # the end: a stop string's tokens have no text
    for ch in chunks[:last]:
        shown += ch.delta.content or ""
        entries = ch.logprobs.content if ch.logprobs else []
        text = b"".join(bytes(e.bytes) for e in entries)  # a token may end inside a character: its bytes
        scored += text
        assert shown.startswith(scored.decode(errors="replace")), (shown, scored)  # no logprobs ahead of their text
        assert not entries or ch.delta.content, ch  # no logprobs in a chunk without text
    shown += "".join(ch.delta.content or "" for ch in chunks[last:])
    # joined, they are the reply's content and logprobs
    assert shown == whole.message.content
    streamed = [e for ch in chunks if ch.logprobs for e in ch.logprobs.content]
    assert len(streamed) > sum(bool(ch.logprobs) for ch in chunks), "no text was held back: the test shows nothing"
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole.logprobs.content]


def test_logprobs_end_with_the_token_a_stop_string_cuts(setup):
    # tokens past a stop string's start were listed in logprobs although none of their text was sent
    c = setup["client"]
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True)
    full = c.chat.completions.create(**kw).choices[0]
    toks = [e.token for e in full.logprobs.content]
    text = full.message.content
    assert "".join(toks) == text
    for k in range(1, len(toks) - 2):  # a stop from token k's last character into token k + 2
        stop = toks[k][-1] + toks[k + 1] + toks[k + 2][:1]
        cut = len("".join(toks[: k + 1])) - 1
        if len(toks[k]) > 1 and toks[k + 1] and toks[k + 2] and text.find(stop) == cut:
            break
    else:
        pytest.skip("no reply token to start a stop string inside")
    stopped = c.chat.completions.create(**kw, stop=[stop]).choices[0]
    assert stopped.message.content == text[:cut]
    assert [e.token for e in stopped.logprobs.content] == toks[: k + 1]  # the last holds the cut; none past it
    streamed = [
        e.token
        for ch in c.chat.completions.create(**kw, stop=[stop], stream=True)
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert streamed == toks[: k + 1]
    completion = c.completions.create(model=MODEL, prompt="The cook", max_tokens=30, temperature=0, logprobs=1).choices[
        0
    ]
    ctoks = completion.logprobs.tokens
    assert "".join(ctoks) == completion.text and len(ctoks) > 3
    stop2 = ctoks[1][-1] + ctoks[2]
    cut2 = completion.text.find(stop2)
    cstopped = c.completions.create(
        model=MODEL, prompt="The cook", max_tokens=30, temperature=0, logprobs=1, stop=[stop2]
    ).choices[0]
    kept = [t for t in cstopped.logprobs.tokens]
    assert cstopped.text == completion.text[:cut2]
    assert len("".join(kept[:-1])) < cut2 <= len("".join(kept)) or (cut2 == 0 and not kept)


def _straddling_stop(tok, ids):
    """(k, stop, cut): a generation cut at k + 1 tokens ends on a piece of a character (token k: the detokenizer
    holds it, and flushes it as U+FFFD at the end) after a one-character token k - 1, so the stop string of that
    character and U+FFFD is completed only by the final flush; ``cut``, where it begins in that text. None if the
    tokens hold no such place."""
    for k in range(1, len(ids)):
        before, last = tok.decode(ids[k - 1 : k]), tok.decode_bytes(ids[k : k + 1])
        if len(before) != 1 or before == "\ufffd" or len(last) != 1 or last[0] < 0x80:
            continue
        text, stop = tok.decode(ids[: k + 1]), before + "\ufffd"
        if text.endswith(stop) and text.find(stop) == len(text) - 2:
            return k, stop, len(text) - 2
    return None


def _completion_with_a_straddling_stop(setup):
    """The reference greedy completion of "The cook" (40 tokens) and, as _straddling_stop gives them, the place k, the
    stop string and its cut; skips where the completion holds no such stop string."""
    ids, _ = reference(setup, setup["tok"].encode("The cook"), 40)
    found = _straddling_stop(setup["tok"], ids)
    if found is None:
        pytest.skip("the completion has no piece of a character after a one-character token")
    return (ids, *found)


def test_a_stop_string_the_final_flush_completes_cuts_the_logprobs_too(setup):
    """A generation that ended (max_tokens) while the stop matcher held the start of a stop string and the
    detokenizer held its end (an unfinished character, U+FFFD at the end) had its text cut at the stop string, but
    its logprobs still listed the tokens after the cut, and finish_reason said "length". Now as mid-stream: the
    logprobs end with the text, finish_reason "stop", streamed or not, chat and completions alike."""
    tok, c = setup["tok"], setup["client"]
    chat_ids, _ = reference(setup, chat_prompt(setup), 40)
    cases = [("chat", chat_ids), ("completion", reference(setup, tok.encode("The cook"), 40)[0])]
    for api, ids in cases:
        found = _straddling_stop(tok, ids)
        if found is None:
            pytest.skip(f"the {api} reply has no piece of a character after a one-character token")
        k, stop, cut = found
        want_text = tok.decode(ids[: k + 1])[:cut]  # the reply up to the stop string
        want_tokens = [tok.decode([t]) for t in ids[: k - 1]]  # the tokens before the one the stop string begins
        assert "".join(want_tokens) == want_text  # (each a whole character: the reference is the text itself)
        kw = dict(model=MODEL, max_tokens=k + 1, temperature=0, stop=[stop])
        if api == "chat":
            kw.update(messages=MESSAGES, logprobs=True, top_logprobs=2)
            r = c.chat.completions.create(**kw).choices[0]
            got = (r.message.content, [e.token for e in r.logprobs.content], r.finish_reason)
            tops = [len(e.top_logprobs) for e in r.logprobs.content]
            chunks = [ch.choices[0] for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
            streamed = (
                "".join(ch.delta.content or "" for ch in chunks),
                [e.token for ch in chunks if ch.logprobs for e in ch.logprobs.content],
                chunks[-1].finish_reason,
            )
        else:
            kw.update(prompt="The cook", logprobs=2)
            r = c.completions.create(**kw).choices[0]
            got = (r.text, r.logprobs.tokens, r.finish_reason)
            tops = [len(t) for t in r.logprobs.top_logprobs]
            assert r.logprobs.text_offset == list(range(len(want_tokens)))  # one character each
            chunks = [ch.choices[0] for ch in c.completions.create(**kw, stream=True) if ch.choices]
            streamed = (
                "".join(ch.text for ch in chunks),
                [t for ch in chunks if ch.logprobs for t in ch.logprobs.tokens],
                chunks[-1].finish_reason,
            )
            offsets = [o for ch in chunks if ch.logprobs for o in ch.logprobs.text_offset]
            assert offsets == list(range(len(want_tokens))), api
        assert got == (want_text, want_tokens, "stop"), api
        assert tops == [2] * len(want_tokens), api
        assert streamed == got, api


def _metric(text: str, name: str) -> int:
    """The value of ``cookmind_requests_NAME`` in /metrics' Prometheus text (0 when absent)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == f"cookmind_requests_{name}":
            return int(float(value))
    return 0


def test_metrics_count_a_stop_string_the_final_flush_completes_as_stop(setup):
    """A generation that ended at max_tokens while a stop string waited on the final flush answered finish_reason
    "stop", but /metrics counted it under requests_finished_length: the engine's count, made before the flush. Now
    /metrics counts what the client was told, streamed or not."""
    c = setup["client"]
    ids, k, stop, _ = _completion_with_a_straddling_stop(setup)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = setup["server"].url + "/metrics"
    before = httpx.get(url, headers=headers).text
    reasons = []
    for stream in (False, True):
        kw = dict(model=MODEL, prompt="The cook", max_tokens=k + 1, temperature=0, stop=[stop], stream=stream)
        r = c.completions.create(**kw)
        last = [ch.choices[0] for ch in r if ch.choices][-1] if stream else r.choices[0]
        reasons.append(last.finish_reason)
    assert reasons == ["stop", "stop"]
    deadline = time.time() + 20
    while True:  # the streamed request's count may land just after its last chunk
        after = httpx.get(url, headers=headers).text
        counted = {r: _metric(after, f"finished_{r}") - _metric(before, f"finished_{r}") for r in ("stop", "length")}
        if counted["stop"] + counted["length"] >= 2 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert counted == {"stop": 2, "length": 0}


class _CountsThatRemember(dict):
    """The engine's finish counts (``finished_by_reason``, /metrics' requests_finished_*), remembering every write
    that lowered one: Prometheus reads a counter that goes down as a restart of the server."""

    def __init__(self, counts):
        super().__init__(counts)
        self.lowered: list[tuple[str, int, int]] = []

    def __setitem__(self, reason, value):
        if value < self.get(reason, 0):
            self.lowered.append((reason, self.get(reason, 0), value))
        super().__setitem__(reason, value)


def test_metrics_counters_never_go_down_for_a_stop_string_the_final_flush_completes(setup):
    """The engine counted a generation it ended at max_tokens under requests_finished_length, and the server, finding
    the stop string in the text flushed at its end, moved it to requests_finished_stop by taking 1 off the length
    count: a counter that went down. Now the finish is counted once, with the reason the client is told."""
    c, engine = setup["client"], setup["engine"]
    ids, k, stop, _ = _completion_with_a_straddling_stop(setup)
    counts = engine.finished_by_reason = _CountsThatRemember(engine.finished_by_reason)
    try:
        before = dict(counts)
        # the stop string, streamed and not; then one the text never holds: that one ends at its length
        for stops, stream in (([stop], False), ([stop], True), (["never in the text"], False)):
            kw = dict(model=MODEL, prompt="The cook", max_tokens=k + 1, temperature=0, stop=stops, stream=stream)
            r = c.completions.create(**kw)
            list(r) if stream else None
        deadline = time.time() + 20
        while sum(counts.values()) < sum(before.values()) + 3 and time.time() < deadline:
            time.sleep(0.05)  # the streamed request's count may land just after its last chunk
        counted = {r: counts.get(r, 0) - before.get(r, 0) for r in ("stop", "length")}
        assert (counted, counts.lowered) == ({"stop": 2, "length": 1}, [])
    finally:
        engine.finished_by_reason = dict(counts)


def test_several_prompts_and_choices_cut_a_stop_string_the_final_flush_completes(setup):
    """Each choice of a batch (two prompts, n=2, streamed or not) ends at a stop string the final flush completes
    as a single request does: its text cut there, finish_reason "stop"."""
    tok, c = setup["tok"], setup["client"]
    ids, k, stop, cut = _completion_with_a_straddling_stop(setup)
    want = tok.decode(ids[: k + 1])[:cut]
    kw = dict(model=MODEL, prompt=["The cook", "The cook"], n=2, max_tokens=k + 1, temperature=0, stop=[stop])
    r = c.completions.create(**kw)
    assert [(ch.index, ch.text, ch.finish_reason) for ch in r.choices] == [(i, want, "stop") for i in range(4)]
    texts, reasons = ["" for _ in range(4)], [None] * 4
    for chunk in c.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            reasons[ch.index] = ch.finish_reason or reasons[ch.index]
    assert (texts, reasons) == ([want] * 4, ["stop"] * 4)


def test_full_queue_answers_429(setup):
    # an engine whose loop is not running keeps its queue full; the server must refuse, not wait
    engine = Engine(setup["model"], num_slots=1, max_seq_len=256, max_waiting=1)
    engine.submit([1, 2], None, 1)
    server = LiveServer(create_app(engine, setup["tok"], MODEL, manage_engine=False))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        assert e.value.status_code == 429 and e.value.body["code"] == "rate_limit_exceeded"
        # Retry-After (whole seconds) tells the client when to come back: nothing finished lately, so the window
        assert e.value.response.headers["retry-after"] == "10"
        r = httpx.post(
            server.url + "/v1/completions", json={"model": MODEL, "prompt": "soup", "max_tokens": 2}, timeout=30
        )
        assert r.status_code == 429 and r.headers["retry-after"] == "10"
    finally:
        server.close()


def test_more_choices_than_the_queue_holds_is_a_400_not_a_429(setup):
    """n=4 on a server that queues 2 was answered 429 "the request queue is full (2 waiting); retry later" with
    nothing waiting: no retry could ever succeed, and clients retry 429s."""
    engine = Engine(setup["model"], num_slots=1, max_seq_len=256, max_waiting=2)
    server = LiveServer(create_app(engine, setup["tok"], MODEL))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="soup", max_tokens=2, n=4)
        assert e.value.body["param"] == "n" and "queues at most 2" in e.value.body["message"], e.value.body
        assert len(client.completions.create(model=MODEL, prompt="soup", max_tokens=2, n=2).choices) == 2
    finally:
        server.close()


def test_retry_after_is_the_mean_time_between_recent_finishes(setup):
    engine = Engine(setup["model"], num_slots=1, max_seq_len=256, max_waiting=1)
    assert engine.retry_after() == 10  # none finished: a window's length
    now = time.perf_counter()
    engine._finished_at.extend([now - 30, now - 20])  # out of the window: as good as none
    assert engine.retry_after() == 10
    engine._finished_at.extend([now - 3, now - 2, now - 1])  # 3 in the last 10 s: one every 3.3 s
    assert engine.retry_after() == 4
    engine._finished_at.extend([now] * 100)  # many: at least a second
    assert engine.retry_after() == 1


def test_disconnect_cancels_generation(setup):
    engine = setup["engine"]
    before = engine.finished_by_reason.get("cancelled", 0)
    body = {"model": MODEL, "prompt": "The cook", "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as h:
        with h.stream(
            "POST", setup["server"].url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
        ) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]
    assert got[0].startswith("data: ")
    deadline = time.time() + 20
    while engine.finished_by_reason.get("cancelled", 0) == before and time.time() < deadline:
        time.sleep(0.05)
    assert engine.finished_by_reason.get("cancelled", 0) == before + 1
    assert all(s is None for s in engine.slots)


def test_chat_with_tools_renders_and_answers(setup):
    tools = [{"type": "function", "function": {"name": "get_recipe", "parameters": {"type": "object"}}}]
    r = setup["client"].chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, tools=tools
    )
    assert r.usage.prompt_tokens == len(setup["tok"].render(MESSAGES, add_generation_prompt=True, tools=tools)[0])


def test_tools_reach_the_template_as_sent():
    """The template renders each tool's JSON into the prompt: its keys stay in the client's order (the checked schema
    has an order of its own)."""
    import json

    from cookmind.infer.schemas import ChatCompletionRequest

    tools = [{"function": {"parameters": {"type": "object"}, "name": "get_recipe"}, "type": "function"}]
    req = ChatCompletionRequest.model_validate_json(json.dumps({"model": MODEL, "messages": MESSAGES, "tools": tools}))
    assert json.dumps(req.tools) == json.dumps(tools)


def test_streaming_n_choices_do_not_interleave(setup):
    stream = setup["client"].chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, n=3, stream=True
    )
    texts, finals = {}, {}
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finals[ch.index] = ch.finish_reason
    _, text = reference(setup, chat_prompt(setup), 10)
    assert texts == {i: split_reasoning(text)[1] for i in range(3)}
    assert set(finals) == {0, 1, 2}


def prompt_logprobs_reference(model, ids, k):
    """Plain forward + log_softmax: entry i scores token i given tokens < i (none for i = 0)."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)  # (T, V)
    chosen = [None] + [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    tops = [None] + [logp[i - 1].topk(k).indices.tolist() for i in range(1, len(ids))]
    return chosen, tops


def test_completion_echo_logprobs_score_the_prompt(setup):
    tok, model, c = setup["tok"], setup["model"], setup["client"]
    prompt = "The cook stirs the soup. The bread"
    ids = tok.encode(prompt)
    chosen, tops = prompt_logprobs_reference(model, ids, 2)
    out_ids, out_text = reference(setup, ids, 3)
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    ch = r.choices[0]
    assert ch.text == prompt + out_text
    lp = ch.logprobs
    n = len(ids)
    assert lp.tokens[:n] == [tok.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # OpenAI: the first token has no context
    for i in range(1, n):
        assert lp.token_logprobs[i] == pytest.approx(chosen[i], abs=1e-4)
        # the prompt's own token too, as OpenAI's top_logprobs always hold the chosen one
        assert set(lp.top_logprobs[i]) == {tok.decode([t]) for t in tops[i]} | {lp.tokens[i]}
    assert lp.tokens[n:] == [tok.decode([t]) for t in out_ids]  # then the completion's own tokens
    assert lp.text_offset[0] == 0 and lp.text_offset[n] == len("".join(tok.decode([t]) for t in ids))
    # max_tokens=0: the prompt scored alone
    r0 = c.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    assert r0.choices[0].text == prompt and r0.choices[0].finish_reason == "length"
    assert r0.usage.completion_tokens == 0 and r0.usage.prompt_tokens == n
    assert r0.choices[0].logprobs.token_logprobs[1:] == pytest.approx(chosen[1:], abs=1e-4)
    # streamed: the echo arrives with its logprobs, then the completion
    chunks = list(
        c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=1, stream=True
        )
    )
    assert "".join(x.choices[0].text for x in chunks if x.choices) == prompt + out_text
    first = chunks[0].choices[0]
    assert first.text == prompt and first.logprobs.token_logprobs[0] is None
    assert first.logprobs.token_logprobs[1:] == pytest.approx(chosen[1:], abs=1e-4)


def test_completion_list_of_prompts_orders_choices_like_openai(setup):
    tok, c = setup["tok"], setup["client"]
    prompts = ["The cook", "The soup is hot and", "A cook bakes"]
    refs = [reference(setup, tok.encode(p), 5)[1] for p in prompts]
    r = c.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [ch.index for ch in r.choices] == list(range(6))
    # choice index = prompt index * n + j
    assert [ch.text for ch in r.choices] == [refs[0], refs[0], refs[1], refs[1], refs[2], refs[2]]
    assert r.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    # token-id prompts, streamed: each index gets its own prompt's text
    s = c.completions.create(
        model=MODEL, prompt=[tok.encode(p) for p in prompts[:2]], max_tokens=5, temperature=0, stream=True
    )
    texts = ["", ""]
    for chunk in s:
        for ch in chunk.choices:
            texts[ch.index] += ch.text
    assert texts == refs[:2]
    with pytest.raises(openai.BadRequestError):  # one prompt too long: nothing is submitted
        c.completions.create(model=MODEL, prompt=["The cook", "soup " * 3000], max_tokens=5)


def test_usage_reports_cached_tokens_with_the_prefix_cache(setup):
    tok = setup["tok"]
    assert (
        setup["client"]
        .chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0)
        .usage.prompt_tokens_details
        is None
    )  # cache off
    engine = Engine(setup["model"], num_slots=2, max_seq_len=256, block_size=4, prefix_cache=True)
    server = LiveServer(create_app(engine, tok, MODEL))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        prompt = chat_prompt(setup)
        first, second = [
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
            for _ in range(2)
        ]
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        # every full 4-token block before the last prompt token was cached by the first request
        assert second.usage.prompt_tokens_details.cached_tokens == (len(prompt) - 1) // 4 * 4 > 0
        assert second.choices[0].message.content == first.choices[0].message.content
        assert first.choices[0].message.content == split_reasoning(reference(setup, prompt, 6)[1])[1]
        text = httpx.get(server.url + "/metrics").text
        assert f"cookmind_prefix_cache_hit_tokens {(len(prompt) - 1) // 4 * 4}" in text
    finally:
        server.close()


def test_logprob_bytes_are_the_tokens_own_for_a_piece_of_a_character(setup):
    """A token holding part of a UTF-8 character decodes to U+FFFD: its "bytes" were U+FFFD's (239, 191, 189), so
    a client could not join the pieces back into the character."""
    from cookmind.infer.server.chat import _logprobs

    tok = setup["tok"]
    piece = next(i for i in range(tok.vocab_size) if tok.decode_bytes([i]) == "é".encode()[:1])
    entry = {"id": piece, "token": tok.decode([piece]), "logprob": -0.5, "top": [(piece, tok.decode([piece]), -0.5)]}
    out = _logprobs([entry], tok)["content"][0]
    assert out["token"] == "\ufffd" and out["bytes"] == [0xC3] and out["top_logprobs"][0]["bytes"] == [0xC3]


def _assert_declared(theirs: list, ours: list, where: str) -> None:
    """Every key of every object type in ``theirs`` (the openai package's) is a field of each in ``ours``, at every
    depth where ours are objects too (a field of ours typed Any or dict takes what it is given)."""
    from cookmind.infer.schemas import field_types, object_types

    for mine in ours:
        fields = field_types(mine)
        for their in theirs:
            for key, annotation in field_types(their).items():
                assert key in fields, f"{where}.{key} (openai's {their.__name__}) is not declared by {mine.__name__}"
                inner = object_types(fields[key])
                if inner:
                    _assert_declared(object_types(annotation), inner, f"{where}.{key}")


def test_every_openai_request_parameter_is_known_to_the_schemas():
    """The unknown-field 400 is for typos and other servers' fields: each parameter of the installed openai
    package's create() is declared (implemented, accepted as a no-op, or refused by name when set), and so is each
    field of the objects inside (messages and their content parts and tool calls, tools, stream_options, ...), and of
    the reply message a client sends back in its history."""
    from openai.types import completion_create_params
    from openai.types.chat import ParsedChatCompletionMessage
    from openai.types.chat import completion_create_params as chat_create_params

    from cookmind.infer.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest

    _assert_declared([chat_create_params.CompletionCreateParamsBase], [ChatCompletionRequest], "chat")
    _assert_declared([completion_create_params.CompletionCreateParamsBase], [CompletionRequest], "completions")
    _assert_declared([ParsedChatCompletionMessage], [ChatMessage], "chat.messages[]")


@pytest.mark.parametrize("field", ["repetition_penalty", "temperature"])
def test_a_number_that_is_not_finite_is_a_400_naming_it(setup, field):
    """Python's JSON reads Infinity and NaN; "repetition_penalty": Infinity passed its > 0 check and reached the
    sampler (every logit of a seen token divided by infinity)."""
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 2, field: float("inf")})  # the client
    assert "Infinity" in body  # refuses to send it; Python's json writes it
    r = httpx.post(
        setup["server"].url + "/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        timeout=60,
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == field and "finite" in error["message"], error


def test_seeds_beyond_64_bits_are_refused_not_folded(setup):
    """The sampler took a seed modulo 2**64, so seed 5 and 5 + 2**64 gave the same sample (and -1 that of 2**64 - 1)
    with no word; seeds are 64-bit signed integers, as OpenAI's."""
    c = setup["client"]
    for seed in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=2, seed=seed)
        assert e.value.body["param"] == "seed", e.value.body
    kw = dict(model=MODEL, prompt="Hi", max_tokens=6, temperature=1)
    assert c.completions.create(**kw, seed=2**63 - 1).choices[0].text is not None
    assert c.completions.create(**kw, seed=-(2**63)).choices[0].text is not None


@pytest.mark.parametrize("penalty", [1e-300, 1e300, 0.001])
def test_a_repetition_penalty_that_overflows_the_logits_is_refused(setup, penalty):
    """repetition_penalty 1e-300 passed its > 0 check, divided the seen tokens' logits into infinities and the reply
    was token 0 eight times."""
    with pytest.raises(openai.BadRequestError) as e:
        setup["client"].completions.create(
            model=MODEL, prompt="hello hello", max_tokens=2, extra_body={"repetition_penalty": penalty}
        )
    assert e.value.body["param"] == "repetition_penalty", e.value.body


def test_completion_text_offsets_count_characters_of_the_text_after_non_ascii(setup):
    """text_offset counted each token's own decoded text, so a character split over byte tokens counted once per
    token ("é" as 2, an emoji as 4) and every later offset pointed past its token ("café au lait 🙂 ok", 17
    characters, had offsets up to 20). An offset is now where the text a token brings begins: the characters of the
    tokens before it that are whole (reference: the bytes before the token, decoded with an unfinished character
    left out)."""
    tok, c = setup["tok"], setup["client"]
    prompt = "café au lait 🙂 ok"
    ids = tok.encode(prompt)
    assert len(ids) > len(prompt.split())  # the byte-level vocabulary splits é and 🙂 over several tokens
    lp = c.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=0).choices[0].logprobs
    starts = [len(tok.decode_bytes(ids[:k])) for k in range(len(ids))]
    whole = [len(prompt.encode()[:s].decode("utf-8", "ignore")) for s in starts]
    assert lp.text_offset == whole and lp.text_offset[-1] == len(prompt) - 1  # "k", the last character
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1, seed=3, logprobs=0)
    text, offsets = r.choices[0].text, r.choices[0].logprobs.text_offset
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    streamed = [
        o
        for ch in c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=1, seed=3, logprobs=0, stream=True
        )
        if ch.choices and ch.choices[0].logprobs
        for o in ch.choices[0].logprobs.text_offset
    ]
    assert streamed == offsets


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "The cook"}),
        ("/v1/chat/completions", {"messages": MESSAGES}),
    ],
)
def test_a_client_gone_before_its_stream_starts_cancels_the_generation(setup, path, body):
    """A streamed call whose client left before the response's first byte went out (a reload, a proxy's timeout)
    generated on to its max_tokens for no one, holding a slot: the stream's own clean-up never ran, since its
    body was never started. The call is made at the ASGI level, where that moment can be held: sending the
    response's headers never returns, and the server hears the disconnect meanwhile."""
    import asyncio
    import json

    engine = setup["engine"]
    app = create_app(engine, setup["tok"], MODEL, api_key=API_KEY, manage_engine=False)
    before = dict(engine.finished_by_reason)
    payload = json.dumps({"model": MODEL, "max_tokens": 600, "temperature": 0, "stream": True, **body}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},  # uvicorn's
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {API_KEY}".encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }

    async def call():
        messages = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                await asyncio.Event().wait()  # the headers never leave: the client is gone first

        await asyncio.wait_for(app(scope, receive, send), 30)
        deadline = time.time() + 60  # this loop stays up while the engine may still send it the request's tokens
        while sum(engine.finished_by_reason.values()) == sum(before.values()) and time.time() < deadline:
            await asyncio.sleep(0.05)

    asyncio.run(call())
    ended = {k: v - before.get(k, 0) for k, v in engine.finished_by_reason.items() if v != before.get(k, 0)}
    assert ended == {"cancelled": 1}
    assert all(s is None for s in engine.slots)


def test_an_event_for_a_call_whose_event_loop_has_closed_is_dropped():
    """The engine thread hands each token to its call's event loop; one that had closed (a server shutting down,
    or the ASGI-level test above ending just as the engine sent the finish) raised in the engine thread, which
    failed every request running beside it."""
    import asyncio

    from cookmind.infer.engine import FinishEvent, TokenEvent
    from cookmind.infer.server.generation import Generation

    async def made_in_a_loop():
        return Generation(state=None)

    gen = asyncio.run(made_in_a_loop())  # asyncio.run closes its loop
    sink = gen._sink(0)
    sink(TokenEvent(1))
    sink(FinishEvent("length", None))
    assert gen.queue.empty()


def test_a_generation_the_engine_cancels_is_not_reported_as_finished(tmp_path_factory):
    """An app embedding create_app over an engine it runs itself (manage_engine=False) and stops, or whose own code
    cancels a request, left each generation in flight finished as "cancelled", which the server answered as
    finish_reason "stop": a client read the cut answer as the model's whole one. Now a call not streamed is a 503
    saying the generation was cut, and a stream's choice ends with finish_reason "error" and an error event, as for a
    server stopping (the openai client raises either)."""
    tok = make_tokenizer(tmp_path_factory)
    model = make_model(tok.vocab_size, rare_ids=sorted(control_token_ids(tok)))  # never ends early
    engine = Engine(model, num_slots=4, max_seq_len=2048)
    server = LiveServer(create_app(engine, tok, MODEL, manage_engine=False))
    engine.start()
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    calls = {
        "chat": lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1500),
        "completion": lambda: c.completions.create(model=MODEL, prompt="The cook", max_tokens=1500),
        "chat stream": lambda: list(
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1500, stream=True)
        ),
        "completion stream": lambda: list(
            c.completions.create(model=MODEL, prompt="The cook", max_tokens=1500, stream=True)
        ),
    }
    got = {}

    def run(name):
        try:
            got[name] = calls[name]()
        except openai.APIError as exc:
            got[name] = exc

    threads = [threading.Thread(target=run, args=(name,)) for name in calls]
    for t in threads:
        t.start()
    try:
        deadline = time.time() + 60
        while sum(r is not None for r in engine.slots) < 4 or engine.tokens_generated < 40:
            assert time.time() < deadline, "the four requests never ran"
            time.sleep(0.01)
        engine.stop()  # the embedding app stops its engine: every generation in flight is cancelled
        for t in threads:
            t.join(timeout=30)
    finally:
        server.close()
    for name in ("chat", "completion"):
        exc = got[name]
        assert isinstance(exc, openai.InternalServerError) and exc.status_code == 503, (name, exc)
        assert exc.body["code"] == "generation_cancelled", exc.body
        assert "cancelled this generation after" in exc.body["message"], exc.body
    for name in ("chat stream", "completion stream"):
        exc = got[name]
        assert isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIStatusError), (name, exc)
        assert exc.body["code"] == "generation_cancelled", exc.body
