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
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.patterns import resolve_pattern
from cookmind.tokenizer.pretokenize import ReadCounts, count_pretokens

if TYPE_CHECKING:
    from cookmind.store.records import SkippedRecords

Merge = tuple[bytes, bytes]
_MIN_SITES = 64  # _merge_arrays merges while the pairs merged start at this many places or more (a running mean)


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
    """Validate special tokens (strings of two bytes or more) and drop repeats, keeping the first order. A one-byte
    special would be the byte token it spells: the Tokenizer gave it an id past the vocabulary instead (--vocab-size
    500 gave 501 ids, and ids 256.. no longer in order)."""
    out: list[str] = []
    for s in special_tokens or []:
        if not isinstance(s, str) or not s:
            raise TokenizerError(f"special token {s!r} must be a non-empty string")
        if len(s.encode("utf-8")) == 1:
            raise TokenizerError(
                f"special token {s!r} is one byte, which is already the byte token {ord(s)}: a special token needs "
                f"two bytes or more (e.g. {'<|' + s + '|>'!r})"
            )
        if s not in out:
            out.append(s)
    return out


class _Vocab:
    """The growing vocabulary: each merge's new (or reused) id, its sort key, and the merges in order."""

    def __init__(self, vocab: dict[int, bytes], vocab_size: int, progress: bool | None) -> None:
        from cookmind.progress import is_terminal, progress_bar

        self.vocab, self.size = vocab, vocab_size
        self.key = {chr(i): _desc(b) for i, b in vocab.items()}  # token char -> its descending sort key
        self.by_bytes = {b: i for i, b in vocab.items() if i < 256}
        self.by_bytes.update({b: i for i, b in vocab.items() if i >= 256 and b not in self.by_bytes})
        self.specials = set(range(256, len(vocab)))
        self.merges: list[Merge] = []
        self.bar = progress_bar(
            total=max(0, vocab_size - len(vocab)),
            desc="merges",
            unit="merge",
            enabled=is_terminal(sys.stderr)
            if progress is None
            else progress,  # None: a terminal only; True: a pipe too
            leave=not is_terminal(sys.stderr),  # goes when done on a terminal; a log keeps its first and last lines
        )

    def full(self) -> bool:
        return len(self.vocab) >= self.size

    def merge(self, a: int, b: int) -> int:
        """Record the merge of tokens a and b; returns the id of the merged token (new, or the one with its bytes)."""
        vocab = self.vocab
        bytes_a, bytes_b = vocab[a], vocab[b]
        new_bytes = bytes_a + bytes_b
        c = self.by_bytes.get(new_bytes)
        if c is None or c in self.specials:
            c = len(vocab)
            vocab[c] = new_bytes
            self.by_bytes[new_bytes] = c
            self.bar.update(1)
        self.merges.append((bytes_a, bytes_b))
        self.key[chr(c)] = _desc(new_bytes)
        return c


