"""What a token store holds: format version, keys per train type, dtypes.

A store is a directory with a top-level ``meta.json`` and shards named ``shard_NNNN``
(a directory of raw arrays for ``.bin``, one ``.h5`` file for h5). Every key is one flat
1-D array holding all records back to back; ``offsets`` (n_records + 1 ints) say where each
record starts, so variable-length records (documents, conversations, preference pairs,
prompts) survive the round trip.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
META_NAME = "meta.json"
SHARD_PREFIX = "shard_"

# Keys by train type; grpo has an online (prompts + reference answers) and an offline variant.
TRAIN_TYPE_KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "seq": (("sequence",),),
    "sft": (("sequence", "loss_mask"),),
    "dpo": (("chosen", "rejected", "chosen_mask", "rejected_mask"),),
    "grpo": (("prompts", "answers"), ("prompts", "responses", "masks", "rewards")),
}

# What each key holds decides its dtype: token ids, 0/1 masks, float rewards, UTF-8 bytes.
KEY_KIND: dict[str, str] = {
    "sequence": "token",
    "chosen": "token",
    "rejected": "token",
    "prompts": "token",
    "responses": "token",
    "loss_mask": "mask",
    "chosen_mask": "mask",
    "rejected_mask": "mask",
    "masks": "mask",
    "rewards": "float",
    "answers": "bytes",
}


class StoreError(ValueError):
    """A store is missing, incomplete, of an unknown format, or does not fit what was asked."""


def read_meta(path) -> dict:
    """A store's or a shard's ``meta.json`` as a dict; one that is not a JSON object (cut short by a full disk or a
    copy, edited by hand) is a StoreError naming the file, not a bare JSONDecodeError."""
    path = Path(path)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        raise StoreError(f"{path}: not valid JSON ({where}); the store is damaged — re-run `cookmind pack`") from None
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: not a JSON object; the store is damaged — re-run `cookmind pack`")
    return meta


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab <= 65536), else uint32; always little-endian."""
    if vocab_size <= 0:
        raise StoreError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def key_dtype(key: str, tokens: np.dtype) -> np.dtype:
    """The on-disk dtype of ``key`` given the store's token dtype."""
    kind = KEY_KIND.get(key)
    if kind is None:
        raise StoreError(f"unknown store key {key!r}; known keys: {sorted(KEY_KIND)}")
    return {"token": np.dtype(tokens), "mask": np.dtype("u1"), "float": np.dtype("<f4"), "bytes": np.dtype("u1")}[kind]


def check_keys(train_type: str, keys) -> tuple[str, ...]:
    """Return the key set for ``train_type`` that ``keys`` matches, or raise naming the allowed sets."""
    if train_type not in TRAIN_TYPE_KEYS:
        raise StoreError(f"unknown train type {train_type!r}; choose one of {sorted(TRAIN_TYPE_KEYS)}")
    got = set(keys)
    for allowed in TRAIN_TYPE_KEYS[train_type]:
        if got == set(allowed):
            return allowed
    raise StoreError(
        f"keys {sorted(got)} do not form a {train_type} store; expected one of "
        f"{[list(a) for a in TRAIN_TYPE_KEYS[train_type]]}"
    )


def is_token_key(key: str) -> bool:
    """True for keys holding token ids (counted in a store's token total)."""
    return KEY_KIND.get(key) == "token"
