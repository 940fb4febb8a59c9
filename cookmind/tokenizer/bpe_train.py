"""Byte-level BPE training: learn merges from pre-token counts with incremental pair updates.

Vocabulary ids: 0..255 are the single bytes (id == byte value), then the special tokens in the
order given (256, 257, ...), then one id per new token in merge order. A merge whose bytes
already exist as a token reuses that id (as Hugging Face `tokenizers` does), so ids stay unique
per byte string; training stops when the vocabulary holds vocab_size tokens or no pair is left.

Each step merges the most frequent adjacent pair; ties go to the lexicographically greatest
pair (bytes_a, bytes_b). Counts are updated only for words that contain the merged pair,
found through a pair -> words index; a lazy max-heap gives the next pair.
"""

from __future__ import annotations

import heapq
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.patterns import resolve_pattern
from cookmind.tokenizer.pretokenize import ReadCounts, count_pretokens

if TYPE_CHECKING:
    from cookmind.store.records import SkippedRecords

Merge = tuple[bytes, bytes]


def _desc(token: bytes) -> tuple[int, ...]:
    """A key that sorts byte strings in *descending* order: bytes flipped, then a terminator above all bytes."""
    return (*(255 - b for b in token), 256)


def initial_vocab(special_tokens: Sequence[str]) -> dict[int, bytes]:
    """256 single bytes (id = byte value), then the special tokens in order."""
    vocab = {i: bytes([i]) for i in range(256)}
    for s in special_tokens:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab


def check_specials(special_tokens: Sequence[str] | None) -> list[str]:
    """Validate special tokens (non-empty strings) and drop repeats, keeping the first order."""
    out: list[str] = []
    for s in special_tokens or []:
        if not isinstance(s, str) or not s:
            raise TokenizerError(f"special token {s!r} must be a non-empty string")
        if s not in out:
            out.append(s)
    return out


