"""From engine token events to what a client sees: text deltas, reasoning, stops, logprobs, tool calls.

One ``OutputProcessor`` per generated choice chains the text-side steps:
token id ─► incremental detokenizer ─► stop-string matcher (holds back partial matches)
         ─► reasoning splitter (<think>...</think> -> reasoning_content)
         ─► tool-call parser (when the request has tools: <tool_call> blocks -> tool_calls) ─► deltas

``skip_ids`` (control tokens) add no text; they still count as completion tokens and have logprobs.
A token's logprobs go out with its text: in the first delta with text after every step has released the text of the
tokens before (a stream's chunks then hold the logprobs of their text), and at the end the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cookmind.infer.detokenize import IncrementalDetokenizer, char_starts
from cookmind.infer.engine import FinishEvent, PromptLogprobsEvent, TokenEvent
from cookmind.infer.reasoning import ReasoningSplitter
from cookmind.infer.stop import StopStringMatcher
from cookmind.infer.tool_calls import ToolCallParser


@dataclass
class Delta:
    """What one event adds to a choice."""

    content: str = ""
    reasoning: str = ""
    logprobs: list[dict] = field(default_factory=list)  # per token: token, logprob, top
    prompt_logprobs: list[dict] | None = None  # per prompt token (echo): token, logprob (None first), top
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI tool calls completed by this event
    finish_reason: str | None = None
    error: str | None = None


class OutputProcessor:
    """Feed engine events of one choice; get Deltas. ``stopped_by_string`` tells the caller to cancel."""

    def __init__(
        self,
        tokenizer,
        stop_strings=(),
        split_reasoning: bool = True,
        prompt_ids: list[int] | None = None,
        parse_tool_calls: bool = False,
        max_tool_calls: int | None = None,
        skip_ids=frozenset(),
    ):
        self.tokenizer = tokenizer
        self.prompt_ids = prompt_ids  # for naming the tokens of a PromptLogprobsEvent
        self.skip_ids = frozenset(skip_ids)
        self.detok = IncrementalDetokenizer(tokenizer, skip_ids=self.skip_ids)
        self.stop = StopStringMatcher(list(stop_strings))
        self.reasoning = ReasoningSplitter() if split_reasoning else None
        self.tools = ToolCallParser(max_tool_calls) if parse_tool_calls else None
        self.completion_tokens = 0
        self.error: str | None = None  # why the engine failed this choice (finish reason "error")
        self.finish_reason: str | None = None
        self.stopped_by_string = False
        self.content_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.logprob_entries: list[dict] = []
        self._unsent_logprobs: list[dict] = []  # entries of tokens whose text a step still holds back
        self._starts: list[int] = []  # per entry: where its token's text begins in the detokenized output
        self._text_len = 0  # characters of detokenized output fed to the stop matcher so far
        # the tokens fed since the detokenizer last gave text (their entry or None, their bytes): when it gives the
        # held text, where each one's text begins in it
        self._unplaced: list[tuple[int | None, bytes]] = []
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
                "in_text": ev.token_id not in self.skip_ids,  # a left-out token takes no room in the text
            }
            self._unsent_logprobs.append(entry)
            self.logprob_entries.append(entry)
            self._starts.append(self._text_len)
        if ev.token_id not in self.skip_ids:
            slot = len(self._starts) - 1 if ev.logprob is not None else None
            self._unplaced.append((slot, self._token_bytes(ev.token_id)))
        piece = self.detok.add(ev.token_id)
        if piece:
            self._place(piece)
        held_before = len(self.stop.held)
        text, hit = self.stop.feed(piece)
        self._text_len += len(piece)
        self._route(text, delta)
        if hit:
            self.stopped_by_string = True
            # the text ends where the stop string begins: the tokens whose text starts there or later are not
            # the reply's, so their logprobs go too (they still count as generated tokens)
            self._drop_logprobs_from(self._text_len - len(piece) - held_before + len(text))
            tail = self._finish("stop")
            delta.content += tail.content
            delta.reasoning += tail.reasoning
            delta.tool_calls.extend(tail.tool_calls)
            delta.logprobs.extend(tail.logprobs)
            delta.finish_reason = "stop"
        elif (delta.content or delta.reasoning or delta.tool_calls) and not self._holding():
            delta.logprobs, self._unsent_logprobs = self._unsent_logprobs, []
        return delta

    def _token_bytes(self, token_id: int) -> bytes:
        decode_bytes = getattr(self.tokenizer, "decode_bytes", None)
        return bytes(decode_bytes([token_id])) if decode_bytes else self.tokenizer.decode([token_id]).encode()

    def _place(self, piece: str) -> None:
        """Where the text of each token fed since the last piece begins in ``piece``, the text they gave together: a
        token fed while the detokenizer held an unfinished character was placed where the output stood, one
        character early when that character turned out bad (its U+FFFD comes first)."""
        unplaced, self._unplaced = self._unplaced, []
        pieces = [b for _, b in unplaced]
        if b"".join(pieces).decode("utf-8", "replace") != piece:  # a window the detokenizer decoded otherwise
            return
        for (slot, _), start in zip(unplaced, char_starts(pieces)):
            if slot is not None:
                self._starts[slot] = self._text_len + start

    def _drop_logprobs_from(self, cut: int) -> None:
        """Leave out the entries of tokens whose text begins at character ``cut`` or later (a left-out token
        before the first of them stays: it came before the cut)."""
        first = next(
            (i for i, (e, at) in enumerate(zip(self.logprob_entries, self._starts)) if e["in_text"] and at >= cut),
            None,
        )
        if first is None:
            return
        gone = {id(e) for e in self.logprob_entries[first:]}
        del self.logprob_entries[first:], self._starts[first:]
        self._unsent_logprobs = [e for e in self._unsent_logprobs if id(e) not in gone]

    def _holding(self) -> bool:
        """Whether a step holds back text of the tokens fed so far (part of a character, a stop string, a tag or
        a tool call)."""
        return bool(
            self.detok.held
            or self.stop.held
            or (self.reasoning is not None and self.reasoning.held)
            or (self.tools is not None and self.tools.held)
        )

    def prompt_entries(self, ev: PromptLogprobsEvent) -> list[dict]:
        """The prompt's tokens as logprob entries; the first has logprob and top None (no context)."""
        ids = self.prompt_ids or []
        return [
            {
                "id": t,
                "token": self.tokenizer.decode([t]),
                "logprob": lp,
                "top": None if top is None else [(k, self.tokenizer.decode([k]), v) for k, v in top],
                "in_text": t not in self.skip_ids,
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
        delta.reasoning += r
        self.reasoning_parts.append(r)
        self._content(c, delta)

    def _content(self, text: str, delta: Delta) -> None:
        if self.tools is not None:
            text, calls = self.tools.feed(text)
            delta.tool_calls.extend(calls)
        delta.content += text
        self.content_parts.append(text)

    def _finish(self, reason: str, error: str | None = None) -> Delta:
        if not self.stop.stopped:
            # the detokenizer's held tokens (an unfinished character, U+FFFD now) may complete a stop string the
            # matcher holds the start of: the text is cut there, and the logprobs too, as a stop string mid-stream
            piece = self.detok.flush()
            if piece:
                self._place(piece)
            held_before = len(self.stop.held)
            text, hit = self.stop.feed(piece)
            self._text_len += len(piece)
            if hit:
                self.stopped_by_string = True
                self._drop_logprobs_from(self._text_len - len(piece) - held_before + len(text))
                reason = "stop" if reason == "length" else reason  # it ended at the stop string, as mid-stream
            delta = Delta(finish_reason=reason, error=error)
            self._route(text, delta)
        else:
            delta = Delta(finish_reason=reason, error=error)
        self._route(self.stop.flush(), delta)
        if self.reasoning is not None:
            r, c = self.reasoning.flush()
            delta.reasoning += r
            self.reasoning_parts.append(r)
            self._content(c, delta)
        if self.tools is not None:
            rest = self.tools.flush()
            delta.content += rest
            self.content_parts.append(rest)
        delta.logprobs, self._unsent_logprobs = self._unsent_logprobs, []
        self.finish_reason, self.error = reason, error
        return delta

    @property
    def content(self) -> str:
        return "".join(self.content_parts)

    @property
    def tool_calls(self) -> list[dict]:
        """The OpenAI tool calls parsed so far (none without parse_tool_calls)."""
        return self.tools.calls if self.tools is not None else []

    @property
    def reasoning_content(self) -> str:
        return "".join(self.reasoning_parts).strip("\n")
