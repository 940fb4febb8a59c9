"""JSON that users and clients give (records, request bodies, a model's tool calls), parsed with ``json.loads``.

A value nested deeper than Python's recursion limit makes ``json.loads`` raise RecursionError, which no reader's
``except ValueError`` catches: a 3 KB line of brackets became a traceback (a 500 in the server). Here it is a
``json.JSONDecodeError`` like any other bad JSON, so every reader names the file and line, or answers 400. Nothing
here imports other cookmind packages: every layer may use it.
"""

from __future__ import annotations

import json
import sys


def loads(text: str | bytes | bytearray):
    """``json.loads``, with too-deep nesting a JSONDecodeError (a ValueError) instead of a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else ""
        raise json.JSONDecodeError(
            f"nested too deeply (more than about {sys.getrecursionlimit()} levels of arrays or objects)", doc, 0
        ) from None
