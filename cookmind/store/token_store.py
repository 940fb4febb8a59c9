"""``TokenStore``: one read-only view over all shards of a store, whatever its backend.

Records are numbered globally across shards. For seq stores the records (documents) also
form one token stream, and ``stream(key, start, stop)`` reads any span of it, stitching
across shard boundaries, so windows never care where a shard ends.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from cookmind.store.factory import StoreFactory, detect_format
from cookmind.store.layout import META_NAME, StoreError, check_keys, read_meta


class TokenStore:
    """Open the store at ``path`` (format detected unless ``storage_type`` is given)."""

    def __init__(self, path, storage_type: str | None = None):
        self.path = Path(path)
        found = detect_format(self.path)
        if storage_type is not None and storage_type != found:
            raise StoreError(f"{self.path}: asked for a {storage_type!r} store but it is {found!r}")
        self.format = found
        backend = StoreFactory.create(found)
        if self.path.is_file():  # a lone .h5 shard
            self.shards = [backend.open_shard(self.path)]
            self.meta = dict(self.shards[0].meta)
        else:
            self.meta = read_meta(self.path / META_NAME)
            if "shards" in self.meta:
                self.shards = [backend.open_shard(self.path / s["name"]) for s in self.meta["shards"]]
            else:  # a single .bin shard directory opened on its own
                self.shards = [backend.open_shard(self.path)]
        self.train_type = self.meta.get("train_type")
        self.keys = check_keys(self.train_type, self.shards[0].keys)
        for s in self.shards:
            if set(s.keys) != set(self.keys):
                raise StoreError(f"{s.path}: keys {sorted(s.keys)} differ from the store's {sorted(self.keys)}")
        counts = [len(s.offsets(self.keys[0])) - 1 for s in self.shards]
        self._record_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._lengths: dict[str, np.ndarray] = {}
        self._stream_starts: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self._record_starts[-1])

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The fingerprint of the tokenizer the store was packed with (a shard opened on its own records it as
        ``tokenizer_fingerprint``); None when unrecorded."""
        tok = self.meta.get("tokenizer") or {}
        mine = tok.get("fingerprint") if isinstance(tok, dict) else None
        return mine or self.meta.get("tokenizer_fingerprint")

    def check_tokenizer(
        self, fingerprint: str | None, tokenizer_path: str | None = None, framing: dict | None = None
    ) -> None:
        """Raise when the store was packed with a different tokenizer than ``fingerprint``, or one that framed its
        documents otherwise than ``framing`` (``documents.document_framing``: the ids that open and end each), naming
        both. A tokenizer's fingerprint covers its vocabulary, merges, specials and pattern, not which of them open
        and end a document (an edited ``eos_token``, a Hugging Face folder's BOS); what a store does not record (a
        store packed before it recorded ``bos_ids``) is not checked."""
        recorded = self.meta.get("tokenizer") or {}
        packed_with = "a tokenizer whose path it does not record"
        if recorded.get("path"):
            packed_with = f"tokenizer {recorded['path']}"
        given = tokenizer_path or "the given tokenizer"
        fix = "use the store's tokenizer, or re-pack the store with this one (`cookmind pack --tokenizer ...`)"
        mine = self.tokenizer_fingerprint
        same_path = bool(tokenizer_path and recorded.get("path")) and _same_folder(recorded["path"], tokenizer_path)
        if mine is not None and fingerprint is not None and mine != fingerprint and same_path:
            raise StoreError(  # retrained in place (`tokenizer train --overwrite`): one folder, not two tokenizers
                f"{self.path} was packed with the tokenizer at {recorded['path']}, which has changed since (retrained "
                f"or replaced: fingerprint {mine[:16]} then, {fingerprint[:16]} now); re-pack the store with it "
                "(`cookmind pack --tokenizer ... --overwrite`), or give the tokenizer the store was packed with (a "
                "checkpoint trained on the store holds a copy: --tokenizer CHECKPOINT)"
            )
        if mine is not None and fingerprint is not None and mine != fingerprint:
            raise StoreError(
                f"{self.path} was packed with {packed_with} (fingerprint {mine[:16]}), "
                f"not {given} (fingerprint {fingerprint[:16]}); {fix}"
            )
        for key, what in (("bos_ids", "open with ids"), ("eos_id", "end with id")):
            if framing is None or key not in recorded:
                continue
            then, now = recorded[key], framing.get(key)
            if key == "bos_ids":
                then, now = list(then), list(now or ())
            if then != now:
                raise StoreError(
                    f"{self.path} was packed with {packed_with}, whose documents {what} {then}; {given}'s documents "
                    f"{what} {now}, so a model trained on the store would be prompted otherwise than it learned; {fix}"
                )

    def fingerprint(self) -> str:
        """16 hex digits naming what the store holds, cheap at any size (a resume checks by it that it continues on
        the data it trained on): a hash of meta.json less what says how or where it was packed (pack's time and
        workers, input and output paths), and per shard and key the lengths of the array and its offsets and
        ``FINGERPRINT_BLOCKS`` evenly spaced blocks of each (the first and the last among them). The same pack again
        gives the same one; another --seed (another split), other text, or other settings give another. Not every
        byte is read: a change confined to unread bytes of a store whose meta.json and sizes are equal goes unseen."""
        h = hashlib.blake2b(digest_size=8)
        h.update(json.dumps(_identity_meta(self.meta), sort_keys=True, default=str).encode())
        for shard in self.shards:
            for key in self.keys:
                for arr in (np.asarray(shard.offsets(key)), shard.array(key)):
                    h.update(f"{key}:{len(arr)}:{arr.dtype.str};".encode())
                    for block in _sample_blocks(len(arr)):
                        h.update(np.ascontiguousarray(arr[block]).tobytes())
        return h.hexdigest()

    def record(self, key: str, i: int) -> np.ndarray:
        """Record ``i`` (global index) of ``key`` as a numpy array."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for a store of {n} records")
        i %= n
        s = int(np.searchsorted(self._record_starts, i, side="right")) - 1
        shard = self.shards[s]
        off = shard.offsets(key)
        j = i - int(self._record_starts[s])
        return shard.array(key)[off[j] : off[j + 1]]

    def lengths(self, key: str) -> np.ndarray:
        """Length of every record of ``key`` (int64, one per record)."""
        if key not in self._lengths:
            self._lengths[key] = np.concatenate([np.diff(s.offsets(key)) for s in self.shards]).astype(np.int64)
        return self._lengths[key]

    def stream_starts(self, key: str) -> np.ndarray:
        """Where each shard's array begins in the concatenated stream of ``key`` (n_shards + 1 ints)."""
        if key not in self._stream_starts:
            sizes = [int(s.offsets(key)[-1]) for s in self.shards]
            self._stream_starts[key] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return self._stream_starts[key]

    def stream_length(self, key: str) -> int:
        return int(self.stream_starts(key)[-1])

    def document_starts(self, key: str) -> np.ndarray:
        """Stream position where each record (document) of ``key`` begins."""
        parts = [s.offsets(key)[:-1] + base for s, base in zip(self.shards, self.stream_starts(key)[:-1])]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def stream(self, key: str, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of the concatenated stream of ``key`` (copied into a new array)."""
        starts = self.stream_starts(key)
        if not 0 <= start <= stop <= starts[-1]:
            raise IndexError(f"span {start}:{stop} outside the stream of {int(starts[-1])} {key} tokens")
        first = int(np.searchsorted(starts, start, side="right")) - 1
        pieces, pos, s = [], start, first
        while pos < stop:
            lo, hi = pos - int(starts[s]), min(stop, int(starts[s + 1])) - int(starts[s])
            pieces.append(np.asarray(self.shards[s].array(key)[lo:hi]))
            pos = int(starts[s]) + hi
            s += 1
        if len(pieces) == 1:
            return np.array(pieces[0])
        return np.concatenate(pieces) if pieces else np.zeros(0, self.shards[0].array(key).dtype)

    def share_memory(self) -> None:
        """Make the data shareable with forked DataLoader workers without copies (h5: shared tensors)."""
        for s in self.shards:
            s.share_memory()


FINGERPRINT_BLOCKS = 16  # blocks of each array a fingerprint reads, evenly spaced from its start to its end
FINGERPRINT_BLOCK = 4096  # values per block


def _sample_blocks(n: int) -> list[slice]:
    """The spans of an array of ``n`` values that ``TokenStore.fingerprint`` reads: all of a short one."""
    if n <= FINGERPRINT_BLOCKS * FINGERPRINT_BLOCK:
        return [slice(0, n)]
    step = (n - FINGERPRINT_BLOCK) / (FINGERPRINT_BLOCKS - 1)
    return [slice(round(i * step), round(i * step) + FINGERPRINT_BLOCK) for i in range(FINGERPRINT_BLOCKS)]


def _identity_meta(meta: dict) -> dict:
    """``meta`` less what says how or where a store was packed rather than what it holds: pack's seconds and
    workers, the inputs' and outputs' paths (the skipped records' examples name them: their counts stay), the
    tokenizer's folder (its fingerprint stays)."""
    meta = json.loads(json.dumps(meta, default=str))  # a deep copy
    for section, keys in (
        ("pack", ("seconds", "workers")),
        ("split", ("train_out", "val_out")),
        ("tokenizer", ("path",)),
        ("skipped", ("examples",)),
    ):
        if isinstance(meta.get(section), dict):
            for k in keys:
                meta[section].pop(k, None)
    if isinstance(meta.get("sources"), list):
        meta["sources"] = [
            {k: v for k, v in s.items() if k != "path"} if isinstance(s, dict) else s for s in meta["sources"]
        ]
    return meta


def _same_folder(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one folder (a relative one from the current directory)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False
