"""Reading sharded checkpoints (``<step dir>/dcp/``, written by ``torch.distributed.checkpoint``) as data.

DCP's own reader unpickles ``.metadata`` freely and ``torch.load``s non-tensor entries without ``weights_only``:
a checkpoint from elsewhere could run code. Here the metadata goes through an unpickler that only builds DCP's
metadata classes, ``torch.Size``/dtypes and paths, and every non-tensor entry must pass
``torch.load(weights_only=True)`` first. The writer and the live-object loader are in
``cookmind.train.sharded_checkpoint``; this module needs no process group (export, generate, eval).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

from cookmind.model.sharded_layout import METADATA_NAME, MODEL_KEY, OPTIM_KEY, ShardedCheckpointError, dcp_dir

_PATH_CLASSES = {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}
# One process without a group is what we mean when we say no_dist (also from async_save's background thread).
_SINGLE_PROCESS = r".*assuming the intent is to (save|load) in a single process"
warnings.filterwarnings("ignore", message=_SINGLE_PROCESS)


@contextlib.contextmanager
def quiet_single_process() -> Iterator[None]:
    """Around a DCP call without a group: the filter above is lost if this module was first imported inside a
    ``warnings.catch_warnings()`` block (eval's LoRA-base look-up does), so each call sets it again."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS)
        yield


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and nothing else (no functions, no other modules' classes)."""

    def find_class(self, module: str, name: str) -> Any:
        if module in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"):
            obj = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(obj, type):
                return obj
        elif module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        elif module == "torch.serialization" and name == "_get_layout":  # maps a layout's name to torch's layout
            return torch.serialization._get_layout
        elif module == "pathlib" and name in _PATH_CLASSES:
            import pathlib

            return getattr(pathlib, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader with ``.metadata`` read by the restricted unpickler; errors name the file."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / METADATA_NAME
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as exc:
            raise ShardedCheckpointError(
                f"{path}: refused to load: {exc}; only use checkpoints cookmind wrote"
            ) from None
        except (OSError, EOFError, ValueError, TypeError, AttributeError) as exc:
            raise ShardedCheckpointError(f"{path}: cannot read ({exc}); the file is truncated or corrupt") from exc
        if not isinstance(metadata, Metadata):
            raise ShardedCheckpointError(f"{path}: not a torch.distributed.checkpoint metadata file")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner; a non-tensor entry must load with ``weights_only=True`` before DCP reads it."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            raise ShardedCheckpointError(
                f"{read_item.dest_index.fqn}: refused to load: it holds Python objects other than tensors and "
                "plain data; only use checkpoints cookmind wrote"
            ) from None
        value.seek(0)
        super().load_bytes(read_item, value)


def read_metadata(directory: str | os.PathLike) -> Metadata:
    """The DCP metadata of a step directory (restricted unpickling)."""
    return SafeReader(dcp_dir(directory)).read_metadata()


def sharded_problem(directory: str | os.PathLike, need_optimizer: bool = False) -> str | None:
    """Why a sharded checkpoint cannot be used (damaged metadata, a missing or truncated shard), or None."""
    folder = dcp_dir(directory)
    try:
        metadata = read_metadata(directory)
    except ShardedCheckpointError as exc:
        return str(exc)
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in ends.items():
        f = folder / name
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size < end:
            return f"{f} is truncated"
    keys = metadata.state_dict_metadata
    if not any(k.startswith(MODEL_KEY + ".") for k in keys):
        return f"{folder / METADATA_NAME} lists no model weights"
    if need_optimizer and not any(k.startswith(OPTIM_KEY + ".") for k in keys):
        return f"{folder / METADATA_NAME} lists no optimizer state"
    return None


# bytes of tensors read by one DCP load: a progress step of a big checkpoint's reading
GROUP_BYTES = 256 << 20


def read_sharded_weights(directory: str | os.PathLike, progress: bool = False) -> dict[str, torch.Tensor]:
    """The model's full (consolidated) weights from a sharded checkpoint, in one process without a group.

    Whatever world size wrote it, each tensor comes back whole, on the CPU, named as in ``model.state_dict()``.
    They are read ``GROUP_BYTES`` at a time, ``progress`` showing it (for ``PROGRESS_BYTES`` or more): one DCP
    load of them all said nothing however long it took.
    """
    from cookmind.model.model_io import PROGRESS_BYTES
    from cookmind.progress import progress_bar

    metadata = read_metadata(directory)
    prefix = MODEL_KEY + "."
    weights: dict[str, torch.Tensor] = {}
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(md, TensorStorageMetadata):
            weights[key[len(prefix) :]] = torch.empty(md.size, dtype=md.properties.dtype)
        elif key.startswith(prefix) and not isinstance(md, BytesStorageMetadata):
            raise ShardedCheckpointError(f"{dcp_dir(directory) / METADATA_NAME}: {key} has an unknown kind of entry")
    if not weights:
        raise ShardedCheckpointError(f"{dcp_dir(directory) / METADATA_NAME}: lists no model weights")
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0  # of the last group
    for name, tensor in weights.items():
        if groups[-1] and size + tensor.nbytes > GROUP_BYTES:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += tensor.nbytes
    total = sum(t.nbytes for t in weights.values())
    with progress_bar(
        total=total, desc="reading dcp", unit="B", unit_scale=True, enabled=progress and total >= PROGRESS_BYTES
    ) as bar:
        for group in groups:  # DCP fills the tensors of the state it is given, and reads only those
            try:
                with quiet_single_process():
                    dcp_load(
                        {MODEL_KEY: group},
                        storage_reader=SafeReader(dcp_dir(directory)),
                        planner=SafeLoadPlanner(),
                        no_dist=True,
                    )
            except (Exception, CheckpointException) as exc:
                raise load_error(exc, f"{dcp_dir(directory)}: cannot read the shards") from None
            bar.update(sum(t.nbytes for t in group.values()))
    return weights


def load_error(exc: BaseException, what: str, hint: str = "") -> ShardedCheckpointError:
    """One ShardedCheckpointError for a failed DCP load: our own refusal as it was raised, else ``what (cause)``.

    DCP wraps every rank's error in a CheckpointException (a BaseException) whose text is their tracebacks.
    """
    causes = [e for e, _ in getattr(exc, "failures", {}).values()] if isinstance(exc, CheckpointException) else [exc]
    for cause in causes:
        if isinstance(cause, ShardedCheckpointError):
            return cause
    return ShardedCheckpointError(f"{what} ({error_reason(exc)})" + (f"; {hint}" if hint else ""))


def error_reason(exc: BaseException) -> str:
    """The cause inside DCP's CheckpointException (its text is each rank's traceback): the last error line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if re.match(r"^\s*\w+(Error|Exception): ", ln)]
    return lines[-1] if lines else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
