"""The per-choice output chain (detokenize -> stop strings -> reasoning) and tool-call extraction."""

from __future__ import annotations

import json

from cookmind.infer.engine import FinishEvent, TokenEvent
from cookmind.infer.output import OutputProcessor, extract_tool_calls
from cookmind.infer.server.chat import _hold_tool_calls


class ByteTok:
    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def run(text, stops=(), finish="length"):
    tok = ByteTok()
    proc = OutputProcessor(tok, stops)
    deltas = [proc.feed(TokenEvent(t)) for t in tok.encode(text)]
    deltas.append(proc.feed(FinishEvent(finish)))
    return proc, deltas


def test_reasoning_and_content_through_tokens():
    proc, deltas = run("<think>\nsalt it</think>\n\nAdd salt. ☕")
    assert "".join(d.reasoning for d in deltas).strip("\n") == "salt it" == proc.reasoning_content
    assert "".join(d.content for d in deltas) == "Add salt. ☕" == proc.content
    assert proc.completion_tokens == len("<think>\nsalt it</think>\n\nAdd salt. ☕".encode())
    assert deltas[-1].finish_reason == "length"


def test_stop_string_ends_choice_and_is_hidden():
    proc, deltas = run("one two STOP three", stops=["STOP"])
    assert proc.content == "one two " and proc.finish_reason == "stop" and proc.stopped_by_string
    assert sum(d.finish_reason is not None for d in deltas) == 1


def test_tool_calls_extracted_in_openai_form():
    text = 'Let me look.\n<tool_call>\n{"name": "get_recipe", "arguments": {"dish": "soup"}}\n</tool_call>'
    content, calls = extract_tool_calls(text)
    assert content == "Let me look."
    assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_recipe"
    assert json.loads(calls[0]["function"]["arguments"]) == {"dish": "soup"}
    assert extract_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_streaming_holds_tool_call_text():
    assert _hold_tool_calls("hello <tool") == ("hello ", "<tool")
    assert _hold_tool_calls("hi <tool_call>{") == ("hi ", "<tool_call>{")
    assert _hold_tool_calls("a < b") == ("a < b", "")
