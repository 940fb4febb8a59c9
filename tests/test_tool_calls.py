"""Tool calls the way the OpenAI API has them: parsing (whole and streamed), tools / tool_choice checks, the grammar
that enforces "required" and a named function, and the chat route through the real `openai` client.

A tiny random model cannot call tools by itself, so the route is driven by a scripted engine that "generates" the
token ids of a hand-written tool-call text; the grammar is checked with llguidance's own matcher on our tokenizer.
"""

from __future__ import annotations

import json

import jsonschema
import llguidance
import openai
import pytest
from test_server import API_KEY, MODEL, LiveServer, make_model, make_tokenizer

from cookmind.infer.engine import Engine, FinishEvent, TokenEvent
from cookmind.infer.output import OutputProcessor
from cookmind.infer.server import create_app
from cookmind.infer.tool_calls import (
    ToolChoice,
    ToolSpecError,
    check_tools,
    extract_tool_calls,
    tool_call_grammar,
)
from cookmind.tokenizer.hf_format import hf_tokenizer_json

RECIPE = {
    "type": "function",
    "function": {
        "name": "get_recipe",
        "description": "A recipe by dish",
        "parameters": {
            "type": "object",
            "properties": {"dish": {"type": "string"}, "servings": {"type": "integer"}},
            "required": ["dish"],
            "additionalProperties": False,
        },
    },
}
TIMER = {"type": "function", "function": {"name": "set_timer", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [RECIPE, TIMER]
LOOKAHEAD = {  # a valid JSON Schema whose pattern llguidance cannot enforce
    "type": "function",
    "function": {
        "name": "find",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "pattern": "(?=a)b"}}},
    },
}
CALL_SOUP = '<tool_call>\n{"name": "get_recipe", "arguments": {"dish": "soup", "servings": 2}}\n</tool_call>'
CALL_TIMER = '<tool_call>\n{"name": "set_timer", "arguments": {}}\n</tool_call>'
TWO_CALLS = "Let me look.\n" + CALL_SOUP + "\n" + CALL_TIMER
MESSAGES = [{"role": "user", "content": "How do I make soup?"}]


# --- parsing ---------------------------------------------------------------------------------------------------


def test_extract_whole_text():
    content, calls = extract_tool_calls(TWO_CALLS)
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_recipe", "set_timer"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"dish": "soup", "servings": 2}
    assert calls[1]["function"]["arguments"] == "{}"
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>not json</tool_call>",  # not JSON
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        'Sure.\n<tool_call>\n{"name": "get_recipe", "arguments": {"dish": \n</tool_call> done',  # broken args
        'Cut short <tool_call>\n{"name": "get_recipe", "arg',  # max_tokens reached inside the call
        "a < b and <tool_ca",  # a tag that never completes
    ],
)
def test_what_does_not_parse_stays_text(text):
    assert extract_tool_calls(text) == (text, [])


def test_max_calls_leaves_later_blocks_as_text():
    content, calls = extract_tool_calls(TWO_CALLS, max_calls=1)
    assert [c["function"]["name"] for c in calls] == ["get_recipe"] and content == "Let me look." + CALL_TIMER


def test_plain_text_and_whitespace_are_kept():
    assert extract_tool_calls("  two\nlines \n") == ("  two\nlines \n", [])
    # only the whitespace the template puts around a call goes; text after it stays
    content, calls = extract_tool_calls("Hi \n" + CALL_TIMER + "\n\nDone.")
    assert content == "HiDone." and len(calls) == 1


def feed_by_token(tok, text, **kw):
    """Feed an OutputProcessor the real token ids of text, one TokenEvent each; the deltas."""
    proc = OutputProcessor(tok, parse_tool_calls=True, **kw)
    ids = tok.encode(text)
    deltas = [proc.feed(TokenEvent(t)) for t in ids] + [proc.feed(FinishEvent("stop"))]
    return proc, ids, deltas


