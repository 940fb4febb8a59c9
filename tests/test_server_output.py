"""The per-choice output chain (detokenize -> stop strings -> reasoning); tool calls: tests/test_tool_calls.py."""

from __future__ import annotations

from cookmind.infer.engine import FinishEvent, TokenEvent
from cookmind.infer.output import OutputProcessor


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
