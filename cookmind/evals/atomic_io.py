"""Read result and data files (JSONL); writes go through ``cookmind.atomic``."""

from __future__ import annotations

import json

from cookmind import json_input, text_input


def read_jsonl(path, limit: int | None = None) -> list[dict]:
    """Records of a JSONL file; a malformed line raises naming the file and line."""
    return [record for _, record in read_jsonl_lines(path, limit)]


def read_jsonl_lines(path, limit: int | None = None) -> list[tuple[int, dict]]:
    """(line number, record) of each record of a JSONL file (blank lines skipped), for errors that name the line."""
    out = []
    for lineno, line in text_input.utf8_lines(path):
        if limit is not None and len(out) >= limit:  # checked first: limit 0 read one record
            break
        if not line.strip():
            continue
        try:
            out.append((lineno, json_input.loads(line.rstrip("\r\n"))))  # a cut-off line read as column 1
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{lineno}: not valid JSON ({exc.msg.removesuffix(' at')}"
                f" at column {exc.colno}); each line must be one JSON object"
            ) from None
    return out
