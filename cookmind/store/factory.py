"""Pick a store backend by name (``StoreFactory.create``) or by looking at a path (``detect_format``)."""

from __future__ import annotations

from pathlib import Path

from cookmind.store.bin_store import BinBackend
from cookmind.store.h5_store import H5Backend
from cookmind.store.layout import META_NAME, StoreError, read_meta

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class StoreFactory:
    """Registry of store backends: ``"bin"`` (raw arrays + mmap) and ``"h5"`` (HDF5)."""

    _backends = {"bin": BinBackend, "h5": H5Backend}

    @classmethod
    def create(cls, storage_type: str):
        """Return the backend named ``storage_type``; an unknown name is an error listing the choices."""
        try:
            return cls._backends[storage_type]
        except KeyError:
            raise StoreError(f"unknown store format {storage_type!r}; choose one of {sorted(cls._backends)}") from None

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._backends)


def detect_format(path) -> str:
    """Return ``"bin"`` or ``"h5"`` for a store directory, a ``.bin`` shard directory or an ``.h5`` file."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(8) == HDF5_SIGNATURE:
                return "h5"
        raise StoreError(
            f"{path}: a file that is not HDF5, so not a token store (a directory made by `cookmind pack`, or an .h5 "
            f"shard); if it is text, JSON lines or Parquet, {_pack_first(path)}"
        )
    if not path.is_dir():
        raise StoreError(f"{path}: no such store; make one with `cookmind pack --out {path}`")
    meta = path / META_NAME
    if not meta.is_file() and any(path.glob("shard-*")):  # text a curate run wrote: never packed
        raise StoreError(f"{path}: a `cookmind curate run` output (text), not a token store; {_pack_first(path)}")
    if not meta.is_file():
        raise StoreError(
            f"{path}: no {META_NAME}; the store is incomplete or not a cookmind store — re-run `cookmind pack`"
        )
    fmt = read_meta(meta).get("format")
    if fmt in StoreFactory._backends:
        return fmt
    raise StoreError(f"{meta}: unknown format {fmt!r}; expected one of {StoreFactory.names()}")


def _pack_first(path: Path) -> str:
    return (
        f"tokenize it into one first: `cookmind pack --tokenizer TOK --train-type seq --input {path} --out STORE` "
        "(add --val-fraction 0.01 --val-out VAL for a validation store), then pass STORE"
    )