def test_streaming_sends_each_call_when_its_closing_tag_is_generated(tok):
    proc, ids, deltas = feed_by_token(tok, TWO_CALLS)
    prefix_lens = [len(tok.decode(ids[: k + 1])) for k in range(len(ids))]
    call_events = [k for k, d in enumerate(deltas) if d.tool_calls]
    # the call arrives with the token that completes "</tool_call>": not earlier, not later
    first_end = TWO_CALLS.index("</tool_call>") + len("</tool_call>")
    assert call_events == [
        next(k for k, n in enumerate(prefix_lens) if n >= first_end),
        len(ids) - 1,
    ]
    assert [d.tool_calls[0]["function"]["name"] for d in deltas if d.tool_calls] == ["get_recipe", "set_timer"]
    # content streams before the call: all of "Let me look." is out before the "<" of the tag is generated
    tag_token = next(k for k, n in enumerate(prefix_lens) if n > TWO_CALLS.index("<tool_call>"))
    assert "".join(d.content for d in deltas[:tag_token]) == "Let me look."
    assert "".join(d.content for d in deltas) == proc.content == "Let me look."
    assert proc.tool_calls == [c for d in deltas for c in d.tool_calls]
    _, whole = extract_tool_calls(TWO_CALLS)
    assert [c["function"] for c in proc.tool_calls] == [c["function"] for c in whole]


def test_calls_inside_reasoning_are_not_calls(tok):
    text = "<think>\nmaybe " + CALL_TIMER + "\n</think>\n\nNo call."
    proc, _, _ = feed_by_token(tok, text)
    assert proc.tool_calls == [] and proc.content == "No call." and CALL_TIMER in proc.reasoning_content


def test_stop_string_after_a_call_keeps_the_call(tok):
    proc, _, deltas = feed_by_token(tok, CALL_TIMER + "\nEND and more", stop_strings=["END"])
    assert proc.stopped_by_string and proc.content == ""
    assert [c["function"]["name"] for d in deltas for c in d.tool_calls] == ["set_timer"]


# --- tools and tool_choice ---------------------------------------------------------------------------------------


def test_tool_choice_modes():
    assert check_tools(TOOLS, None) == ToolChoice("auto")
    assert check_tools(None, None) == ToolChoice("none")
    assert check_tools(None, "none") == ToolChoice("none")
    assert check_tools(TOOLS, "required") == ToolChoice("required")
    named = {"type": "function", "function": {"name": "set_timer"}}
    assert check_tools(TOOLS, named) == ToolChoice("function", "set_timer")
    assert check_tools([{"type": "function", "function": {"name": "no_args"}}], "required").enforced
    assert check_tools(TOOLS, None).max_calls is None and check_tools(TOOLS, named).max_calls == 1
    assert check_tools(TOOLS, "required", parallel=False) == ToolChoice("required", parallel=False)
    assert ToolChoice("required", parallel=False).max_calls == 1


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (TOOLS, {"type": "function", "function": {"name": "get_weather"}}, "tool_choice.function.name"),
        (TOOLS, "sometimes", "tool_choice"),
        (TOOLS, {"type": "function"}, "tool_choice"),
        (None, "required", "tool_choice"),
        (None, {"type": "function", "function": {"name": "get_recipe"}}, "tool_choice"),
        ([], None, "tools"),
        ([{"type": "function", "function": {"parameters": {"type": "object"}}}], None, "tools[0].function.name"),
        ([RECIPE, {"type": "function", "function": {"name": "bad name!"}}], None, "tools[1].function.name"),
        ([{"type": "retrieval"}], None, "tools[0].type"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            None,
            "tools[0].function.parameters.type",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "x"}}}],
            None,
            "tools[0].function.parameters",
        ),
        ([TIMER, TIMER], None, "tools"),
    ],
)
def test_bad_tools_name_the_field(tools, choice, param):
    with pytest.raises(ToolSpecError) as e:
        check_tools(tools, choice)
    assert e.value.param == param


