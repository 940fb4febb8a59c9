"""Read result and data files (JSONL); writes go through ``cookmind.atomic``."""

from __future__ import annotations

from cookmind import json_input


def read_jsonl(path, limit: int | None = None) -> list[dict]:
    """Records of a JSONL file; a malformed line raises naming the file and line."""
    return [record for _, record in read_jsonl_lines(path, limit)]


def read_jsonl_lines(path, limit: int | None = None) -> list[tuple[int, dict]]:
    """(line number, record) of each record of a JSONL file (blank lines skipped), for errors that name the line."""
    out = []
    if limit is not None and limit <= 0:  # read nothing, not one record
        return out
    for lineno, record in json_input.jsonl_lines(path):
        out.append((lineno, record))
        if limit is not None and len(out) >= limit:
            break
    return out
