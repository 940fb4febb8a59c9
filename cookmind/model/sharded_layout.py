"""Where a sharded checkpoint lives in a step directory, and how to tell one is there: no import of
``torch.distributed.checkpoint`` (about a second at every CLI start), which ``sharded_io`` needs to read one."""

from __future__ import annotations

import os
from pathlib import Path

from cookmind.run_layout import DCP_DIR  # inside a step directory: DCP's .metadata, one __R_0.distcp file per rank
from cookmind.run_layout import DCP_METADATA as METADATA_NAME

MODEL_KEY, OPTIM_KEY = "model", "optim"  # top-level keys of the saved state: {"model": {...}, "optim": {...}}


class ShardedCheckpointError(ValueError):
    """A sharded checkpoint cannot be read: names the file and what is wrong."""


def dcp_dir(directory: str | os.PathLike) -> Path:
    """The DCP folder of a step directory."""
    return Path(directory) / DCP_DIR


def is_sharded_checkpoint(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a sharded (DCP) checkpoint."""
    return (dcp_dir(directory) / METADATA_NAME).is_file()