def test_a_custom_tool_is_refused_by_name_with_what_to_send_instead():
    """OpenAI's "custom" tools (free-form text input, the openai package's ChatCompletionCustomToolParam) are not
    a malformed function: the error says which kind it is and what this server takes."""
    custom = {"type": "custom", "custom": {"name": "run_sql", "description": "a query", "format": {"type": "text"}}}
    with pytest.raises(ToolSpecError) as e:
        check_tools([TIMER, custom], None)
    assert e.value.param == "tools[1].type"
    assert '"custom"' in str(e.value) and "function.parameters" in str(e.value) and "\n" not in str(e.value)


# --- the grammar, checked by llguidance's matcher on our tokenizer ------------------------------------------------


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory)


@pytest.fixture(scope="module")
def ll_tokenizer(tok):
    return llguidance.LLTokenizer(json.dumps(hf_tokenizer_json(tok)), eos_token=tok.im_end_id)


def rendered_calls(tok, calls):
    """The assistant turn the chat template writes for these OpenAI tool calls, without the end-of-turn token."""
    before = tok.render(MESSAGES, add_generation_prompt=True)[0]
    turn = tok.render([*MESSAGES, {"role": "assistant", "content": "", "tool_calls": calls}])[0]
    assert turn[: len(before)] == before and turn[-2:] == [tok.im_end_id, tok.encode("\n")[0]]
    return turn[len(before) : -2]


def accepts(ll_tokenizer, grammar, ids, end_id) -> bool:
    m = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(ids) and m.consume_token(end_id) and not m.is_error()


def call(name, arguments):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_grammar_accepts_the_template_calls_and_rejects_others(tok, ll_tokenizer):
    named = tool_call_grammar(TOOLS, ToolChoice("function", "get_recipe"))
    required = tool_call_grammar(TOOLS, ToolChoice("required"))
    just_one = tool_call_grammar(TOOLS, ToolChoice("required", parallel=False))
    soup = rendered_calls(tok, [call("get_recipe", {"dish": "soup", "servings": 2})])
    assert tok.decode(soup) == CALL_SOUP  # the template's format, written out by hand
    both = rendered_calls(tok, [call("get_recipe", {"dish": "soup"}), call("set_timer", "{}")])
    end = tok.im_end_id
    assert accepts(ll_tokenizer, named, soup, end) and accepts(ll_tokenizer, required, soup, end)
    assert accepts(ll_tokenizer, required, both, end)
    assert accepts(ll_tokenizer, just_one, soup, end) and not accepts(ll_tokenizer, just_one, both, end)
    assert not accepts(ll_tokenizer, named, both, end)  # a named function: exactly one call
    wrong = {
        "other function": [call("set_timer", {})],
        "unknown function": [call("get_weather", {"dish": "soup"})],
        "missing required": [call("get_recipe", {"servings": 2})],
        "wrong type": [call("get_recipe", {"dish": "soup", "servings": "two"})],
        "extra key": [call("get_recipe", {"dish": "soup", "salt": True})],
        "free spacing": [call("get_recipe", '{"dish":"soup"}')],
    }
    for why, calls in wrong.items():
        assert not accepts(ll_tokenizer, named, rendered_calls(tok, calls), end), why
    ping = [{"type": "function", "function": {"name": "ping"}}]  # no parameters: no arguments
    no_args = tool_call_grammar(ping, ToolChoice("function", "ping"))
    assert accepts(ll_tokenizer, no_args, rendered_calls(tok, [call("ping", {})]), end)
    assert not accepts(ll_tokenizer, no_args, rendered_calls(tok, [call("ping", {"x": 1})]), end)
    assert not accepts(ll_tokenizer, required, tok.encode("Sure, here it is."), end)
    assert not accepts(ll_tokenizer, required, [], end)  # at least one call


# --- the chat route through the openai client ---------------------------------------------------------------------


