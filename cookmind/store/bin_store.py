"""The ``.bin`` backend: a shard is a directory of raw little-endian arrays, one file per key,
plus a ``meta.json`` with each key's dtype, shape and record offsets. Reads are ``np.memmap``,
so DataLoader workers share the bytes through the OS page cache instead of copying them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cookmind.atomic import building_dir, write_json
from cookmind.store.layout import FORMAT_VERSION, META_NAME, StoreError, read_meta


class BinBackend:
    """Writes and opens ``.bin`` shards (directories)."""

    name = "bin"
    suffix = ""

    @staticmethod
    def write_shard(path: Path, arrays: dict[str, np.ndarray], offsets: dict[str, np.ndarray], meta: dict) -> None:
        """Write one shard to a temporary directory, then rename it to ``path``."""
        with building_dir(path) as tmp:
            keys = {}
            for key, arr in arrays.items():
                arr = np.ascontiguousarray(arr)
                with open(tmp / f"{key}.bin", "wb") as f:
                    f.write(arr.tobytes())  # dtype is already little-endian ('<u2', '<f4', ...)
                keys[key] = {
                    "dtype": arr.dtype.str,
                    "shape": list(arr.shape),
                    "offsets": [int(o) for o in offsets[key]],
                }
            write_json(tmp / META_NAME, {"format_version": FORMAT_VERSION, "format": "bin", **meta, "keys": keys})

    @staticmethod
    def open_shard(path: Path) -> BinShard:
        return BinShard(path)


class BinShard:
    """One ``.bin`` shard opened read-only; arrays are memory-mapped lazily in each process."""

    def __init__(self, path: Path):
        self.path = Path(path)
        meta_path = self.path / META_NAME
        if not meta_path.is_file():
            raise StoreError(
                f"{self.path}: no {META_NAME}; the shard is incomplete (was packing interrupted?) — "
                "re-run `cookmind pack`"
            )
        self.meta = read_meta(meta_path)
        _check_version(self.meta, meta_path)
        self.keys = tuple(self.meta["keys"])
        self._offsets = {k: np.asarray(v["offsets"], dtype=np.int64) for k, v in self.meta["keys"].items()}
        self._maps: dict[str, np.ndarray] = {}
        for key, info in self.meta["keys"].items():
            f = self.path / f"{key}.bin"
            want = int(np.prod(info["shape"])) * np.dtype(info["dtype"]).itemsize
            if not f.is_file():
                raise StoreError(f"{f}: missing; the store is incomplete — re-run `cookmind pack`")
            if f.stat().st_size != want:
                raise StoreError(
                    f"{f}: expected {want} bytes for shape {info['shape']} {info['dtype']}, found {f.stat().st_size}; "
                    "the file was cut short or changed since it was packed — re-run `cookmind pack`"
                )

    def offsets(self, key: str) -> np.ndarray:
        """Record boundaries of ``key``: record i is ``array[offsets[i]:offsets[i+1]]``."""
        return self._offsets[key]

    def array(self, key: str) -> np.ndarray:
        """The flat array of ``key`` (a read-only memmap; slicing it reads only those bytes)."""
        arr = self._maps.get(key)
        if arr is None:
            info = self.meta["keys"][key]
            if int(np.prod(info["shape"])) == 0:
                arr = np.zeros(info["shape"], dtype=info["dtype"])  # mmap of an empty file is an error
            else:
                arr = np.memmap(self.path / f"{key}.bin", dtype=info["dtype"], mode="r", shape=tuple(info["shape"]))
            self._maps[key] = arr
        return arr

    def share_memory(self) -> None:
        """Nothing to do: memmapped pages are already shared between processes by the OS."""

    def __getstate__(self):
        # Pickled into spawn-started workers: send the path, not the mapped bytes.
        state = self.__dict__.copy()
        state["_maps"] = {}
        return state


def _check_version(meta: dict, where) -> None:
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise StoreError(f"{where}: format_version {version!r}, this cookmind reads {FORMAT_VERSION}; re-pack the data")
