"""Token stores: ``.bin`` (raw arrays + ``meta.json``, memory-mapped) and ``.h5`` (one HDF5
dataset per key), the writer that shards them atomically, and the packer behind ``cookmind pack``."""

from cookmind.store.factory import StoreFactory, detect_format
from cookmind.store.layout import FORMAT_VERSION, TRAIN_TYPE_KEYS, StoreError, token_dtype
from cookmind.store.token_store import TokenStore
from cookmind.store.writer import StoreWriter, write_store

__all__ = [
    "FORMAT_VERSION",
    "TRAIN_TYPE_KEYS",
    "StoreError",
    "StoreFactory",
    "StoreWriter",
    "TokenStore",
    "detect_format",
    "token_dtype",
    "write_store",
]
