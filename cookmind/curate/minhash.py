"""Near-duplicate detection: MinHash signatures over word n-grams, LSH banding, true-Jaccard check.

signature_i(D) = min over shingles x of h_i(x),  h_i(x) = (a_i * x + b_i) mod p,  p = 2^31 - 1
P[signature_i(A) == signature_i(B)] = J(A, B) = |A ∩ B| / |A ∪ B|
Banding: split k = b * r rows into b bands; two documents become candidates when all r rows of
some band agree, which happens with probability 1 - (1 - J^r)^b (an S-curve around (1/b)^(1/r)).
Candidates are then verified with their true Jaccard, joined into clusters with union-find, and
one document (the first in corpus order) is kept per cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from cookmind.atomic import writing
from cookmind.curate.dedup_output import building_dedup_output
from cookmind.curate.shards import read_text_counting_bad_utf8
from cookmind.curate.stats import StageStats
from cookmind.text_input import BAD_UTF8, ENDOFTEXT, bad_utf8_note

MERSENNE_31 = np.uint64((1 << 31) - 1)
_WORD = re.compile(r"\w+", re.UNICODE)
_MAX_ALL_PAIRS = 64  # buckets larger than this are joined as a star (first vs rest), not all pairs


def normalize_words(text: str) -> list[str]:
    """Lower-cased word tokens (punctuation and spacing do not make documents differ)."""
    return _WORD.findall(text.lower())


def _stories(text: str) -> list[list[str]]:
    """The words (``normalize_words``) of each document of the plain text ``text``, the text between
    ``<|endoftext|>`` separators as pack reads it; those with no words left out."""
    return [words for doc in text.split(ENDOFTEXT) if (words := normalize_words(doc))]


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads the bits of a polynomial n-gram id over all 64 bits."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def shingles(text: str, ngrams: int = 5, separated: bool = False) -> np.ndarray:
    """Sorted unique 64-bit ids of the word n-grams of ``text``. ``separated``: ``text`` is a plain text file's,
    and each n-gram lies within one of its documents: none spans an ``<|endoftext|>`` separator (a story's last words
    and the next one's first are in neither); a record's text is one document, the token in it text like any other.
    A document of fewer words than n: one shingle of them."""
    stories = _stories(text) if separated else [words for words in [normalize_words(text)] if words]
    parts = [_ngram_ids(words, ngrams) for words in stories]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)


def _ngram_ids(words: list[str], ngrams: int) -> np.ndarray:
    """The 64-bit id of each word n-gram of ``words`` (fewer than n: one, of them all)."""
    ids = np.fromiter((xxhash.xxh64_intdigest(w.encode()) for w in words), dtype=np.uint64, count=len(words))
    n = min(ngrams, len(ids))
    h = np.zeros(len(ids) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):  # id(w_i..w_{i+n-1}) = sum_k id(w_{i+k}) * P^(n-1-k)  mod 2^64
            h = h * np.uint64(0x100000001B3) + ids[k : len(ids) - n + 1 + k]
        return _mix64(h)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|A ∩ B| / |A ∪ B| of two sorted unique shingle arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def permutations(num_hashes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The (a_i, b_i) of the hash family: a in [1, p), b in [0, p); seeded, so signatures reproduce."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, int(MERSENNE_31), size=num_hashes, dtype=np.uint64)
    b = rng.integers(0, int(MERSENNE_31), size=num_hashes, dtype=np.uint64)
    return a, b


def signature(shingle_ids: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signature (num_hashes,) of one shingle set; an empty set gets all p (never matches less)."""
    if len(shingle_ids) == 0:
        return np.full(len(a), MERSENNE_31, dtype=np.uint64)
    x = (shingle_ids & np.uint64(0xFFFFFFFF)) % MERSENNE_31  # x < p < 2^31, so a*x + b < 2^62: exact
    return ((a[:, None] * x[None, :] + b[:, None]) % MERSENNE_31).min(axis=1)


def band_keys(signatures: np.ndarray, num_bands: int) -> np.ndarray:
    """(N, num_bands) uint64 keys: a hash of each band's r = k / b rows."""
    n, k = signatures.shape
    if k % num_bands:
        raise ValueError(f"num_hashes {k} is not divisible by num_bands {num_bands}; pick bands that divide it")
    r = k // num_bands
    keys = np.empty((n, num_bands), dtype=np.uint64)
    for j in range(num_bands):
        band = np.ascontiguousarray(signatures[:, j * r : (j + 1) * r])
        keys[:, j] = [xxhash.xxh64_intdigest(row.tobytes(), seed=j) for row in band]
    return keys


def candidate_pairs(keys: np.ndarray) -> set[tuple[int, int]]:
    """Pairs (i < j) of documents that share at least one band key."""
    pairs: set[tuple[int, int]] = set()
    for j in range(keys.shape[1]):
        buckets: dict[int, list[int]] = defaultdict(list)
        for i, key in enumerate(keys[:, j].tolist()):
            buckets[key].append(i)
        for members in buckets.values():
            if len(members) < 2:
                continue
            if len(members) <= _MAX_ALL_PAIRS:
                pairs.update((members[x], members[y]) for x in range(len(members)) for y in range(x + 1, len(members)))
            else:
                pairs.update((members[0], m) for m in members[1:])
    return pairs


class UnionFind:
    """Disjoint sets with path halving; the root of a set is its smallest member."""

    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            self.parent[max(rx, ry)] = min(rx, ry)


def duplicate_clusters(
    shingle_sets: Sequence[np.ndarray], signatures: np.ndarray, num_bands: int, jaccard_threshold: float
) -> list[int]:
    """For each document, the index of the document kept for its cluster (itself when it is kept)."""
    uf = UnionFind(len(shingle_sets))
    for i, j in sorted(candidate_pairs(band_keys(signatures, num_bands))):
        if uf.find(i) != uf.find(j) and jaccard(shingle_sets[i], shingle_sets[j]) >= jaccard_threshold:
            uf.union(i, j)
    return [uf.find(i) for i in range(len(shingle_sets))]


def minhash_dedup(
    input_files: Sequence[str | os.PathLike],
    num_hashes: int,
    num_bands: int,
    ngrams: int,
    jaccard_threshold: float,
    output_dir: str | os.PathLike,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
) -> list[Path]:
    """Copy to ``output_dir`` every input file (one document each) except near-duplicates of an earlier one.

    Returns the written paths. Files keep their names; the first file of each cluster is kept. The folder is
    built whole (``dedup_output``); its record counts the documents in, kept and removed, and any bytes that were
    not UTF-8 (read as U+FFFD to compare the files, warned of with the first file:line). ``overwrite`` replaces
    an earlier dedup's folder there, never anything else. ``progress`` shows a bar over the files read.
    """
    from cookmind.progress import progress_bar

    output_dir = Path(output_dir)
    with building_dedup_output(output_dir, input_files, overwrite, "minhash") as (tmp, summary):
        files = progress_bar(input_files, desc="dedup minhash", unit="file", enabled=progress, dynamic_ncols=True)
        read = StageStats("minhash")  # bytes that are not UTF-8: read as U+FFFD, counted and warned of
        sets = [shingles(read_text_counting_bad_utf8(p, read), ngrams, separated=True) for p in files]
        if note := bad_utf8_note(read, "input file(s)", "rerun with --overwrite to compare their characters"):
            warnings.warn(f"curate: {note}", stacklevel=2)
        a, b = permutations(num_hashes, seed)
        sigs = np.stack([signature(s, a, b) for s in sets]) if sets else np.zeros((0, num_hashes), np.uint64)
        keep = duplicate_clusters(sets, sigs, num_bands, jaccard_threshold)
        kept = [Path(path) for i, path in enumerate(input_files) if keep[i] == i]
        for path in kept:
            _copy_atomic(path, tmp / path.name)
        summary.update(docs_in=len(input_files), docs_kept=len(kept), docs_removed=len(input_files) - len(kept))
        if note:
            summary.update(read.counters, **{f"{BAD_UTF8}_first": read.first_at[BAD_UTF8]})
    return [output_dir / path.name for path in kept]


def _copy_atomic(src: Path, dst: Path) -> Path:
    """Copy ``src`` byte for byte (a kept document is not rewritten)."""
    with writing(dst, "wb") as f, open(src, "rb") as g:
        shutil.copyfileobj(g, f)
    return dst
