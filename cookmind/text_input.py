"""Lines of UTF-8 text files that users give (JSONL records, CSV rows), bad bytes an error naming file:line.

Opened as text, a file with one bad byte raised a bare ``UnicodeDecodeError`` ("can't decode byte 0xe9 in
position 41") from somewhere inside the reader's buffer: no file, no line, no way to find it in a 1 GB shard. Read
here line by line as bytes, the error says where. Nothing here imports other cookmind packages: every layer may
use it.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator

BOM = "\ufeff"


def utf8_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line number, line with its newline) of a UTF-8 file, gzipped if its name ends in .gz; a byte-order
    mark opening the file is no text. Invalid UTF-8 is a ValueError naming the file, line and byte."""
    name = os.fspath(path)
    with gzip.open(name, "rb") if name.endswith(".gz") else open(name, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(bad_utf8(name, n, exc.start)) from None
            yield n, line.removeprefix(BOM) if n == 1 else line


def read_utf8(path: str | os.PathLike) -> str:
    """A whole UTF-8 file's text (a byte-order mark opening it is no text); invalid UTF-8 is a ValueError naming the
    file, line and byte."""
    with open(os.fspath(path), "rb") as f:
        return decode_utf8(f.read(), path)


def decode_utf8(data: bytes, path: str | os.PathLike, errors: str = "strict") -> str:
    """The text of ``data``, the bytes of the file at ``path`` (a leading byte-order mark dropped); with
    ``errors="strict"`` invalid UTF-8 is a ValueError naming the file, line and byte."""
    try:
        return data.decode("utf-8", errors).removeprefix(BOM)
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise ValueError(bad_utf8(path, data.count(b"\n", 0, exc.start) + 1, exc.start - line_start)) from None


def bad_utf8(path: str | os.PathLike, line: int, byte: int) -> str:
    """The one-line error for invalid UTF-8 at ``byte`` of ``line``."""
    return f"{os.fspath(path)}:{line}: invalid UTF-8 at byte {byte} of the line; fix or re-encode the file as UTF-8"


def first_bad_utf8(path: str | os.PathLike) -> str:
    """The error for a file a text reader could not decode: its first invalid line (for readers, such as csv, that
    need a text stream and learn of the bad byte only from a ``UnicodeDecodeError``)."""
    try:
        for _ in utf8_lines(path):
            pass
    except ValueError as exc:
        return str(exc)
    return f"{os.fspath(path)}: invalid UTF-8; fix or re-encode the file as UTF-8"
