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
META_NAME = "meta.json"  # a training checkpoint's last-written file: its presence marks a complete one
CONFIG_NAME = "config.json"  # a saved model's config and weights (cookmind.model.model_io)
WEIGHTS_NAME = "model.safetensors"
DCP_DIR, DCP_METADATA = "dcp", ".metadata"  # a sharded checkpoint's folder and its index (model.sharded_layout)
# what a training run writes into its run directory: the Trainer's config and metrics, report.py's report and plots,
# run_lock.py's lock, the checkpoints folder and tensorboard's
RUN_CONFIG, RUN_METRICS, RUN_LOCK = "config.yaml", "metrics.jsonl", ".lock"
REPORT_NAME, LOSS_PLOT, LR_PLOT, OBJECTIVE_PLOT = "report.md", "loss.png", "lr.png", "objective.png"
REPORT_FILES = (REPORT_NAME, LOSS_PLOT, LR_PLOT, OBJECTIVE_PLOT)
RUN_ENTRIES = frozenset({RUN_CONFIG, RUN_METRICS, *REPORT_FILES, "checkpoints", "tensorboard", RUN_LOCK})


def is_checkpoint_dir(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds what a checkpoint has: a training save's meta.json, or a saved model (config.json and
    model.safetensors or a sharded ``dcp/``). ``model_io.latest_checkpoint`` weighs only such ``step_N`` folders."""
    folder = Path(folder)
    if (folder / META_NAME).is_file():
        return True
    weights = (folder / WEIGHTS_NAME).is_file() or (folder / DCP_DIR / DCP_METADATA).is_file()
    return (folder / CONFIG_NAME).is_file() and weights


def _holds_checkpoints(folder: Path) -> bool:
    """Whether ``folder`` holds a ``step_N`` checkpoint (a user's folder of ``step_N`` folders of other files is
    no run's)."""
    try:
        return any(STEP_DIR.match(d.name) and d.is_dir() and is_checkpoint_dir(d) for d in folder.iterdir())
    except OSError:  # absent, or not a folder
        return False


def _is_runs_checkpoints(folder: Path) -> bool:
    """A run's ``checkpoints/``: holding a checkpoint, or beside what a run that has not saved yet wrote (its
    config.yaml and its metrics.jsonl or lock; a project's own config.yaml beside its ``checkpoints/`` of runs is no
    run's)."""
    if folder.name != "checkpoints":
        return False
    run = folder.parent
    started = (run / RUN_CONFIG).is_file() and ((run / RUN_METRICS).is_file() or (run / RUN_LOCK).exists())
    return started or _holds_checkpoints(folder)


def is_run_dir(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a training run's directory: its ``checkpoints/`` is a run's (``_is_runs_checkpoints``).
    A command reads such a folder only through its newest checkpoint."""
    return _is_runs_checkpoints(Path(folder) / "checkpoints")


def checkpoints_folder_of(path: str | os.PathLike) -> Path | None:
    """The checkpoints folder of a training run that ``path`` is or lies in, else None: a run's ``checkpoints/``
    (``_is_runs_checkpoints``), a ``step_N`` folder's parent that is one or holds a checkpoint (a
    ``checkpoint.dir``), or ``path``'s own folder when it holds a checkpoint. A checkpoint is a ``step_N`` folder
    with a checkpoint's files (``is_checkpoint_dir``): a user's folder of ``step_N`` folders is no run's."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        if _is_runs_checkpoints(folder):
            return folder
        if STEP_DIR.match(folder.name) and (_is_runs_checkpoints(folder.parent) or _holds_checkpoints(folder.parent)):
            return folder.parent
    return path.parent if _holds_checkpoints(path.parent) else None


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


def refuse_run_file(out: str | os.PathLike, flag: str = "", error: type[Exception] = ValueError) -> None:
    """``error`` (one line) when ``out`` is one of a training run's own files (``RUN_ENTRIES``) in its run directory
    (a folder with the run's config.yaml beside its checkpoints/ or metrics): the run rewrites it, and a resume
    reads its config.yaml, so no command's output replaces it, --overwrite or not."""
    out = Path(out)
    run = out.parent
    if out.name not in RUN_ENTRIES or not (run / RUN_CONFIG).is_file():
        return
    if not ((run / "checkpoints").is_dir() or (run / RUN_METRICS).is_file()):
        return
    raise error(
        f"{flag + ' ' if flag else ''}{out} is the training run's own {out.name} in {run}, which the run writes (and "
        f"a resume reads); write beside it under another name, e.g. {run / 'eval.jsonl'}"
    )
