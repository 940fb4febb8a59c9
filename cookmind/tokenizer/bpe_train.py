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


_FLIP = {i: 255 - i for i in range(256)}


def _desc(token: bytes) -> str:
    """A key that sorts byte strings in *descending* order: bytes flipped, then a terminator above all bytes.

    A str, so a pair's key is the two tokens' keys concatenated (the terminator keeps that equal to comparing
    the tokens one after the other) and compares in C."""
    return token.decode("latin-1").translate(_FLIP) + "\u0100"


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

    # A word is a str whose characters are token ids (chr(id)): byte values are the byte tokens' ids, so the
    # latin-1 decoding of its bytes; a pair is the 2-character str of its two ids. Finding and replacing a pair in
    # a word then runs in C (str.find, str.replace), and a pair key hashes as cheaply as an int.
    words: list[str] = [w.decode("latin-1") for w in word_counts]
    freqs: list[int] = list(word_counts.values())
    # pair -> indices of words that contain it (may repeat, may be stale: checked when used); lists are
    # far smaller than sets and most pairs occur in few words. An index repeats once per occurrence, so a
    # pair's count is the sum of its words' frequencies over the list.
    pair_words: defaultdict[str, list[int]] = defaultdict(list)
    for wi, w in enumerate(words):
        for p in map(str.__add__, w, w[1:]):
            pair_words[p].append(wi)
    pair_counts: dict[str, int] = {p: sum(map(freqs.__getitem__, ws)) for p, ws in pair_words.items()}
    key = {chr(i): _desc(b) for i, b in vocab.items()}  # token char -> its descending sort key
    # Max-heap on (count, pair bytes): entries (-count, key(a) + key(b), pair). Lazy: a count that fell is not
    # pushed again; an entry whose count is above the pair's is pushed again with the true count when it comes
    # up, one below it is dropped (a higher one exists). So every pair has an entry at or above its count, and
    # an entry that comes up with its pair's count is the most frequent pair, ties to the greatest bytes.
    heap = [(-c, key[p[0]] + key[p[1]], p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
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
        negc, _, ab = heappop(heap)
        cnt = pair_counts.get(ab)
        if cnt != -negc:  # stale entry: the pair is gone, or its count changed
            if cnt is not None and cnt < -negc:
                heappush(heap, (-cnt, key[ab[0]] + key[ab[1]], ab))
            continue
        a, b = ab
        bytes_a, bytes_b = vocab[ord(a)], vocab[ord(b)]
        new_bytes = bytes_a + bytes_b
        c = by_bytes.get(new_bytes)
        if c is None or c in specials:
            c = len(vocab)
            vocab[c] = new_bytes
            by_bytes[new_bytes] = c
            bar.update(1)
        merges.append((bytes_a, bytes_b))
        C = chr(c)
        key[C] = _desc(new_bytes)
        # every occurrence of ab goes (a new id is never a nor b), so its count is 0 whatever the deltas say
        del pair_counts[ab]
        delta: defaultdict[str, int] = defaultdict(int)
        for wi in dict.fromkeys(pair_words.pop(ab, ())):  # unique, in first-seen order
            w = words[wi]
            i = w.find(ab)
            if i < 0:
                continue
            f = freqs[wi]
            j = w.find(ab, i + 2)
            if j < 0:  # one occurrence (the common case): only its neighbours change
                if i:
                    x = w[i - 1]
                    delta[x + a] -= f
                    p = x + C
                    delta[p] += f
                    pair_words[p].append(wi)
                if i + 2 < len(w):
                    y = w[i + 2]
                    delta[b + y] -= f
                    p = C + y
                    delta[p] += f
                    pair_words[p].append(wi)
                words[wi] = w[:i] + C + w[i + 2 :]
            else:
                # left to right as str.replace merges: an occurrence's left neighbour is read from the merged
                # word (it may be C), its right one from the word before (the next occurrence's left counts it)
                nw = w.replace(ab, C)
                n = len(w)
                k = 0
                while i >= 0:
                    if i > k:
                        x = nw[i - k - 1]
                        delta[x + a] -= f
                        p = x + C
                        delta[p] += f
                        pair_words[p].append(wi)
                    if i + 2 < n:
                        y = w[i + 2]
                        delta[b + y] -= f
                        p = C + y
                        delta[p] += f
                        pair_words[p].append(wi)
                    k += 1
                    i = w.find(ab, i + 2)
                words[wi] = nw
        delta.pop(ab, None)
        for p, d in delta.items():
            if d > 0:
                cnt = pair_counts.get(p, 0) + d
                pair_counts[p] = cnt
                heappush(heap, (-cnt, key[p[0]] + key[p[1]], p))
            elif d:
                cnt = pair_counts[p] + d
                if cnt > 0:
                    pair_counts[p] = cnt
                else:
                    del pair_counts[p]
                    pair_words.pop(p, None)
        if len(heap) > 4 * len(pair_counts) + 100_000:  # mostly stale entries: rebuild to bound memory
            heap = [(-cnt, key[p[0]] + key[p[1]], p) for p, cnt in pair_counts.items()]
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
