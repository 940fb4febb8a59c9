"""``StoreWriter``: collect records, cut them into shards, finish with ``meta.json`` and a rename.

Everything goes into a hidden temporary directory beside ``out``; only ``close()`` renames it
into place, after the last shard and the top-level ``meta.json`` are on disk. A crash or a
bad input line therefore never leaves a store that loads. ``overwrite`` replaces only a token
store holding nothing but its own files (``is_store_file``): any other file or directory at ``out``,
or a store the user added files to, is refused before any work starts.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from cookmind.atomic import check_replaceable, clean_stale_temps, replace_dir, temp_name, write_json
from cookmind.store.factory import StoreFactory
from cookmind.store.layout import (
    FORMAT_VERSION,
    KEY_KIND,
    META_NAME,
    SHARD_PREFIX,
    check_keys,
    is_token_key,
    key_dtype,
    token_dtype,
)

_GRPO_KINDS = {
    False: "a problem with its reference answer (online)",
    True: "scored responses (offline, prompt/response/reward)",
}


class StoreWriter:
    """Write a store of ``train_type`` records in ``storage_type`` format under ``out``.

    Each record is a dict ``key -> 1-D array`` (a reward is a length-1 array). A shard is
    closed once it holds ``shard_tokens`` tokens; records are never split across shards.
    """

    def __init__(
        self,
        out,
        train_type: str,
        vocab_size: int,
        storage_type: str = "bin",
        shard_tokens: int = 100_000_000,
        overwrite: bool = False,
        meta: dict | None = None,
        part: str = "",
    ):
        """``part`` names the temporary folder of a second writer for the same ``out`` in one process apart (pack's
        grpo kinds: only one of the two is committed)."""
        self.out = Path(out)
        self.train_type = train_type
        self.backend = StoreFactory.create(storage_type)
        self.tokens_dtype = token_dtype(vocab_size)
        self.vocab_size = vocab_size
        self.shard_tokens = max(1, int(shard_tokens))
        self.overwrite = overwrite
        self.meta = dict(meta or {})
        self.keys: tuple[str, ...] | None = None
        check_store_out(self.out, overwrite)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.out.parent)  # what a killed pack left behind
        self.tmp = temp_name(self.out.with_name(f"{self.out.name}~{part}") if part else self.out)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        self.shards: list[dict] = []
        self.num_records = 0
        self.num_tokens = 0
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._buf: dict[str, list[np.ndarray]] = {}
        self._buf_records = 0
        self._buf_tokens = 0

    def add(self, record: dict[str, np.ndarray]) -> None:
        """Append one record; all records must have the same keys, which must fit the train type."""
        if self.keys is None:
            self.keys = check_keys(self.train_type, record.keys())
            self._dtypes = {k: key_dtype(k, self.tokens_dtype) for k in self.keys}
        elif set(record) != set(self.keys):
            if self.train_type == "grpo":  # the one type of two record kinds: prompts with answers, scored responses
                this, first = _GRPO_KINDS["responses" in record], _GRPO_KINDS["responses" in self.keys]
                raise ValueError(
                    f"this record is {this}, the ones before it {first}: a grpo store holds one kind; pack each kind "
                    "into its own store"
                )
            raise ValueError(f"record keys {sorted(record)} differ from the store's keys {sorted(self.keys)}")
        for key in self.keys:
            arr = np.asarray(record[key]).reshape(-1)
            if is_token_key(key) and arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
                raise ValueError(f"{key}: token id out of range [0, {self.vocab_size}): {arr.min()}..{arr.max()}")
            self._buf.setdefault(key, []).append(arr.astype(self._dtypes[key], copy=False))
            if is_token_key(key):
                self._buf_tokens += arr.size
        self._buf_records += 1
        if self._buf_tokens >= self.shard_tokens:
            self._flush()

    def _flush(self) -> None:
        if not self._buf_records:
            return
        name = f"{SHARD_PREFIX}{len(self.shards):04d}{self.backend.suffix}"
        arrays, offsets = {}, {}
        for key in self.keys:
            parts = self._buf[key]
            lengths = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
            offsets[key] = np.concatenate([[0], np.cumsum(lengths)])  # offsets[i] = sum(len[:i])
            arrays[key] = np.concatenate(parts) if parts else np.zeros(0, self._dtypes[key])
        shard_meta = {
            "train_type": self.train_type,
            "num_records": self._buf_records,
            "num_documents": self._buf_records,
            "num_tokens": self._buf_tokens,
            "tokenizer_fingerprint": self.meta.get("tokenizer", {}).get("fingerprint"),
        }
        self.backend.write_shard(self.tmp / name, arrays, offsets, shard_meta)
        self.shards.append(
            {
                "name": name,
                "num_records": self._buf_records,
                "num_tokens": self._buf_tokens,
                "shapes": {k: list(a.shape) for k, a in arrays.items()},
            }
        )
        self.num_records += self._buf_records
        self.num_tokens += self._buf_tokens
        self._reset_buffer()

    def close(self, extra_meta: dict | None = None) -> Path:
        """Flush the last shard, write the top-level ``meta.json`` and rename the store into place."""
        self.finish(extra_meta)
        return self.commit()

    def finish(self, extra_meta: dict | None = None) -> None:
        """Flush the last shard and write the top-level ``meta.json``, all still under the temporary name (``pack``
        finishes a training and a validation store before it renames either: a stop between leaves neither)."""
        if self.keys is None:
            self.abort()
            raise ValueError(f"no records to write to {self.out}: every input was empty or skipped")
        self._flush()
        meta = {
            "format_version": FORMAT_VERSION,
            "format": self.backend.name,
            "train_type": self.train_type,
            "keys": {k: {"dtype": self._dtypes[k].str} for k in self.keys},
            "vocab_size": self.vocab_size,
            "num_records": self.num_records,
            "num_documents": self.num_records,
            "num_tokens": self.num_tokens,
            "shards": self.shards,
            **self.meta,
            **(extra_meta or {}),
        }
        write_json(self.tmp / META_NAME, meta)

    def commit(self) -> Path:
        """Rename the finished store into place (replacing the store at ``out`` under ``overwrite``)."""
        replace_dir(self.tmp, self.out, self.overwrite, is_token_store, "token store", is_store_file)
        return self.out

    def abort(self) -> None:
        """Throw the unfinished store away."""
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


# The names StoreWriter writes: meta.json, shard_NNNN (a .bin folder of KEY.bin + meta.json) or shard_NNNN.h5.
_SHARD = re.escape(SHARD_PREFIX) + r"\d{4,}"
_STORE_FILE = re.compile(
    rf"^(?:{re.escape(META_NAME)}|{_SHARD}|{_SHARD}\.h5|{_SHARD}/(?:{re.escape(META_NAME)}|(?:{'|'.join(KEY_KIND)})\.bin))$"
)


def check_store_out(out, overwrite: bool) -> None:
    """Raise FileExistsError unless a store may be written at ``out`` (new, or a store of its own files to
    replace with ``overwrite``); call it before long work."""
    check_replaceable(Path(out), overwrite, is_token_store, "token store", is_store_file)


def is_store_file(name: str) -> bool:
    """Whether ``name`` (relative to a store, ``/``-separated) is one ``StoreWriter`` writes: --overwrite deletes
    a store whole, so it must hold nothing else."""
    return _STORE_FILE.match(name) is not None


def is_token_store(path: Path) -> bool:
    """Whether ``path`` is a directory that ``StoreWriter`` made (a ``meta.json`` naming format and shards);
    ``is_store_file`` says whether it holds anything else."""
    meta = Path(path) / META_NAME
    if not Path(path).is_dir() or not meta.is_file():
        return False
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"format_version", "train_type", "shards"} <= set(data)


def write_store(out, train_type: str, records, vocab_size: int, storage_type: str = "bin", **kwargs) -> Path:
    """Write an iterable of records as a store in one call (handy in tests and scripts)."""
    with StoreWriter(out, train_type, vocab_size, storage_type, **kwargs) as w:
        for r in records:
            w.add(r)
        return w.close()
