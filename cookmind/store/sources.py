"""Read packing inputs as ``Item``s that remember where they came from (file and line).

- plain text (any suffix but .jsonl/.json/.parquet): documents split by a separator such as
  ``<|endoftext|>`` (a file without one is one document), or one document per line;
- JSON lines (``.jsonl``/``.json``): one JSON object per line, parsed later by the workers so
  that parse errors are reported as ``file:line``;
- Parquet: one row per item, the row number standing in for the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass
class Item:
    """One input record: ``kind`` is "text" (payload str), "json" (payload: the raw line) or "row" (a dict)."""

    source: str
    line: int
    kind: str
    payload: object


def source_kind(path: Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in JSON_SUFFIXES:
        return "json"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return "text"


def iter_items(path, separator: str = "<|endoftext|>", one_per_line: bool = False) -> Iterator[Item]:
    """Yield the items of one input file in order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input {path} does not exist")
    kind = source_kind(path)
    if kind == "parquet":
        yield from _parquet_rows(path)
    elif kind == "json":
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():  # blank lines separate nothing; skip them quietly
                    yield Item(str(path), n, "json", line)
    elif one_per_line:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield Item(str(path), n, "text", line.rstrip("\n"))
    else:
        yield from _separated_documents(path, separator)


def _separated_documents(path: Path, separator: str) -> Iterator[Item]:
    text = path.read_text(encoding="utf-8")
    line = 1
    for doc in text.split(separator) if separator else [text]:
        stripped = doc.strip()
        if stripped:
            # report the line where the document's text starts
            yield Item(str(path), line + doc[: len(doc) - len(doc.lstrip())].count("\n"), "text", stripped)
        line += doc.count("\n") + separator.count("\n")


def _parquet_rows(path: Path) -> Iterator[Item]:
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            n += 1
            yield Item(str(path), n, "row", row)
