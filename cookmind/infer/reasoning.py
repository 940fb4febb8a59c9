"""Split streamed model text into reasoning (inside <think>...</think>) and answer content.

The chat template may open the think block in the prompt, so the splitter can start inside
it. Tags split across pieces are held back until they are complete or ruled out. A tag counts only before any
answer text: a ``</think>`` there with no ``<think>`` closes a block the model never opened and is not shown; after
answer text, either tag is text (the model writing about it).
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ReasoningSplitter:
    """``feed(piece) -> (reasoning_delta, content_delta)``; ``flush()`` at the end."""

    def __init__(self, start_in_reasoning: bool = False):
        self.in_reasoning = start_in_reasoning
        self._seen_any_content = False
        self._pending = ""
        self._after_close = False  # drop the newlines the template puts after </think>

    def feed(self, piece: str) -> tuple[str, str]:
        text = self._pending + piece
        self._pending = ""
        reasoning, content = [], []
        while text:
            if self.in_reasoning:
                i = text.find(THINK_CLOSE)
                if i >= 0:
                    reasoning.append(text[:i])
                    self.in_reasoning, self._after_close = False, True
                    text = text[i + len(THINK_CLOSE) :]
                    continue
                hold = _partial_suffix(text, THINK_CLOSE)
                reasoning.append(text[: len(text) - hold])
                self._pending = text[len(text) - hold :]
                break
            # a tag counts only before any visible answer text: <think> opens the reasoning, and a </think> with none
            # open closes a block the model never opened (dropped, as the template's "</think>\n\n" is); later, text
            tag = None if self._seen_any_content else _first_tag(text)
            if tag is not None and not text[: text.find(tag)].strip():
                self.in_reasoning, self._after_close = tag == THINK_OPEN, tag == THINK_CLOSE
                text = text[text.find(tag) + len(tag) :]
                continue
            hold = 0 if self._seen_any_content else max(_partial_suffix(text, t) for t in (THINK_OPEN, THINK_CLOSE))
            body, self._pending = text[: len(text) - hold], text[len(text) - hold :]
            if self._after_close:
                body = body.lstrip("\n")
                self._after_close = not body
            if not self._seen_any_content and not body.strip():
                self._pending = body + self._pending  # leading whitespace: a tag may follow
                body = ""
            content.append(body)
            self._seen_any_content |= bool(body.strip())
            break
        return "".join(reasoning), "".join(content)

    @property
    def held(self) -> str:
        """The text held back (it may begin a tag, or be whitespace before a <think>)."""
        return self._pending

    def flush(self) -> tuple[str, str]:
        rest, self._pending = self._pending, ""
        return (rest, "") if self.in_reasoning else ("", rest)


def split_reasoning(text: str, start_in_reasoning: bool = False) -> tuple[str, str]:
    """Whole-text version: (reasoning_content, content)."""
    splitter = ReasoningSplitter(start_in_reasoning)
    r, c = splitter.feed(text)
    r2, c2 = splitter.flush()
    return (r + r2).strip("\n"), c + c2


def _first_tag(text: str) -> str | None:
    """The think tag that occurs first in text, or None."""
    found = [(text.find(t), t) for t in (THINK_OPEN, THINK_CLOSE) if t in text]
    return min(found)[1] if found else None


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