class ScriptedEngine:
    """Stands in for the engine: every request "generates" the token ids of ``script`` and stops; the requests it
    got (prompt ids, SamplingParams) are kept."""

    max_seq_len = 2048
    max_waiting = 256
    prefix = None

    def __init__(self, tok):
        self.vocab_size = tok.vocab_size
        self.script: list[int] = []
        self.requests: list[tuple[list[int], object]] = []

    def start(self):
        pass

    def stop(self):
        pass

    def submit(self, ids, params, max_new, stop_ids, sink, prompt_logprobs=None, adapter=None, text_stops=False):
        self.requests.append((list(ids), params))
        out = self.script[:max_new]
        for t in out:
            sink(TokenEvent(t))
        sink(FinishEvent("length" if len(out) == max_new else "stop"))
        return len(self.requests)

    def cancel(self, handle, reason="cancelled"):
        pass


@pytest.fixture(scope="module")
def scripted(tok):
    engine = ScriptedEngine(tok)
    server = LiveServer(create_app(engine, tok, MODEL, api_key=API_KEY))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    yield engine, client
    server.close()


def test_calls_in_the_response(scripted, tok):
    engine, client = scripted
    engine.script = tok.encode(TWO_CALLS)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, n=2)
    assert engine.requests[-1][0] == tok.render(MESSAGES, add_generation_prompt=True, tools=TOOLS)[0]
    assert engine.requests[-1][1].grammar is None  # "auto" is not constrained
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
        calls = choice.message.tool_calls
        assert [(c.type, c.function.name) for c in calls] == [("function", "get_recipe"), ("function", "set_timer")]
        assert json.loads(calls[0].function.arguments) == {"dish": "soup", "servings": 2}
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_recipe"]
    assert r.choices[0].message.content == "Let me look." + CALL_TIMER
    engine.script = tok.encode(CALL_TIMER)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS)
    assert r.choices[0].message.content is None and len(r.choices[0].message.tool_calls) == 1


def test_streamed_calls_are_openai_deltas(scripted, tok):
    engine, client = scripted
    engine.script = tok.encode(TWO_CALLS)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    call_deltas = [d.tool_calls for d in deltas if d.tool_calls]
    assert [[(t.index, t.type, t.function.name) for t in d] for d in call_deltas] == [
        [(0, "function", "get_recipe")],
        [(1, "function", "set_timer")],
    ]
    assert all(t.id.startswith("call_") for d in call_deltas for t in d)
    assert "".join(d.content or "" for d in deltas) == "Let me look."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the openai package's own accumulation of the deltas
    with client.chat.completions.stream(model=MODEL, messages=MESSAGES, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Let me look." and final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_recipe", {"dish": "soup", "servings": 2}),
        ("set_timer", {}),
    ]


def test_tool_choice_none_neither_shows_nor_parses(scripted, tok):
    engine, client = scripted
    engine.script = tok.encode(CALL_TIMER)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert engine.requests[-1][0] == tok.render(MESSAGES, add_generation_prompt=True)[0]
    assert r.choices[0].message.content == CALL_TIMER and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_required_and_named_set_the_grammar(scripted, tok):
    engine, client = scripted
    engine.script = tok.encode(CALL_SOUP)
    named = {"type": "function", "function": {"name": "get_recipe"}}
    cases = (
        ("required", True, ToolChoice("required")),
        ("required", False, ToolChoice("required", parallel=False)),
        (named, True, ToolChoice("function", "get_recipe")),
    )
    for choice, parallel, want in cases:
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel
        )
        assert engine.requests[-1][1].grammar == tool_call_grammar(TOOLS, want)
        assert r.choices[0].message.tool_calls[0].function.name == "get_recipe"


def test_tool_results_round_trip_through_the_template(scripted, tok):
    engine, client = scripted
    engine.script = tok.encode(CALL_SOUP)
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS).choices[0].message
    call_id = first.tool_calls[0].id
    messages = [
        *MESSAGES,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call_id, "content": '{"steps": 3}'},
    ]
    engine.script = tok.encode("Three steps.")
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert r.choices[0].message.content == "Three steps." and r.choices[0].finish_reason == "stop"
    prompt = tok.decode(engine.requests[-1][0])
    assert prompt.endswith(
        "<|im_start|>user\nHow do I make soup?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_recipe", "arguments": {"dish": "soup", "servings": 2}}\n'
        '</tool_call><|im_end|>\n<|im_start|>tool\n{"steps": 3}<|im_end|>\n<|im_start|>assistant\n'
    )


