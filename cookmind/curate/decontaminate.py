"""Decontamination: find training documents that share a long word n-gram with an evaluation set.

Text is normalised to lower-case words (runs of letters and digits; punctuation, spacing and case do
not matter), each word hashed with xxh64, and every n-gram hashed from its words (a polynomial over
uint64, vectorised with numpy). An eval set becomes a sorted array of its n-gram hashes; a document
is contaminated by it when at least ``min_matches`` of its distinct n-grams are in that array.

Eval sets are named by path: a JSONL/JSON/CSV/Parquet/text file, or a folder of them. Each record
is one item made of all its string fields in order (GSM8K: question + answer; an MMLU CSV row:
question, the four choices and the answer letter). Items shorter than n words cannot match and are
counted as such.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import numpy as np
import xxhash

from cookmind import json_input, text_input

_WORD = re.compile(r"[^\W_]+")
_MULT = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit constant: the polynomial's base
# records as curate run and pack read them (JSON lines or a JSON array, .gz too; Parquet), CSV rows, text lines
EVAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz", ".csv", ".parquet", ".pq", ".txt")


def normalised_words(text: str) -> list[str]:
    """Lower-case words of ``text``: runs of letters and digits."""
    return _WORD.findall(text.lower())


def ngram_hashes(text: str, n: int) -> np.ndarray:
    """uint64 hash of each n-gram of ``text``'s normalised words (empty when it has fewer than n words). ``text`` is
    one document (a record's text, an eval item): an ``<|endoftext|>`` in it is text, the word "endoftext"."""
    words = normalised_words(text)
    m = len(words) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    w = np.fromiter((xxhash.xxh64_intdigest(x.encode("utf-8", "surrogatepass")) for x in words), np.uint64, len(words))
    h = np.zeros(m, np.uint64)
    for k in range(n):  # Horner: h = sum_k w[i + k] * MULT^(n - 1 - k), wrapping at 2^64
        h = h * _MULT + w[k : k + m]
    return h


@dataclasses.dataclass
class EvalSet:
    """One evaluation set's n-grams: ``hashes`` sorted and unique; ``items`` read, ``short`` too short to match;
    ``bad_utf8``: the warning for bytes of its text files that were not UTF-8 (read as U+FFFD), or None."""

    name: str
    path: str
    hashes: np.ndarray
    items: int
    short: int
    bad_utf8: str | None = None

    def matches(self, doc_hashes: np.ndarray) -> int:
        """How many distinct n-grams of ``doc_hashes`` occur in this set."""
        if not len(doc_hashes) or not len(self.hashes):
            return 0
        u = np.unique(doc_hashes)
        idx = np.minimum(np.searchsorted(self.hashes, u), len(self.hashes) - 1)
        return int((self.hashes[idx] == u).sum())


def load_eval_set(name: str, path: str | Path, n: int) -> EvalSet:
    """Read every item of the eval file or folder ``path`` and hash its n-grams."""
    from cookmind.curate.stats import StageStats
    from cookmind.text_input import bad_utf8_note

    files = eval_files(path)
    chunks, items, short = [], 0, 0
    read = StageStats(name)  # a text file's bytes that are not UTF-8
    for f in files:
        for text in iter_eval_items(f, read):
            items += 1
            h = ngram_hashes(text, n)
            short += not len(h)
            chunks.append(h)
    if not items:
        raise ValueError(f"eval set {name}: {path} holds no items (records with a string field)")
    hashes = np.unique(np.concatenate(chunks)) if chunks else np.zeros(0, np.uint64)
    note = bad_utf8_note(read, "eval file(s)", "rerun with --restart to match their characters")
    return EvalSet(name, str(path), hashes, items, short, note)


def eval_files(path: str | Path) -> list[Path]:
    """``path`` itself, or the eval files (JSONL, JSON, CSV, Parquet, text) under the folder ``path``."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"{p} does not exist (give a GSM8K test.jsonl, an MMLU test/ "
            "folder of CSVs, or any JSONL/CSV/Parquet/text file or folder)"
        )
    if p.is_file():
        return [p]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(EVAL_SUFFIXES))
    if not files:
        raise ValueError(f"eval set folder {p} holds no {'/'.join(EVAL_SUFFIXES)} files")
    return files


def iter_eval_items(path: Path, stats=None):
    """The items of one eval file as text: a record's string fields joined in order, a CSV row's cells,
    a text file's text lines, neither blank nor ``<|endoftext|>`` separators (its bytes that are not UTF-8 read as
    U+FFFD, counted in ``stats``, a ``StageStats``: ``shards.count_bad_utf8``; JSON, JSONL and CSV files refuse
    them, naming file:line)."""
    from cookmind.curate.shards import kind_of, read_jsonl, read_parquet

    name = path.name
    kind = kind_of(path)  # by the suffixes curate run reads records from
    whole = None  # a .json file: one JSON value (an array of records, or one record), else JSON lines
    if name.endswith(".json"):
        try:
            whole = json_input.loads(text_input.read_utf8(path))
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # more after one value: JSON lines, read below
                raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if whole is not None:
        for rec in whole if isinstance(whole, list) else [whole]:
            yield _strings(rec)
    elif kind == "jsonl":
        for rec in read_jsonl(path):
            yield _strings(rec)
    elif name.endswith(".csv"):
        text = text_input.read_utf8(path)
        for row in csv.reader(io.StringIO(text, newline="")):
            yield " ".join(row)
    elif kind == "parquet":
        for rec in read_parquet(path):
            yield _strings(rec)
    else:
        from cookmind.curate.shards import read_text_counting_bad_utf8, text_lines

        # a separator is no item (nor a piece of one): it was counted one, and "too short to match"
        yield from text_lines(read_text_counting_bad_utf8(path, stats), separated=True)


def _strings(value) -> str:
    """Every string inside a JSON value, in order, joined by spaces."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list):
        return ""
    return " ".join(s for s in (_strings(v) for v in value) if s)