def _merge_arrays(
    words: list[bytes], freqs: list[int], v: _Vocab, min_sites: int
) -> tuple[list[str], defaultdict[str, list[int]], dict[str, int]] | None:
    """The first merges, while each touches many words, in numpy over all words' symbols at once.

    Symbols lie in one array, word after word, each word followed by a separator slot; a merged pair's second
    symbol is unlinked from its word (prv/nxt) and its slot set to -1. A pair (a, b) is the int a << shift | b,
    with the positions where it may start (may repeat, may be stale: checked when used). Merges exactly as
    learn_merges's loop (same counts, same lazy heap, same ties) until the pairs merged have had fewer than
    `min_sites` such positions on average over the last few dozen merges (numpy's cost per merge is then more
    than the str loop's); returns the words then, as learn_merges's str words, with its pair -> words index and pair
    counts, or None where every merge was made.
    Token ids stay below 0x10FFFF (the separator character)."""
    import numpy as np

    shift = max(v.size, len(v.vocab), 256).bit_length()
    mask = (1 << shift) - 1
    lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    n = int(lens.sum()) + len(words)
    sep = lens.cumsum() + np.arange(len(words))  # each word's separator slot
    seq = np.full(n, -1, dtype=np.int64)
    is_sym = np.ones(n, dtype=bool)
    is_sym[sep] = False
    seq[is_sym] = np.frombuffer(b"".join(words), dtype=np.uint8)
    wf = np.repeat(np.asarray(freqs, dtype=np.int64), lens + 1)
    pos = np.arange(n, dtype=np.int32)
    nxt = pos + 1
    nxt[sep] = -1
    nxt[sep[lens > 0] - 1] = -1  # a word's last symbol
    prv = pos - 1
    prv[sep] = -1
    prv[is_sym & np.r_[True, ~is_sym[:-1]]] = -1  # a word's first symbol
    del pos, is_sym

    sites: dict[int, list] = {}
    pair_counts: dict[int, int] = {}

    def add(keys, where, weights=None) -> None:
        """Index positions `where` under pair keys `keys`; with weights, add them to the pairs' counts."""
        if not len(keys):
            return
        order = keys.argsort(kind="stable")
        keys, where = keys[order], where[order]
        starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        bounds = [0, *starts.tolist(), len(keys)]
        starts = bounds[:-1]
        uniq = keys[starts].tolist()
        for k, s, e in zip(uniq, starts, bounds[1:]):
            lst = sites.get(k)
            if lst is None:
                sites[k] = [where[s:e]]
            else:
                lst.append(where[s:e])
        if weights is not None:
            for k, c in zip(uniq, np.add.reduceat(weights[order], starts).tolist()):
                pair_counts[k] = c

    first = np.flatnonzero(nxt >= 0)
    if len(first):
        add(seq[first] << shift | seq[nxt[first]], first, wf[first])
    key = v.key
    heap = [(-c, key[chr(p >> shift)] + key[chr(p & mask)], p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
    busy = float(len(first))  # the places a merge looks at, averaged over about the last 32 merges
    while not v.full() and heap:
        negc, _, ab = heappop(heap)
        cnt = pair_counts.get(ab)
        if cnt != -negc:  # stale entry, as in learn_merges
            if cnt is not None and cnt < -negc:
                heappush(heap, (-cnt, key[chr(ab >> shift)] + key[chr(ab & mask)], ab))
            continue
        parts = sites[ab]
        busy += (sum(map(len, parts)) - busy) / 32
        if busy < min_sites:
            break
        del sites[ab], pair_counts[ab]
        a, b = ab >> shift, ab & mask
        c = v.merge(a, b)
        p = np.unique(np.concatenate(parts))  # sorted: a word's sites in order
        p = p[seq[p] == a]
        q = nxt[p]
        ok = q >= 0
        p, q = p[ok], q[ok]
        ok = seq[q] == b
        p, q = p[ok], q[ok]
        if a == b:  # runs like "aaaa": merge left to right, so a site that starts at the previous one's b goes
            keep = np.ones(len(p), dtype=bool)
            for i in np.flatnonzero(p[1:] == q[:-1]).tolist():
                if keep[i]:
                    keep[i + 1] = False
            p, q = p[keep], q[keep]
        f = wf[p]
        left, right = prv[p], nxt[q]
        after = np.zeros(len(p), dtype=bool)  # this site starts right after the previous one's b
        after[1:] = left[1:] == q[:-1]
        has_l, has_r = left >= 0, right >= 0
        # as learn_merges's loop: the left neighbour read after the previous site merged (c where it was that
        # site's b), the right one before the next site merged
        xl = np.where(after, c, seq[left])[has_l]
        lpos = np.where(after, np.concatenate((p[:1], p[:-1])), left)[has_l]
        fl = f[has_l]
        yr = seq[right[has_r]]
        fr = f[has_r]
        new_l = xl << shift | c
        new_r = c << shift | yr
        keys = np.concatenate((xl << shift | a, new_l, b << shift | yr, new_r))
        deltas = np.concatenate((-fl, fl, -fr, fr))
        seq[p] = c
        seq[q] = -1
        nxt[p] = right
        prv[right[has_r]] = p[has_r]
        add(np.concatenate((new_l, new_r)), np.concatenate((lpos, p[has_r])))
        if not len(keys):
            continue
        order = keys.argsort(kind="stable")
        keys = keys[order]
        starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        starts = np.concatenate(([0], starts))
        for k, d in zip(keys[starts].tolist(), np.add.reduceat(deltas[order], starts).tolist()):
            if k == ab or not d:
                continue
            if d > 0:
                cnt = pair_counts.get(k, 0) + d
                pair_counts[k] = cnt
                heappush(heap, (-cnt, key[chr(k >> shift)] + key[chr(k & mask)], k))
            else:
                cnt = pair_counts[k] + d
                if cnt > 0:
                    pair_counts[k] = cnt
                else:
                    del pair_counts[k]
                    sites.pop(k, None)
        if len(heap) > 4 * len(pair_counts) + 100_000:
            heap = [(-cnt, key[chr(p >> shift)] + key[chr(p & mask)], p) for p, cnt in pair_counts.items()]
            heapq.heapify(heap)
    else:
        return None
    # the str loop's index and counts, from the arrays: each pair's words (once per place) and count
    at = np.flatnonzero((seq >= 0) & (nxt >= 0))
    keys = seq[at] << shift | seq[nxt[at]]
    order = keys.argsort(kind="stable")
    keys, at = keys[order], at[order]
    bounds = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(keys)] if len(keys) else [0]
    starts = bounds[:-1]
    wid = np.repeat(np.arange(len(words)), lens + 1)[at].tolist()
    pair_words: defaultdict[str, list[int]] = defaultdict(list)
    pair_counts: dict[str, int] = {}
    if starts:
        for k, s, e, cnt in zip(keys[starts].tolist(), starts, bounds[1:], np.add.reduceat(wf[at], starts).tolist()):
            p = chr(k >> shift) + chr(k & mask)
            pair_words[p] = wid[s:e]
            pair_counts[p] = cnt
    seq[sep] = 0x10FFFF  # the separators were -1, as unlinked symbols are
    alive = seq[seq != -1]
    text = alive.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return text.split("\U0010ffff")[:-1], pair_words, pair_counts


def learn_merges(
    word_counts: dict[bytes, int], vocab: dict[int, bytes], vocab_size: int, progress: bool | None = None
) -> list[Merge]:
    """Merge pairs until `vocab` holds vocab_size tokens; mutates `vocab`, returns the merges in order."""
    v = _Vocab(vocab, vocab_size, progress)
    freqs: list[int] = list(word_counts.values())
    # the first merges, each in many words, in numpy (_merge_arrays); then, one word at a time, the loop below
    state = _merge_arrays(list(word_counts), freqs, v, _MIN_SITES) if not v.full() else None
    if state is None:
        v.bar.close()
        return v.merges
    # A word is a str whose characters are token ids (chr(id)); a pair is the 2-character str of its two ids.
    # Finding and replacing a pair in a word then runs in C (str.find, str.replace), and a pair key hashes as
    # cheaply as an int.
    # pair -> indices of words that contain it (may repeat, may be stale: checked when used); lists are
    # far smaller than sets and most pairs occur in few words.
    words, pair_words, pair_counts = state
    key = v.key
    # Max-heap on (count, pair bytes): entries (-count, key(a) + key(b), pair). Lazy: a count that fell is not
    # pushed again; an entry whose count is above the pair's is pushed again with the true count when it comes
    # up, one below it is dropped (a higher one exists). So every pair has an entry at or above its count, and
    # an entry that comes up with its pair's count is the most frequent pair, ties to the greatest bytes.
    heap = [(-c, key[p[0]] + key[p[1]], p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
    while not v.full() and heap:
        negc, _, ab = heappop(heap)
        cnt = pair_counts.get(ab)
        if cnt != -negc:  # stale entry: the pair is gone, or its count changed
            if cnt is not None and cnt < -negc:
                heappush(heap, (-cnt, key[ab[0]] + key[ab[1]], ab))
            continue
        a, b = ab
        C = chr(v.merge(ord(a), ord(b)))
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
    v.bar.close()
    return v.merges


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
    separator: str = "<|endoftext|>",
    one_per_line: bool = False,
) -> tuple[dict[int, bytes], list[Merge]]:
    """Train a byte-level BPE on one or more inputs: UTF-8 text files, or what ``pack`` reads besides (JSON lines,
    JSON, Parquet: each record's ``text_field``; gzip; ``cookmind curate run`` output folders). A plain text file's
    documents are those ``pack`` reads: split at ``separator`` (default ``<|endoftext|>``), or one a line with
    ``one_per_line``.

    Returns (vocab: id -> bytes, merges in creation order). Ids: bytes 0..255, then the special
    tokens in order, then merged tokens. Raises TokenizerError for a missing file, an empty
    corpus, a vocab_size below 256 + len(special_tokens), or non-UTF-8 bytes (unless
    utf8_errors="replace", which reads them as U+FFFD), or a bad JSON / Parquet record, unless ``skipped``
    (a ``SkippedRecords``) is given: bad records are then counted there and left out. ``read`` (a ``ReadCounts``),
    where given, is filled with the files, records and bytes of text read, so a caller can report them.
    ``progress``: the pre-tokenize and merges bars, True always (the CLI's, into a pipe too), None only on a
    terminal, False never.
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
        pattern,
        workers=workers,
        chunk_bytes=chunk_bytes,
        utf8_errors=utf8_errors,
        progress=progress,
        text_field=text_field,
        skipped=skipped,
        read=read,
        separator=separator,
        one_per_line=one_per_line,
    )
    inputs = input_path if isinstance(input_path, (str, os.PathLike)) else ", ".join(map(str, input_path))
    if not counts and skipped is not None and skipped.count:
        raise TokenizerError(f"no record of {inputs} was good: {skipped.summary()}")
    if not counts:
        raise TokenizerError(
            f"the corpus {inputs} has no text outside its document separators; give files with text to learn from"
        )
    # distinct pre-tokens have distinct UTF-8 bytes (encoding fails, as before, on a lone surrogate)
    word_counts: dict[bytes, int] = {tok.encode("utf-8"): n for tok, n in counts.items()}
    vocab = initial_vocab(specials)
    merges = learn_merges(word_counts, vocab, vocab_size, progress=progress)
    return vocab, merges
