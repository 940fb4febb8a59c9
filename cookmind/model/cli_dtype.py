"""Parse a --dtype flag value into a torch dtype (shared by the export/import stages)."""

from __future__ import annotations

import argparse

# every name --dtype takes -> torch's name for the dtype (torch is imported only to parse: --help stays instant)
DTYPE_NAMES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}
_SHORT = [name for name, full in DTYPE_NAMES.items() if name != full]
DTYPE_HELP = (
    f"cast weights: {', '.join(_SHORT[:-1])} or {_SHORT[-1]} (also spelled "
    f"{', '.join(dict.fromkeys(DTYPE_NAMES.values()))}; default: keep)"
)


def parse_dtype(name: str | None):
    """None -> None (keep the file's dtype); 'bf16' etc. -> torch dtype; anything else -> argparse error."""
    if name is None:
        return None
    if name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"--dtype {name!r}: choose one of {sorted(DTYPE_NAMES)}")
    import torch

    return getattr(torch, DTYPE_NAMES[name])
