"""Write-then-rename helpers: a reader never sees a half-written file or store."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A hidden name beside ``path`` in the same directory, so the final rename is atomic."""
    path = Path(path)
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


def write_json_atomic(path: Path, obj) -> None:
    """Write ``obj`` as JSON to a temporary name, flush it to disk, then rename over ``path``."""
    path = Path(path)
    tmp = temp_sibling(path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(tmp_dir: Path, final_dir: Path, overwrite: bool) -> None:
    """Move a finished ``tmp_dir`` to ``final_dir``; an existing store is replaced only when asked."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    if final_dir.exists():
        if not overwrite:
            raise FileExistsError(f"{final_dir} already exists; choose another --out or pass --overwrite")
        old = temp_sibling(final_dir, "old")
        os.replace(final_dir, old)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)
