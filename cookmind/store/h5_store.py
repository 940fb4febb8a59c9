"""The ``.h5`` backend: a shard is one HDF5 file with one dataset per key and the record
offsets under ``offsets/<key>``. Opening reads every dataset into a torch tensor; call
``share_memory()`` before starting DataLoader workers so they map the tensors instead of
copying them (h5py handles themselves must not cross a fork)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np

from cookmind.atomic import temp_path
from cookmind.store.bin_store import _check_version
from cookmind.store.layout import FORMAT_VERSION, StoreError

if TYPE_CHECKING:
    import torch


class H5Backend:
    """Writes and opens ``.h5`` shards (files)."""

    name = "h5"
    suffix = ".h5"

    @staticmethod
    def write_shard(path: Path, arrays: dict[str, np.ndarray], offsets: dict[str, np.ndarray], meta: dict) -> None:
        """Write one shard to a temporary file, then rename it to ``path``."""
        with temp_path(path) as tmp, h5py.File(tmp, "w") as f:
            for key, arr in arrays.items():
                f.create_dataset(key, data=np.ascontiguousarray(arr))
                f.create_dataset(f"offsets/{key}", data=np.asarray(offsets[key], dtype=np.int64))
            f.attrs["meta"] = json.dumps({"format_version": FORMAT_VERSION, "format": "h5", **meta})

    @staticmethod
    def open_shard(path: Path) -> H5Shard:
        return H5Shard(path)


class H5Shard:
    """One ``.h5`` shard loaded into memory as torch tensors."""

    def __init__(self, path: Path):
        import torch  # here, not at the top: writing a store (``cookmind pack``) needs no torch

        self.path = Path(path)
        try:
            f = h5py.File(self.path, "r")
        except OSError as exc:
            raise StoreError(f"{self.path}: not a readable HDF5 file ({exc}); re-run `cookmind pack`") from exc
        with f:
            if "meta" not in f.attrs:
                raise StoreError(f"{self.path}: HDF5 file has no cookmind meta attribute; not a cookmind store")
            self.meta = json.loads(f.attrs["meta"])
            _check_version(self.meta, self.path)
            self.keys = tuple(k for k in f.keys() if k != "offsets")
            self._tensors = {k: torch.from_numpy(np.ascontiguousarray(f[k][...])) for k in self.keys}
            self._offsets = {k: np.asarray(f[f"offsets/{k}"][...], dtype=np.int64) for k in self.keys}
        self._views = {k: t.numpy() for k, t in self._tensors.items()}

    def offsets(self, key: str) -> np.ndarray:
        """Record boundaries of ``key``: record i is ``array[offsets[i]:offsets[i+1]]``."""
        return self._offsets[key]

    def array(self, key: str) -> np.ndarray:
        """The flat array of ``key`` (a numpy view of the in-memory tensor)."""
        return self._views[key]

    def tensor(self, key: str) -> torch.Tensor:
        """The flat tensor of ``key``."""
        return self._tensors[key]

    def share_memory(self) -> None:
        """Move every tensor into shared memory so forked DataLoader workers read it in place."""
        for t in self._tensors.values():
            t.share_memory_()
        self._views = {k: t.numpy() for k, t in self._tensors.items()}
