"""Incremental detokenization: turn a growing list of token ids into text deltas.

Byte-level BPE tokens can end in the middle of a UTF-8 character; decoding such a prefix
yields U+FFFD. We wait until the character completes, and decode only a short window
(from the last clean boundary) so each step costs O(window), not O(sequence).

``skip_ids`` (control tokens, ``cookmind.infer.stop.control_token_ids``) are left out of the text, as Hugging Face's
``decode(skip_special_tokens=True)`` leaves them out: the deltas of a stream join into ``decode_text`` of the ids.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def decode_text(tokenizer, ids, skip_ids=frozenset()) -> str:
    """The text of ``ids`` without the tokens in ``skip_ids``."""
    return tokenizer.decode([int(t) for t in ids if int(t) not in skip_ids])


class IncrementalDetokenizer:
    """Keeps the ids of one output; ``add(token_id)`` returns the new text (maybe empty). Ids in ``skip_ids``
    add no text (and are not kept)."""

    def __init__(self, tokenizer, max_wait: int = 8, skip_ids=frozenset()):
        self.tokenizer = tokenizer
        self.skip_ids = frozenset(skip_ids)
        self.ids: list[int] = []  # the ids whose text is shown
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this were already emitted
        self._max_wait = max_wait  # give up waiting for a char to complete after this many tokens

    def add(self, token_id: int) -> str:
        if int(token_id) in self.skip_ids:
            return ""
        self.ids.append(int(token_id))
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix :])
        incomplete = full_text.endswith(REPLACEMENT) and len(self.ids) - self._read < self._max_wait
        if incomplete:
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        return delta

    @property
    def held(self) -> int:
        """Ids whose text is held back (an unfinished character)."""
        return len(self.ids) - self._read

    def flush(self) -> str:
        """At the end: whatever is still held back (an incomplete character becomes U+FFFD)."""
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text) :]

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)


def char_starts(pieces: list[bytes]) -> list[int]:
    """For each piece of a byte string (a token's bytes), where its text begins in the string's UTF-8 text (bad bytes
    read as "replace" reads them: each maximal bad sequence one U+FFFD): the index of the first character holding
    any of its bytes. A piece that only continues a character begun before it points at that character; a piece
    without bytes at the characters before it."""
    data = b"".join(pieces)
    ends, p = [], 0  # the byte after each character
    while p < len(data):
        n = next((n for n in range(1, 5) if _whole_char(data[p : p + n])), 0)
        if not n:  # a bad sequence: its maximal part, as the decoder's "replace" takes it
            try:
                data[p:].decode("utf-8")
            except UnicodeDecodeError as exc:
                n = exc.end
        p += max(n, 1)  # (a bad first byte is a sequence of at least one)
        ends.append(p)
    starts, at, char = [], 0, 0
    for piece in pieces:
        while char < len(ends) and ends[char] <= at:
            char += 1
        starts.append(char)
        at += len(piece)
    return starts


def _whole_char(data: bytes) -> bool:
    try:
        return len(data.decode("utf-8")) == 1
    except UnicodeDecodeError:
        return False
