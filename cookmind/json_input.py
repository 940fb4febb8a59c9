"""JSON that users and clients give (records, request bodies, a model's tool calls), parsed with ``json.loads``.

A value nested deeper than Python's recursion limit makes ``json.loads`` raise RecursionError, which no reader's
``except ValueError`` catches: a 3 KB line of brackets became a traceback (a 500 in the server). Here it is a
``json.JSONDecodeError`` like any other bad JSON, so every reader names the file and line, or answers 400.
``jsonl_lines`` is the one reader of JSON-lines files users give (curate shards, GSM8K, GRPO problems). It imports
only ``text_input``: every layer may use it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

from cookmind import text_input


def loads(text: str | bytes | bytearray):
    """``json.loads``, with too-deep nesting a JSONDecodeError (a ValueError) instead of a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else ""
        raise json.JSONDecodeError(
            f"nested too deeply (more than about {sys.getrecursionlimit()} levels of arrays or objects)", doc, 0
        ) from None


def opens_array(path: str | os.PathLike) -> bool:
    """Whether a JSON file's first non-blank byte (after a byte-order mark; gzipped if named .gz) opens a JSON array:
    JSON lines open each line with ``{``. pack and curate both read a .json file either way."""
    with text_input.open_bytes(path) as f:
        head = f.read(4096).removeprefix(text_input.BOM.encode()).lstrip()
    return head.startswith(b"[")


def array_elements(text: str, path: str | os.PathLike) -> list:
    """The elements of the one JSON array a file's ``text`` holds; not valid JSON: a ValueError naming file:line and
    the way out."""
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}:{exc.lineno}: the file opens a JSON array but is not valid JSON ({exc.msg} at column "
            f"{exc.colno}); fix it, or write one JSON object per line (.jsonl)"
        ) from None


def line_problem(line: str, exc: json.JSONDecodeError) -> str:
    """What is wrong with a JSON-lines ``line`` that is not valid JSON, in words for a reader's error (which names
    the file and line): a lone ``{`` opens an object spread over lines (a pretty-printed file), which json's
    'Expecting property name' at column 2 does not tell; otherwise json's message and column."""
    if line.strip() == "{":
        return (
            "a lone '{': one JSON object spread over lines (pretty-printed), not one a line; `jq -c .` rewrites it so"
        )
    return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"


class JsonLineError(ValueError):
    """A line of a JSON-lines file that is not valid JSON; the message names the file and line."""


def jsonl_lines(path: str | os.PathLike) -> Iterator[tuple[int, object]]:
    """(1-based line number, value) of each non-blank line of a JSON-lines file (gzipped if named .gz; a leading
    byte-order mark is no text). Lines end at a newline only: a JSON string may hold U+2028 or a form feed raw.
    Invalid UTF-8 is a ValueError naming the file and line, invalid JSON a ``JsonLineError`` (one)."""
    for lineno, line in text_input.utf8_lines(path):
        if not line.strip():
            continue
        try:
            yield lineno, loads(line.rstrip("\r\n"))  # with its newline, a cut-off line read as column 1
        except json.JSONDecodeError as exc:
            raise JsonLineError(
                f"{os.fspath(path)}:{lineno}: not valid JSON ({line_problem(line, exc)}); each line must be one JSON "
                "object"
            ) from None
