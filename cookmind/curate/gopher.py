"""The Gopher quality rules (Rae et al. 2021, "Scaling Language Models", appendix A.1.1).

Each rule has a name, a configurable bound, and a reason string when it fails, so the report
can say which rule removed how many documents. Words are whitespace-separated tokens.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import numpy as np

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
BULLETS = ("•", "-", "*", "·", "‣", "◦", "–")
ELLIPSES = ("...", "…")
# a line of code: ends in a bracket, ';' or ',', or is indented (extracted prose is not)
CODE_LINE = re.compile(r"[{}()\[\];,]$|^(\s{2,}|\t)\S")
CODE_LINES_SHARE = 0.25  # of a document's non-blank lines, for it to look like code


@dataclasses.dataclass
class GopherConfig:
    """Bounds of the Gopher rules; the defaults are the paper's."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1  # ("#" + ellipses) / words
    max_bullet_lines_ratio: float = 0.9  # lines starting with a bullet
    max_ellipsis_lines_ratio: float = 0.3  # lines ending in an ellipsis
    min_alpha_words_ratio: float = 0.8  # words with at least one letter
    min_stop_words: int = 2  # of STOP_WORDS
    max_dup_line_ratio: float = 0.3  # duplicated lines / lines
    max_dup_para_ratio: float = 0.3
    max_dup_line_char_ratio: float = 0.2  # chars in duplicated lines / chars
    max_dup_para_char_ratio: float = 0.2
    max_top_ngram_char_ratio: dict = dataclasses.field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    max_dup_ngram_char_ratio: dict = dataclasses.field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )

    @classmethod
    def from_dict(cls, d: dict | None) -> GopherConfig:
        """A config from a mapping; unknown keys are an error naming them. An n-gram bound given for some n
        (``max_dup_ngram_char_ratio: {5: 0.4}``) overrides that n's and keeps the others' defaults."""
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"gopher: unknown option(s) {unknown}; known: {sorted(known)}")
        defaults = cls()
        for key in ("max_top_ngram_char_ratio", "max_dup_ngram_char_ratio"):
            if key in d:
                d[key] = {**getattr(defaults, key), **{int(k): float(v) for k, v in d[key].items()}}
        return cls(**d)


def _duplicate_ratios(items: list[str]) -> tuple[float, float]:
    """(share of items that repeat an earlier one, share of characters in those repeats); blank items are none."""
    items = [x for x in items if x.strip()]
    if not items:
        return 0.0, 0.0
    seen: set[str] = set()
    dup_n = dup_chars = 0
    for x in items:
        if x in seen:
            dup_n += 1
            dup_chars += len(x)
        else:
            seen.add(x)
    total_chars = sum(len(x) for x in items)
    return dup_n / len(items), dup_chars / max(1, total_chars)


def _ngram_ids(word_ids: np.ndarray, n: int) -> np.ndarray:
    """One 64-bit id per word n-gram: h = sum_k w[i+k] * P^(n-1-k) mod 2^64 (collisions ~2^-64)."""
    prime = np.uint64(1_000_003)
    h = np.zeros(len(word_ids) - n + 1, dtype=np.uint64)
    for k in range(n):
        h = h * prime + word_ids[k : len(word_ids) - n + 1 + k]
    return h


