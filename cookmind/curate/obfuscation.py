"""Undo the common ways a word is disguised to slip past a filter: "F*CKING", "$h1t", "f u c k", "fuuuuck".

A token is rewritten only when its disguised form matches a word of a given vocabulary (the harmful-content
lexicon), so clean text passes through unchanged: "100", "mp3", "Scunthorpe" and "cocktail" stay as they are.
Each disguise character stands for the letters it imitates (``*`` and ``#`` for any one letter), and a run of
three or more equal characters stands for a run of one up to that many.
"""

from __future__ import annotations

import functools
import re

# What each disguise character may stand for (a regex class).
_LOOKALIKE = {
    "@": "a",
    "4": "a",
    "$": "s",
    "5": "s",
    "0": "o",
    "1": "[il]",
    "!": "[il]",
    "|": "[il]",
    "3": "e",
    "7": "t",
    "*": "[a-z]",
    "#": "[a-z]",
}

# Where a disguised token may be: a letter beside a disguise character, or a run of three equal letters.
# Only these spots are grown into tokens and looked at in Python; plain words are never visited.
_HINT = re.compile(r"[a-z][0-9@$*#!|]|[0-9@$*#!|][a-z]|([a-z])\1\1", re.IGNORECASE)
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@$*#!|")
# Single characters split by one separator each, three or more of them: "f u c k", "s.e.x", "f-u-c-k".
_SPACED = re.compile(r"(?<![\w@$*#])(?:[a-z0-9@$*#][ .\-_]){2,}[a-z0-9@$*#](?![\w@$*#])", re.IGNORECASE)


def deobfuscate(text: str, vocabulary: frozenset[str]) -> tuple[str, int]:
    """(``text`` with disguised ``vocabulary`` words written plainly in lower case, how many were rewritten)."""
    count = 0

    def spaced(m: re.Match) -> str:
        nonlocal count
        word = _resolve(re.sub(r"[ .\-_]", "", m.group(0)).lower(), vocabulary)
        count += word is not None
        return word or m.group(0)

    text = _SPACED.sub(spaced, text)
    spans = []
    for m in _HINT.finditer(text):
        a, b = m.start(), m.end()
        if spans and a < spans[-1][1]:
            continue  # inside the token just taken
        while a > 0 and text[a - 1] in _TOKEN_CHARS:
            a -= 1
        while b < len(text) and text[b] in _TOKEN_CHARS:
            b += 1
        if _in_word(text[a - 1 : a]) or _in_word(text[b : b + 1]):
            continue  # part of a longer word (non-ASCII letters, underscores): not a token of its own
        spans.append((a, b))
    parts, last = [], 0
    for a, b in spans:
        tok = text[a:b]
        core = tok.rstrip("!")  # a trailing "!" is punctuation, not an "i"
        word = _resolve(core.lower(), vocabulary)
        if word is None or word == core.lower():
            continue
        count += 1
        parts += [text[last:a], word, tok[len(core) :]]
        last = b
    return "".join(parts) + text[last:], count


def _in_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _resolve(token: str, vocabulary: frozenset[str]) -> str | None:
    """The vocabulary word ``token`` (lower case) disguises, or None; needs a real letter in it."""
    if token in vocabulary:
        return token
    if not any("a" <= c <= "z" for c in token):
        return None
    pattern = _pattern(token)
    # a run may stand for a shorter one ("fuuuck"), so such a token can be any length; otherwise its own length
    candidates = sorted(vocabulary) if re.search(r"(.)\1\1", token) else _by_length(vocabulary).get(len(token), ())
    return next((w for w in candidates if pattern.fullmatch(w)), None)


@functools.lru_cache(maxsize=4096)
def _pattern(token: str) -> re.Pattern:
    parts = []
    for m in re.finditer(r"(.)\1*", token):
        c, n = m.group(1), len(m.group(0))
        cls = _LOOKALIKE.get(c, re.escape(c))
        parts.append(f"{cls}{{1,{n}}}" if n >= 3 else cls * n)
    return re.compile("".join(parts))


@functools.lru_cache(maxsize=8)
def _by_length(vocabulary: frozenset[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for w in sorted(vocabulary):
        out.setdefault(len(w), []).append(w)
    return out
