"""Exact-line deduplication: a line seen more than once anywhere in the corpus is removed everywhere.

Two passes over 64-bit line hashes, memory bounded: pass 1 writes each shard's hashes into
``num_partitions`` files by hash range; each partition is then counted on its own
(np.unique), so the largest array in memory is one partition, never the corpus. Pass 2 drops
the lines whose hash was counted more than once. Blank lines are kept (they mark paragraphs), and so are a plain
text file's ``<|endoftext|>`` separators, on a line of their own or at either end of a text line (they mark its
documents: TinyStories' stories, as pack reads them), but for the one a story whose every line went takes with it;
every byte of a document but its removed lines stays as it was. A record's text (curate run's documents) is one
document: a line holding the token is a line of text like any other.
"""

from __future__ import annotations

import functools
import gzip
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import xxhash

from cookmind import text_input
from cookmind.atomic import writing
from cookmind.curate.dedup_output import building_dedup_output
from cookmind.curate.shards import edge_pieces, is_separator_line, is_text_line


def line_hashes(text: str, separated: bool = False) -> np.ndarray:
    """xxh64 of every text line (trailing whitespace ignored). ``separated``: ``text`` is a plain text file's, whose
    separators are no text lines, and a line is cut where one stands at its start or end (``shards.edge_pieces``). A
    separator line is in every story file: counted as a shared line, it went, and the stories ran together; so did a
    story's last line with the separator after it."""
    return np.array(
        [_hash(piece) for piece in _pieces(text, separated)[0] if _is_text(piece, separated)], dtype=np.uint64
    )


def text_words(text: str, separated: bool = False) -> int:
    """Words on the text lines of ``text`` (``separated``: as ``line_hashes``): a plain text left with only
    separators has none."""
    return sum(len(piece.split()) for piece in _pieces(text, separated)[0] if _is_text(piece, separated))


def _is_text(piece: str, separated: bool) -> bool:
    """Whether a piece is a text line: not blank, nor (in a plain text, ``separated``) a separator."""
    return is_text_line(piece) if separated else bool(piece.strip())


def _is_separator(piece: str, separated: bool) -> bool:
    """Whether a piece ends a document: a separator of a plain text (``separated``); a record's text has none."""
    return separated and is_separator_line(piece)


def _pieces(body: str, separated: bool) -> tuple[list[str], list[int]]:
    """The pieces of ``body``'s lines (``separated``: ``shards.edge_pieces``, text, the separators at a line's ends,
    blank lines; else its lines) and the line of each."""
    pieces, line_of = [], []
    for i, line in enumerate(body.split("\n")):
        for piece in edge_pieces(line) if separated else [line]:
            pieces.append(piece)
            line_of.append(i)
    return pieces, line_of


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


def remove_lines(text: str, duplicated: np.ndarray, separated: bool = False) -> tuple[str, int, int]:
    """``text`` without the lines whose hash is in the sorted array ``duplicated``; (text, lines removed, documents
    emptied).

    ``separated`` (a plain text file's ``text``): a line is taken as the pieces ``shards.edge_pieces`` cuts it
    into, and text removed from a line that also holds a separator leaves the separator there. Every other byte
    stays (line endings, indentation, the final newline), except blank lines the removal strands: a blank run that a
    removal joins to another blank run, or to the start or end of the text; and a document (``separated``: the text
    between ``<|endoftext|>`` separators; else all of it) whose every text line was removed: it goes whole with the
    separator after it (the last one's: before it), so no removal leaves an empty document between two separators,
    nor a separator at the start or end of the text. Those are counted.
    """
    body, end = (text[:-1], "\n") if text.endswith("\n") else (text, "")  # the final newline is no line
    pieces, line_of = _pieces(body, separated)
    hit = np.zeros(len(pieces), bool)
    if len(duplicated):
        hashes = np.array([_hash(piece) for piece in pieces], dtype=np.uint64)
        idx = np.minimum(np.searchsorted(duplicated, hashes), len(duplicated) - 1)
        hit = (duplicated[idx] == hashes) & np.array([_is_text(piece, separated) for piece in pieces])
    if not hit.any():
        return text, 0, 0
    drop, emptied = _emptied_documents(pieces, hit, separated)
    kept: list[int] = []  # the kept pieces, by index
    gap = False  # a piece was removed since the last kept one
    for k, (piece, removed) in enumerate(zip(pieces, drop)):
        if removed:
            gap = True
        elif not (not piece.strip() and gap and (not kept or not pieces[kept[-1]].strip())):
            kept.append(k)
            gap = False
    while gap and kept and not pieces[kept[-1]].strip():  # the text ended inside a removal
        kept.pop()
    lines: dict[int, str] = {}  # a line's kept pieces, joined as they stood
    for k in kept:
        lines[line_of[k]] = lines.get(line_of[k], "") + pieces[k]
    return ("\n".join(lines.values()) + end if kept else ""), int(hit.sum()), emptied


