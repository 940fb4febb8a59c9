"""From engine token events to what a client sees: text deltas, reasoning, stops, logprobs, tool calls.

One ``OutputProcessor`` per generated choice chains the text-side steps:
token id ─► incremental detokenizer ─► stop-string matcher (holds back partial matches)
         ─► reasoning splitter (<think>...</think> -> reasoning_content) ─► deltas
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from cookmind.infer.detokenize import IncrementalDetokenizer
from cookmind.infer.engine import FinishEvent, PromptLogprobsEvent, TokenEvent
from cookmind.infer.reasoning import ReasoningSplitter
from cookmind.infer.stop import StopStringMatcher


@dataclass
class Delta:
    """What one event adds to a choice."""

    content: str = ""
    reasoning: str = ""
    logprobs: list[dict] = field(default_factory=list)  # per token: token, logprob, top
    prompt_logprobs: list[dict] | None = None  # per prompt token (echo): token, logprob (None first), top
    finish_reason: str | None = None
    error: str | None = None


class OutputProcessor:
    """Feed engine events of one choice; get Deltas. ``stopped_by_string`` tells the caller to cancel."""

    def __init__(self, tokenizer, stop_strings=(), split_reasoning: bool = True, prompt_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.prompt_ids = prompt_ids  # for naming the tokens of a PromptLogprobsEvent
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop = StopStringMatcher(list(stop_strings))
        self.reasoning = ReasoningSplitter() if split_reasoning else None
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.stopped_by_string = False
        self.content_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.logprob_entries: list[dict] = []
        self.prompt_logprob_entries: list[dict] | None = None

    def feed(self, ev) -> Delta:
        if self.finish_reason is not None:
            return Delta()
        if isinstance(ev, FinishEvent):
            return self._finish(ev.reason, ev.error)
        if isinstance(ev, PromptLogprobsEvent):
            self.prompt_logprob_entries = self.prompt_entries(ev)
            return Delta(prompt_logprobs=self.prompt_logprob_entries)
        assert isinstance(ev, TokenEvent)
        self.completion_tokens += 1
        delta = Delta()
        if ev.logprob is not None:
            entry = {
                "id": ev.token_id,
                "token": self.tokenizer.decode([ev.token_id]),
                "logprob": ev.logprob,
                "top": [(t, self.tokenizer.decode([t]), lp) for t, lp in (ev.top_logprobs or [])],
            }
            delta.logprobs.append(entry)
            self.logprob_entries.append(entry)
        text, hit = self.stop.feed(self.detok.add(ev.token_id))
        self._route(text, delta)
        if hit:
            self.stopped_by_string = True
            tail = self._finish("stop")
            delta.content += tail.content
            delta.reasoning += tail.reasoning
            delta.finish_reason = "stop"
        return delta

    def prompt_entries(self, ev: PromptLogprobsEvent) -> list[dict]:
        """The prompt's tokens as logprob entries; the first has logprob and top None (no context)."""
        ids = self.prompt_ids or []
        return [
            {
                "id": t,
                "token": self.tokenizer.decode([t]),
                "logprob": lp,
                "top": None if top is None else [(k, self.tokenizer.decode([k]), v) for k, v in top],
            }
            for t, lp, top in zip(ids, ev.logprobs, ev.top)
        ]

    def _route(self, text: str, delta: Delta) -> None:
        if not text:
            return
        if self.reasoning is None:
            r, c = "", text
        else:
            r, c = self.reasoning.feed(text)
        delta.content += c
        delta.reasoning += r
        self.content_parts.append(c)
        self.reasoning_parts.append(r)

    def _finish(self, reason: str, error: str | None = None) -> Delta:
        delta = Delta(finish_reason=reason, error=error)
        if not self.stop.stopped:
            text, _ = self.stop.feed(self.detok.flush())
            self._route(text, delta)
        self._route(self.stop.flush(), delta)
        if self.reasoning is not None:
            r, c = self.reasoning.flush()
            delta.content += c
            delta.reasoning += r
            self.content_parts.append(c)
            self.reasoning_parts.append(r)
        self.finish_reason = reason
        return delta

    @property
    def content(self) -> str:
        return "".join(self.content_parts)

    @property
    def reasoning_content(self) -> str:
        return "".join(self.reasoning_parts).strip("\n")


TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def extract_tool_calls(content: str) -> tuple[str, list[dict]]:
    """Pull <tool_call>{"name", "arguments"}</tool_call> blocks (the chat template's format) out of
    the content; return (remaining content, OpenAI tool_calls). Unparseable blocks stay as text."""
    calls, keep = [], []
    last = 0
    for m in TOOL_CALL_RE.finditer(content):
        try:
            obj = json.loads(m.group(1))
            name, args = obj["name"], obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue
        keep.append(content[last : m.start()])
        last = m.end()
        calls.append(
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": str(name), "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    keep.append(content[last:])
    return "".join(keep).strip(), calls
