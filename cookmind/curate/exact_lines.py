"""Exact-line deduplication: a line seen more than once anywhere in the corpus is removed everywhere.

Two passes over 64-bit line hashes, memory bounded: pass 1 writes each shard's hashes into
``num_partitions`` files by hash range; each partition is then counted on its own
(np.unique), so the largest array in memory is one partition, never the corpus. Pass 2 drops
the lines whose hash was counted more than once. Blank lines are kept (they mark paragraphs).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import xxhash

from cookmind.atomic import write_text, writing

_BLANK_RUN = re.compile(r"\n{3,}")


def line_hashes(text: str) -> np.ndarray:
    """xxh64 of every non-blank line (trailing whitespace ignored)."""
    lines = [line.rstrip() for line in text.split("\n")]
    return np.array([xxhash.xxh64_intdigest(line.encode()) for line in lines if line], dtype=np.uint64)


def partition_of(hashes: np.ndarray, num_partitions: int) -> np.ndarray:
    """Partition index by the top bits of the hash: uniform, and equal hashes meet in one partition."""
    return ((hashes >> np.uint64(40)) % np.uint64(num_partitions)).astype(np.int64)


def write_partitions(hashes: np.ndarray, out_dir: Path, num_partitions: int) -> None:
    """Pass 1 for one shard: ``out_dir/part-PPP.npy`` holds this shard's hashes of partition PPP."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = partition_of(hashes, num_partitions)
    for p in range(num_partitions):
        _save_npy(out_dir / f"part-{p:03d}.npy", hashes[parts == p])


def count_partition(shard_dirs: Iterable[Path], p: int) -> np.ndarray:
    """Sorted hashes of partition ``p`` that occur more than once across all shards."""
    arrays = [np.load(d / f"part-{p:03d}.npy") for d in shard_dirs]
    if not arrays:
        return np.zeros(0, dtype=np.uint64)
    uniq, counts = np.unique(np.concatenate(arrays), return_counts=True)
    return uniq[counts > 1]


def remove_lines(text: str, duplicated: np.ndarray) -> tuple[str, int]:
    """``text`` without the lines whose hash is in the sorted array ``duplicated``; (text, lines removed).

    Runs of blank lines left behind collapse to one blank line, and the result is stripped.
    """
    lines = text.split("\n")
    hashes = np.array([xxhash.xxh64_intdigest(line.rstrip().encode()) for line in lines], dtype=np.uint64)
    idx = np.searchsorted(duplicated, hashes)
    hit = (idx < len(duplicated)) & (duplicated[np.minimum(idx, len(duplicated) - 1)] == hashes) \
        if len(duplicated) else np.zeros(len(lines), bool)
    hit &= np.array([bool(line.strip()) for line in lines])
    kept = "\n".join(line for line, h in zip(lines, hit) if not h)
    return _BLANK_RUN.sub("\n\n", kept).strip(), int(hit.sum())


def exact_line_dedup(input_files: Sequence[str | os.PathLike], output_dir: str | os.PathLike,
                     num_partitions: int = 16) -> list[Path]:
    """Rewrite each input file (one document each) into ``output_dir`` without corpus-duplicated lines."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".lines-") as scratch:
        shard_dirs = []
        for i, path in enumerate(input_files):  # pass 1: hashes to partitions, one file at a time
            d = Path(scratch) / f"{i:06d}"
            write_partitions(line_hashes(Path(path).read_text(encoding="utf-8", errors="replace")), d, num_partitions)
            shard_dirs.append(d)
        duplicated = np.sort(np.concatenate([count_partition(shard_dirs, p) for p in range(num_partitions)]))
        written = []
        for path in input_files:  # pass 2: drop duplicated lines
            text, _ = remove_lines(Path(path).read_text(encoding="utf-8", errors="replace"), duplicated)
            out = output_dir / Path(path).name
            write_text(out, text)
            written.append(out)
    return written


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with writing(path, "wb") as f:  # a file object: np.save would add ".npy" to a temporary name
        np.save(f, arr)
