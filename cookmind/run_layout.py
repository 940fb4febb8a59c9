"""Where a training run keeps its checkpoints, told without torch (the data stages use it too).

A run directory holds config.yaml, metrics and ``checkpoints/``, a folder of ``step_N`` checkpoint folders
(``checkpoint.dir`` may name another folder: it holds ``step_N`` folders only). Training prunes there
(``checkpoint.keep_last``), deletes there (``--overwrite``) and takes the newest ``step_N`` there as the run's
model, so no command writes its output there: ``refuse_output_in_checkpoints``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")


def _holds_step_dirs(folder: Path) -> bool:
    try:
        return any(STEP_DIR.match(d.name) and d.is_dir() for d in folder.iterdir())
    except OSError:  # absent, or not a folder
        return False


def checkpoints_folder_of(path: str | os.PathLike) -> Path | None:
    """The checkpoints folder of a training run that ``path`` is or lies in, else None: a ``checkpoints/`` folder
    holding ``step_N`` folders or beside a run's config.yaml, a ``step_N`` folder's parent named ``checkpoints`` or
    holding other ``step_N`` folders (a ``checkpoint.dir``), or ``path``'s own folder when it holds ``step_N``
    folders."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        if folder.name == "checkpoints" and ((folder.parent / "config.yaml").is_file() or _holds_step_dirs(folder)):
            return folder
        if STEP_DIR.match(folder.name) and (folder.parent.name == "checkpoints" or _holds_step_dirs(folder.parent)):
            return folder.parent
    return path.parent if _holds_step_dirs(path.parent) else None


def refuse_output_in_checkpoints(out: str | os.PathLike, flag: str = "", error: type[Exception] = ValueError) -> None:
    """``error`` (one line: where, why, where instead) when ``out`` is or lies in a run's checkpoints folder
    (``checkpoints_folder_of``); ``flag`` (``--out``) is put before the path, as the user gave it."""
    root = checkpoints_folder_of(out)
    if root is None:
        return
    out = Path(out)
    owner = root.parent if root.name == "checkpoints" else root  # the run folder, or a checkpoint.dir elsewhere
    instead = owner.parent / f"{owner.name}-{out.name}"
    raise error(
        f"{flag + ' ' if flag else ''}{out} is in {root}, a training run's checkpoints folder, where training deletes "
        f"old checkpoints (checkpoint.keep_last) and takes the newest step_N as the run's model; write it outside "
        f"that folder, e.g. {instead}"
    )
