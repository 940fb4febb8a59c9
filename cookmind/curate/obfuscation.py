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
_LOOKALIKE = {"@": "a", "4": "a", "$": "s", "5": "s", "0": "o", "1": "[il]", "!": "[il]", "|": "[il]", "3": "e",
              "7": "t", "*": "[a-z]", "#": "[a-z]"}

# A candidate token: letters and disguise characters, with at least one letter.
_TOKEN = re.compile(r"(?<![\w@$*#!|])[a-z0-9@$*#!|]*[a-z][a-z0-9@$*#!|]*(?![\w@$*#!|])", re.IGNORECASE)
_DISGUISED = re.compile(r"[0-9@$*#!|]|([a-z])\1\1", re.IGNORECASE)
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

    def token(m: re.Match) -> str:
        nonlocal count
        tok = m.group(0)
        core = tok.rstrip("!")  # a trailing "!" is punctuation, not an "i"
        if not _DISGUISED.search(core):
            return tok
        word = _resolve(core.lower(), vocabulary)
        if word is None or word == core.lower():
            return tok
        count += 1
        return word + tok[len(core):]

    text = _SPACED.sub(spaced, text)
    return _TOKEN.sub(token, text), count


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