def _ngram_rules(words: list[str], cfg: GopherConfig) -> list[str]:
    """The top-n-gram and duplicate-n-gram character-share rules."""
    reasons = []
    vocab: dict[str, int] = {}
    ids = np.fromiter((vocab.setdefault(w, len(vocab) + 1) for w in words), dtype=np.uint64, count=len(words))
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    total = int(lengths.sum())
    if total == 0:
        return reasons
    for n, bound in sorted(cfg.max_top_ngram_char_ratio.items()):
        if len(words) < n:
            continue
        grams = _ngram_ids(ids, n)
        uniq, first, counts = np.unique(grams, return_index=True, return_counts=True)
        if not len(counts):
            continue
        top = int(np.argmax(counts))
        if counts[top] < 2:
            continue
        start = int(first[top])
        # share of characters in the most frequent n-gram, counted at each occurrence
        ratio = int(lengths[start : start + n].sum()) * int(counts[top]) / total
        if ratio > bound:
            reasons.append(f"top_{n}gram_char_ratio")
    for n, bound in sorted(cfg.max_dup_ngram_char_ratio.items()):
        if len(words) < n:
            continue
        _, inverse, counts = np.unique(_ngram_ids(ids, n), return_inverse=True, return_counts=True)
        dup_starts = np.nonzero(counts[inverse] > 1)[0]
        if len(dup_starts) == 0:
            continue
        covered = np.zeros(len(words) + 1, dtype=np.int64)
        np.add.at(covered, dup_starts, 1)  # +1 where a duplicated n-gram starts
        np.add.at(covered, dup_starts + n, -1)  # -1 where it ends: a prefix sum marks covered words
        mask = np.cumsum(covered)[:-1] > 0
        if int(lengths[mask].sum()) / total > bound:
            reasons.append(f"dup_{n}gram_char_ratio")
    return reasons


def gopher_reasons(text: str, cfg: GopherConfig | None = None) -> list[str]:
    """Names of the Gopher rules ``text`` fails (empty list: it passes). ``text`` is one document (a record's
    text, or a plain text file's between its separators): an ``<|endoftext|>`` in it is a word like any other."""
    cfg = cfg or GopherConfig()
    words = text.split()
    n = len(words)
    if n < cfg.min_words:
        return ["too_few_words"]
    if n > cfg.max_words:
        return ["too_many_words"]
    reasons = []
    mean_len = sum(len(w) for w in words) / n
    if not cfg.min_mean_word_length <= mean_len <= cfg.max_mean_word_length:
        reasons.append("mean_word_length")
    symbols = text.count("#") + sum(text.count(e) for e in ELLIPSES)
    if symbols / n > cfg.max_symbol_word_ratio:
        reasons.append("symbol_word_ratio")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines:
        if sum(line.startswith(BULLETS) for line in lines) / len(lines) > cfg.max_bullet_lines_ratio:
            reasons.append("bullet_lines_ratio")
        if sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > cfg.max_ellipsis_lines_ratio:
            reasons.append("ellipsis_lines_ratio")
    if sum(any(c.isalpha() for c in w) for w in words) / n < cfg.min_alpha_words_ratio:
        reasons.append("alpha_words_ratio")
    lowered = Counter(w.lower().strip(".,;:!?\"'()") for w in words)
    if sum(1 for s in STOP_WORDS if lowered[s]) < cfg.min_stop_words:
        reasons.append("stop_words")
    line_dup, line_dup_chars = _duplicate_ratios(text.splitlines())
    para_dup, para_dup_chars = _duplicate_ratios(text.split("\n\n"))
    if line_dup > cfg.max_dup_line_ratio:
        reasons.append("dup_line_ratio")
    if para_dup > cfg.max_dup_para_ratio:
        reasons.append("dup_para_ratio")
    if line_dup_chars > cfg.max_dup_line_char_ratio:
        reasons.append("dup_line_char_ratio")
    if para_dup_chars > cfg.max_dup_para_char_ratio:
        reasons.append("dup_para_char_ratio")
    reasons += _ngram_rules(words, cfg)
    return reasons


def gopher_quality_filter(text: str, cfg: GopherConfig | None = None) -> bool:
    """True when ``text`` passes every Gopher rule."""
    return not gopher_reasons(text, cfg)


def looks_like_code(text: str) -> bool:
    """True when at least ``CODE_LINES_SHARE`` of ``text``'s non-blank lines look like code (``CODE_LINE``): source,
    or documentation with code blocks, which the rules above, written for prose, often remove."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return bool(lines) and sum(bool(CODE_LINE.search(line)) for line in lines) >= CODE_LINES_SHARE * len(lines)