def _emptied_documents(lines: list[str], hit: np.ndarray, separated: bool) -> tuple[list[bool], int]:
    """(the lines to drop, the documents emptied): the ``hit`` lines, and each document whose text lines were all
    hit, whole, with one separator: the kept documents stay joined by the separator that followed each, so an
    emptied document's lines and the separator after it go (the last document's: the one before it)."""
    doc_of, d = [], 0  # the document of each line; a separator's: the one it ends
    for line in lines:
        doc_of.append(d)
        d += _is_separator(line, separated)
    had, left = [False] * (d + 1), [False] * (d + 1)  # text lines before the removal, and after it
    for line, doc, removed in zip(lines, doc_of, hit):
        if _is_text(line, separated):
            had[doc] = True
            left[doc] = left[doc] or not removed
    emptied = [h and not k for h, k in zip(had, left)]
    kept_docs = [doc for doc in range(d + 1) if not emptied[doc]]
    # an empty document the input had between two separators ("<S>\n<S>") that a removal leaves first or last would
    # leave a separator at that end: it goes too (the input's own leading or trailing one, "<S>\nA", stays)
    while kept_docs and kept_docs[-1] != d and not had[kept_docs[-1]]:
        kept_docs.pop()
    while kept_docs and kept_docs[0] != 0 and not had[kept_docs[0]]:
        kept_docs.pop(0)
    if any(emptied) and not any(had[doc] for doc in kept_docs):  # no story left: no separator either
        kept_docs = []
    gone = set(range(d + 1)) - set(kept_docs)
    joining = set(kept_docs[:-1])  # the separators that still join two kept documents, by the one they end
    drop = [
        doc not in joining if _is_separator(line, separated) else bool(removed) or doc in gone
        for line, doc, removed in zip(lines, doc_of, hit)
    ]
    return drop, sum(emptied)


def _hash(line: str) -> int:
    # surrogatepass: undecodable bytes (kept as surrogates) hash too, the same way in both passes
    return xxhash.xxh64_intdigest(line.rstrip().encode("utf-8", "surrogatepass"))


def exact_line_dedup(
    input_files: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    num_partitions: int = 16,
    overwrite: bool = False,
    progress: bool = False,
) -> list[Path]:
    """Rewrite each input file (its documents between <|endoftext|> lines, or one) into ``output_dir`` without
    corpus-duplicated lines.

    The folder is built whole (``dedup_output``); its record counts the text lines in, out and removed, the
    documents whose every line went (``remove_lines``: each taken out whole with a separator), and the files left
    empty. ``overwrite`` replaces an earlier dedup's folder there, never anything else.
    ``progress`` shows a bar over the files for each pass (hashed, then rewritten).
    """
    from cookmind.progress import progress_bar

    output_dir = Path(output_dir)
    bar = functools.partial(progress_bar, unit="file", enabled=progress, dynamic_ncols=True)
    with building_dedup_output(output_dir, input_files, overwrite, "lines") as (tmp, summary):
        with tempfile.TemporaryDirectory(dir=tmp, prefix=".lines-") as scratch:
            shard_dirs, lines_in = [], 0
            for i, path in enumerate(bar(input_files, desc="dedup lines: hash")):  # pass 1: hashes to partitions
                d = Path(scratch) / f"{i:06d}"
                hashes = line_hashes(_read(path), separated=True)
                lines_in += len(hashes)
                write_partitions(hashes, d, num_partitions)
                shard_dirs.append(d)
            duplicated = np.sort(np.concatenate([count_partition(shard_dirs, p) for p in range(num_partitions)]))
        removed = emptied = docs_emptied = 0
        for path in bar(input_files, desc="dedup lines: write"):  # pass 2: drop duplicated lines
            text, n, e = remove_lines(_read(path), duplicated, separated=True)
            removed, docs_emptied = removed + n, docs_emptied + e
            emptied += bool(n) and not text_words(text, separated=True)
            data = text.encode("utf-8", "surrogateescape")
            if text_input.is_gzip(path):  # read decompressed, written back as it came
                data = gzip.compress(data, mtime=0)
            with writing(tmp / Path(path).name, "wb") as f:
                f.write(data)
        summary.update(
            lines_in=lines_in,
            lines_out=lines_in - removed,
            lines_removed=removed,
            documents_emptied=docs_emptied,
            files_emptied=emptied,
        )
    return [output_dir / Path(path).name for path in input_files]


def _read(path) -> str:
    """The file's text with its bytes intact: no newline translation, undecodable bytes kept as surrogates; a leading
    byte-order mark is no text (-sig), so it is neither part of the first line nor written out. A gzip file is read
    decompressed (its gzip bytes' "lines" were hashed, and a line two files shared stayed in both)."""
    with text_input.open_bytes(path) as f:
        return f.read().decode("utf-8-sig", "surrogateescape")


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with writing(path, "wb") as f:  # a file object: np.save would add ".npy" to a temporary name
        np.save(f, arr)
