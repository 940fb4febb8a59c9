"""GPT-2's reversible map from bytes to printable characters, used by vocab.json/merges.txt and tokenizer.json."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """Map each byte 0..255 to one printable character.

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, ...) map to
    chr(256 + n) in byte order, so every token can be written as a visible string (" the" -> "Ġthe").
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of bytes_to_unicode."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_str(token: bytes) -> str:
    """Write a byte token in GPT-2's printable form."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def str_to_token(text: str) -> bytes:
    """Read a token written in GPT-2's printable form back into bytes (KeyError on a foreign character)."""
    table = unicode_to_bytes()
    return bytes(table[c] for c in text)


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (no character, so no UTF-8: JSON's "\\ud800" reads as one) as U+FFFD, as
    tiktoken's ``encode`` reads it; two surrogates of a pair written apart become their character, as there."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
