"""Write result files under a temporary name and rename, so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_jsonl(path, records) -> Path:
    """One JSON object per line, written to ``path.tmp`` then renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def write_json(path, obj) -> Path:
    """``obj`` as indented JSON, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_jsonl(path, limit: int | None = None) -> list[dict]:
    """Records of a JSONL file; a malformed line raises naming the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
            if limit is not None and len(out) >= limit:
                break
    return out
