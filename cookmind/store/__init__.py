"""Token stores: ``.bin`` (raw arrays + ``meta.json``, memory-mapped) and ``.h5`` (one HDF5
dataset per key), the writer that shards them atomically, and the packer behind ``cookmind pack``.

The names below load on first use: ``tokenizer train`` reads its inputs through ``cookmind.store.sources``, and
importing the stores here would import torch (seconds on a small machine) into a command that never needs it."""

from importlib import import_module

_HOME = {
    "StoreFactory": "factory",
    "detect_format": "factory",
    "FORMAT_VERSION": "layout",
    "TRAIN_TYPE_KEYS": "layout",
    "StoreError": "layout",
    "token_dtype": "layout",
    "TokenStore": "token_store",
    "StoreWriter": "writer",
    "write_store": "writer",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'cookmind.store' has no attribute {name!r}")
    value = getattr(import_module(f"cookmind.store.{_HOME[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