def learn_merges(
    word_counts: dict[bytes, int], vocab: dict[int, bytes], vocab_size: int, progress: bool | None = None
) -> list[Merge]:
    """Merge pairs until `vocab` holds vocab_size tokens; mutates `vocab`, returns the merges in order."""
    from tqdm import tqdm

    # A pair (a, b) is keyed by the int a << SHIFT | b: cheaper to hash than a tuple.
    shift = max(vocab_size, len(vocab), 256).bit_length()
    mask = (1 << shift) - 1
    words: list[list[int]] = [list(w) for w in word_counts]  # byte values are the byte tokens' ids
    freqs: list[int] = list(word_counts.values())
    pair_counts: dict[int, int] = defaultdict(int)
    # pair -> indices of words that contain it (may repeat, may be stale: checked when used); lists are
    # far smaller than sets and most pairs occur in few words
    pair_words: dict[int, list[int]] = defaultdict(list)
    for wi, w in enumerate(words):
        f = freqs[wi]
        for x, y in zip(w, w[1:]):
            p = x << shift | y
            pair_counts[p] += f
            pair_words[p].append(wi)
    key = {i: _desc(b) for i, b in vocab.items()}
    heap = [(-c, key[p >> shift], key[p & mask], p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    by_bytes = {b: i for i, b in vocab.items() if i < 256}
    by_bytes.update({b: i for i, b in vocab.items() if i >= 256 and b not in by_bytes})
    specials = set(range(256, len(vocab)))
    merges: list[Merge] = []
    bar = tqdm(
        total=max(0, vocab_size - len(vocab)),
        desc="merges",
        unit="merge",
        disable=True if progress is False else None,
        leave=False,
    )
    while len(vocab) < vocab_size and heap:
        negc, _, _, ab = heapq.heappop(heap)
        if negc == 0 or pair_counts.get(ab, 0) != -negc:
            continue  # stale heap entry
        a, b = ab >> shift, ab & mask
        new_bytes = vocab[a] + vocab[b]
        c = by_bytes.get(new_bytes)
        if c is None or c in specials:
            c = len(vocab)
            vocab[c] = new_bytes
            by_bytes[new_bytes] = c
            key[c] = _desc(new_bytes)
            bar.update(1)
        merges.append((vocab[a], vocab[b]))
        c_hi = c << shift
        delta: dict[int, int] = defaultdict(int)
        for wi in dict.fromkeys(pair_words.pop(ab, ())):  # unique, in first-seen order
            w, f = words[wi], freqs[wi]
            i = 0
            while True:
                try:
                    i = w.index(a, i)
                except ValueError:
                    break
                if i + 1 < len(w) and w[i + 1] == b:
                    # only the neighbours change: (prev, a) -> (prev, c) and (b, next) -> (c, next)
                    delta[ab] -= f
                    if i > 0:
                        prev = w[i - 1] << shift
                        delta[prev | a] -= f
                        delta[prev | c] += f
                        pair_words[prev | c].append(wi)
                    if i + 2 < len(w):
                        nxt = w[i + 2]
                        delta[(b << shift) | nxt] -= f
                        delta[c_hi | nxt] += f
                        pair_words[c_hi | nxt].append(wi)
                    w[i] = c
                    del w[i + 1]
                i += 1
        for p, d in delta.items():
            if d:
                cnt = pair_counts[p] + d
                if cnt > 0:
                    pair_counts[p] = cnt
                    heapq.heappush(heap, (-cnt, key[p >> shift], key[p & mask], p))
                else:
                    del pair_counts[p]
                    pair_words.pop(p, None)
        if len(heap) > 4 * len(pair_counts) + 100_000:  # mostly stale entries: rebuild to bound memory
            heap = [(-cnt, key[p >> shift], key[p & mask], p) for p, cnt in pair_counts.items()]
            heapq.heapify(heap)
    bar.close()
    return merges


def train_bpe(
    input_path: str | os.PathLike | Sequence[str | os.PathLike],
    vocab_size: int,
    special_tokens: Sequence[str] | None = None,
    *,
    pattern: str = "gpt2",
    workers: int | None = None,
    utf8_errors: str = "strict",
    chunk_bytes: int = 4 << 20,
    progress: bool | None = None,
    text_field: str = "text",
    skipped: SkippedRecords | None = None,
    read: ReadCounts | None = None,
) -> tuple[dict[int, bytes], list[Merge]]:
    """Train a byte-level BPE on one or more inputs: UTF-8 text files, or what ``pack`` reads besides (JSON lines,
    JSON, Parquet: each record's ``text_field``; gzip; ``cookmind curate run`` output folders).

    Returns (vocab: id -> bytes, merges in creation order). Ids: bytes 0..255, then the special
    tokens in order, then merged tokens. Raises TokenizerError for a missing file, an empty
    corpus, a vocab_size below 256 + len(special_tokens), or non-UTF-8 bytes (unless
    utf8_errors="replace", which reads them as U+FFFD), or a bad JSON / Parquet record, unless ``skipped``
    (a ``SkippedRecords``) is given: bad records are then counted there and left out. ``read`` (a ``ReadCounts``),
    where given, is filled with the files, records and bytes of text read, so a caller can report them.
    """
    specials = check_specials(special_tokens)
    pattern = resolve_pattern(pattern, check_covers=True)
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials):
        raise TokenizerError(
            f"vocab_size {vocab_size!r} is too small: the 256 byte tokens and {len(specials)} special tokens "
            f"already take {256 + len(specials)} ids; pass vocab_size >= {256 + len(specials)}"
        )
    counts = count_pretokens(
        input_path,
        specials,
        pattern,
        workers=workers,
        chunk_bytes=chunk_bytes,
        utf8_errors=utf8_errors,
        progress=progress,
        text_field=text_field,
        skipped=skipped,
        read=read,
    )
    inputs = input_path if isinstance(input_path, (str, os.PathLike)) else ", ".join(map(str, input_path))
    if not counts and skipped is not None and skipped.count:
        raise TokenizerError(f"no record of {inputs} was good: {skipped.summary()}")
    if not counts:
        raise TokenizerError(
            f"the corpus {inputs} has no text outside special tokens; give files with text to learn from"
        )
    word_counts: dict[bytes, int] = {}
    for tok, n in counts.items():
        word_counts[tok.encode("utf-8")] = word_counts.get(tok.encode("utf-8"), 0) + n
    vocab = initial_vocab(specials)
    merges = learn_merges(word_counts, vocab, vocab_size, progress=progress)
    return vocab, merges
