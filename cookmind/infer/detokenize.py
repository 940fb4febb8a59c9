"""Incremental detokenization: turn a growing list of token ids into text deltas.

Byte-level BPE tokens can end in the middle of a UTF-8 character; decoding such a prefix
yields U+FFFD. We wait until the character completes, and decode only a short window
(from the last clean boundary) so each step costs O(window), not O(sequence).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Keeps the ids of one output; ``add(token_id)`` returns the new text (maybe empty)."""

    def __init__(self, tokenizer, max_wait: int = 8):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this were already emitted
        self._max_wait = max_wait  # give up waiting for a char to complete after this many tokens

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix :])
        incomplete = full_text.endswith(REPLACEMENT) and len(self.ids) - self._read < self._max_wait
        if incomplete:
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        return delta

    def flush(self) -> str:
        """At the end: whatever is still held back (an incomplete character becomes U+FFFD)."""
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text) :]

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)
