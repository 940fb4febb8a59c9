"""Split streamed model text into reasoning (inside <think>...</think>) and answer content.

The chat template may open the think block in the prompt, so the splitter can start inside
it. Tags split across pieces are held back until they are complete or ruled out.
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
            tag = THINK_CLOSE if self.in_reasoning else THINK_OPEN
            i = text.find(tag)
            # an opening tag only counts before any visible answer text
            if i >= 0 and (self.in_reasoning or not self._seen_any_content and not text[:i].strip()):
                (reasoning if self.in_reasoning else content).append(text[:i] if self.in_reasoning else "")
                self.in_reasoning = not self.in_reasoning
                text = text[i + len(tag) :]
                self._after_close = not self.in_reasoning
                continue
            hold = _partial_suffix(text, tag)
            body, self._pending = text[: len(text) - hold], text[len(text) - hold :]
            if self.in_reasoning:
                reasoning.append(body)
            else:
                if self._after_close:
                    body = body.lstrip("\n")
                    self._after_close = not body
                if not self._seen_any_content and not body.strip() and hold:
                    self._pending = body + self._pending  # leading whitespace before a possible <think>
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


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
