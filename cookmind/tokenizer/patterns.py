"""Pre-tokenization patterns and where text may be cut without changing the pre-tokens.

A BPE merge never crosses a pre-token boundary, so the regex that splits text into
pre-tokens decides what a token can be. Two named patterns ship: GPT-2's and the
GPT-4 (cl100k) one; any other regex string is accepted as is.

Cutting text into pieces (for parallel counting, de-duplication and streaming) is exact only
at a *safe cut*: a position p where the pre-tokens of text[:p] and text[p:] together equal
the pre-tokens of the whole text. For both named patterns every match is a run that never
continues from a letter/number (GPT-4) or from any non-space (GPT-2) into a following
whitespace char, and no alternative looks behind, so "safe char, then whitespace" is a cut.
(Checked over all code points: `c.isalnum()` implies `[\\p{L}\\p{N}]`, and `\\s` implies
`c.isspace()`.) Custom patterns get no safe cuts beyond special tokens.
"""

from __future__ import annotations

import regex

# GPT-2: contractions, letters, numbers, other symbols, each with one optional leading space.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GPT-4 (cl100k): case-insensitive contractions, numbers in groups of at most 3 digits, and
# punctuation that absorbs following newlines.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}


# letters, digits, punctuation, symbols and every kind of whitespace, in several scripts: a pattern whose
# matches do not add up to this string would drop the text between them when encoding
COVERAGE_PROBE = (
    "Hello, World! it's 42+3.14 = 45.14\n\n\tcafé Straße 漢字 カタカナ 🙂 <a href='x'>\"q\"</a> a_b-c\r\n  end  "
)


def resolve_pattern(name_or_regex: str, check_covers: bool = False) -> str:
    """Return the regex for a named pattern ("gpt2", "gpt4") or the given regex after checking it compiles.

    check_covers (training a tokenizer): also refuse a regex whose matches, as the encoder takes them
    (``findall``), do not add up to the text on ``COVERAGE_PROBE``: the text between matches would be dropped.
    """
    if name_or_regex in PATTERNS:
        return PATTERNS[name_or_regex]
    try:
        compiled = regex.compile(name_or_regex)
    except regex.error as exc:
        raise ValueError(
            f"pre-tokenization pattern {name_or_regex!r} is neither a known name {sorted(PATTERNS)} "
            f"nor a valid regex ({exc}); pass 'gpt2', 'gpt4' or a regex the `regex` module accepts"
        ) from None
    if check_covers:
        if compiled.groups:
            raise ValueError(
                f"pre-tokenization pattern {name_or_regex!r} has capturing groups, so the encoder would keep only "
                "what they capture: write its groups as (?:...)"
            )
        covered = bytearray(len(COVERAGE_PROBE))
        for m in compiled.finditer(COVERAGE_PROBE):
            covered[m.start() : m.end()] = b"\1" * (m.end() - m.start())
        dropped = "".join(dict.fromkeys(c for c, k in zip(COVERAGE_PROBE, covered, strict=True) if not k))
        if dropped:
            raise ValueError(
                f"pre-tokenization pattern {name_or_regex!r} does not match all text: on a test string it leaves "
                f"{len(covered) - sum(covered)} of {len(covered)} characters unmatched (such as {dropped[:12]!r}), "
                "and the encoder would drop them; end it with alternatives that take anything else, e.g. '...|\\s+|.'"
            )
    return name_or_regex


def safe_cut_kind(pattern: str) -> str | None:
    """Which characters may end a piece just before whitespace: "nonspace" (GPT-2), "alnum" (GPT-4), or None."""
    if pattern == GPT2_PATTERN:
        return "nonspace"
    if pattern == GPT4_PATTERN:
        return "alnum"
    return None


def is_safe_end(ch: str, kind: str | None) -> bool:
    """True when a piece ending in `ch` may be cut before a following whitespace character."""
    if kind == "nonspace":
        return not ch.isspace()
    if kind == "alnum":
        return ch.isalnum()
    return False


def safe_end_bytes(kind: str | None) -> frozenset[int]:
    """ASCII bytes that may precede a cut before b'\\n' in raw UTF-8 (a conservative byte-level version)."""
    if kind == "nonspace":
        return frozenset(range(0x21, 0x7F))
    if kind == "alnum":
        return frozenset(b for b in range(0x80) if chr(b).isalnum())
    return frozenset()
