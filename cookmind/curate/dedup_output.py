"""The output folder of `curate dedup` (``exact_line_dedup``, ``minhash_dedup``): built whole, and recognised.

The kept files are written into a temporary folder beside ``--output`` and renamed into place at the end, so a
crash leaves the earlier output (or none), never a mix of two runs or a scratch folder; the next run removes the
dead writer's temporary folder. The folder's record, ``.cookmind-dedup.json``, names every file the run wrote
and what it removed: ``--overwrite`` replaces only a folder whose files are all named there.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from cookmind.atomic import building_dir, write_json

RECORD = ".cookmind-dedup.json"


def dedup_record(path: str | os.PathLike) -> dict:
    """The record of the dedup output folder ``path`` ({} when it has none or it is unreadable)."""
    try:
        record = json.loads((Path(path) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and isinstance(record.get("files"), list) else {}


def is_dedup_output(path: Path) -> bool:
    """Whether ``path`` is a folder a dedup wrote: a record, and only the files it names."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return RECORD in names and names - {RECORD} <= set(dedup_record(path).get("files", []))


@contextlib.contextmanager
def building_dedup_output(
    output_dir: str | os.PathLike, inputs, overwrite: bool, method: str
) -> Iterator[tuple[Path, dict]]:
    """Yield (temporary folder, summary dict); when the block ends, the record (the files in the folder plus the
    summary) is written and the folder renamed to ``output_dir``. Refusals come before the work:
    an input inside ``output_dir``, a folder holding files no dedup wrote, our own output without ``overwrite``."""
    output_dir = Path(output_dir)
    for p in inputs:
        if Path(p).resolve().is_relative_to(output_dir.resolve()):
            raise ValueError(
                f"the input {p} lies inside --output {output_dir}, which is replaced whole; choose another --output"
            )
    if output_dir.is_dir() and not output_dir.is_symlink() and not any(output_dir.iterdir()):
        output_dir.rmdir()  # an empty folder the user made for us
    elif output_dir.exists() and not is_dedup_output(output_dir):
        names = sorted(p.name for p in output_dir.iterdir()) if output_dir.is_dir() else [output_dir.name]
        ours = set(dedup_record(output_dir).get("files", []))
        first = next(n for n in names if n != RECORD and n not in ours)
        raise FileExistsError(
            f"--output {output_dir} holds {first}, which no curate dedup wrote (dedup replaces its --output "
            "folder whole); choose a new or empty --output or move it away"
        )
    with building_dir(output_dir, replace=overwrite, is_ours=is_dedup_output, what="dedup output folder") as tmp:
        summary: dict = {}
        yield tmp, summary
        files = sorted(p.name for p in tmp.iterdir())
        write_json(tmp / RECORD, {"method": method, "files": files, **summary})