def test_bad_requests_are_400s_naming_the_field(scripted):
    _, client = scripted
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools[0].function"),
        ({"tools": [TIMER, LOOKAHEAD], "tool_choice": "required"}, "tools[1].function.parameters"),
        # two grammars for one reply: a forced call and a JSON response format cannot both hold
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, **kw)
        assert e.value.body["param"].startswith(param), (kw, e.value.body)
    # what llguidance cannot enforce is only an error when it must be enforced
    client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[TIMER, LOOKAHEAD], tool_choice="auto")
    named = {"type": "function", "function": {"name": "set_timer"}}
    client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[TIMER, LOOKAHEAD], tool_choice=named)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[*MESSAGES, {"role": "tool", "content": "3"}])
    assert "tool_call_id" in e.value.body["message"]


# --- end to end: a random tiny model must call the tool once the engine enforces the grammar ------------------


# Bounded: a random model fills an unbounded string (or free extra keys) until max_tokens.
BOUNDED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_recipe",
            "parameters": {
                "type": "object",
                "properties": {
                    "dish": {"type": "string", "maxLength": 12},
                    "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                },
                "required": ["dish"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_timer",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


def test_random_model_makes_schema_valid_calls(tok):
    engine = Engine(make_model(tok.vocab_size), num_slots=4, max_seq_len=2048)
    server = LiveServer(create_app(engine, tok, MODEL, api_key=API_KEY))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    named = {"type": "function", "function": {"name": "get_recipe"}}
    try:
        cases = (("required", False, 0), ("required", False, 2), (named, False, 1), (named, True, 1))
        for choice, stream, seed in cases:
            kw = {"model": MODEL, "messages": MESSAGES, "tools": BOUNDED_TOOLS, "tool_choice": choice}
            kw |= {"max_tokens": 150, "parallel_tool_calls": False, "seed": seed}
            if stream:
                with client.chat.completions.stream(**kw) as s:
                    r = s.get_final_completion()
            else:
                r = client.chat.completions.create(**kw)
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) == 1, r
            call = msg.tool_calls[0]
            if choice is named:
                assert call.function.name == "get_recipe"
            tool = next(t for t in BOUNDED_TOOLS if t["function"]["name"] == call.function.name)
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    finally:
        server.close()


def test_a_call_cut_by_max_tokens_says_length_and_is_never_shown_whole(scripted, tok):
    """tool_choice="required" with max_tokens too small for the call answered a half call as the message's content
    (`<tool_call>\\n{"name": "get_re`, finish_reason "length"), and a reply cut inside its second call said
    finish_reason "tool_calls", as if whole. A cut reply now says "length" (the client raises max_tokens); the calls
    finished before the cut are whole calls, and a forced reply's half call is no text: content stays null."""
    engine, client = scripted
    engine.script = tok.encode(CALL_SOUP + "\n" + CALL_TIMER)
    first_end = next(k for k in range(len(engine.script)) if "</tool_call>" in tok.decode(engine.script[:k]))
    for max_tokens, names in ((first_end - 4, []), (first_end + 4, ["get_recipe"])):
        kw = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "max_tokens": max_tokens}
        choice = client.chat.completions.create(**kw).choices[0]
        assert (choice.finish_reason, choice.message.content) == ("length", None), choice
        assert [c.function.name for c in choice.message.tool_calls or []] == names
        chunks = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True) if c.choices]
        assert [c.finish_reason for c in chunks if c.finish_reason] == ["length"]
        assert not any(c.delta.content for c in chunks)
        assert [t.function.name for c in chunks for t in c.delta.tool_calls or []] == names
        # "auto": what the model wrote stays text, but the reply still says it was cut
        auto = client.chat.completions.create(**{**kw, "tool_choice": "auto"}).choices[0]
        assert auto.finish_reason == "length" and [c.function.name for c in auto.message.tool_calls or []] == names
