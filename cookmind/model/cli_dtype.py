"""Parse a --dtype flag value into a torch dtype (shared by the export/import stages)."""

from __future__ import annotations

import argparse

import torch

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def parse_dtype(name: str | None) -> torch.dtype | None:
    """None -> None (keep the file's dtype); 'bf16' etc. -> torch dtype; anything else -> argparse error."""
    if name is None:
        return None
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"--dtype {name!r}: choose one of {sorted(DTYPES)}")
    return DTYPES[name]
