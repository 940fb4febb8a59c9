"""Stop strings for streaming: emit text as soon as it cannot be the start of a stop string.

A stop string can arrive split over several tokens ("<|us" + "er|>"), so the matcher holds
back the longest tail of the pending text that is a prefix of some stop string, and releases
it once the next piece shows it is not. The stop string itself is never emitted.
"""

from __future__ import annotations


class StopStringMatcher:
    """Feed decoded text pieces; get back the part safe to show and whether a stop string hit."""

    def __init__(self, stop_strings: list[str] | tuple[str, ...] = ()):
        bad = [s for s in stop_strings if not isinstance(s, str) or s == ""]
        if bad:
            raise ValueError(f"stop strings must be non-empty strings, got {bad!r}")
        self.stop_strings = tuple(stop_strings)
        self._pending = ""  # text received but not yet released
        self.stopped = False

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add a piece of text; return (text to emit now, stopped)."""
        if self.stopped:
            return "", True
        text = self._pending + piece
        if not self.stop_strings:
            self._pending = ""
            return text, False
        # earliest stop string occurrence wins; everything before it is emitted
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)], True
        hold = self._partial_suffix_len(text)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """At the end of generation nothing can complete a stop string: release what was held."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _partial_suffix_len(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
