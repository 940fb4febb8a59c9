"""Lines of UTF-8 text files that users give (JSONL records, CSV rows), bad bytes an error naming file:line.

Opened as text, a file with one bad byte raised a bare ``UnicodeDecodeError`` ("can't decode byte 0xe9 in
position 41") from somewhere inside the reader's buffer: no file, no line, no way to find it in a 1 GB shard. Read
here line by line as bytes, the error says where. Nothing here imports other cookmind packages: every layer may
use it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

BOM = "\ufeff"
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str | os.PathLike) -> bool:
    """True for a gzip file: by its ``.gz`` suffix or, whatever its name, by its first two bytes."""
    if os.fspath(path).lower().endswith(".gz"):
        return True
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


class _NamedGzip(gzip.GzipFile):
    """A gzip file whose read errors are ValueErrors naming it: a file cut short raised a bare EOFError ("Compressed
    file ended before the end-of-stream marker was reached"), which no command's one-line error caught, and a .gz
    that is not gzip "Not a gzipped file (b'no')" without the file."""

    def _named(self, read, *args):
        try:
            return read(*args)
        except EOFError:
            raise ValueError(
                f"{self.name}: the gzip data ends early (the file was cut short); copy or download it again"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise ValueError(
                f"{self.name}: not gzip data, or damaged ({exc}); give it uncompressed, or compress it again"
            ) from None

    def read(self, size=-1):
        return self._named(super().read, size)

    def read1(self, size=-1):
        return self._named(super().read1, size)

    def readinto(self, b):
        return self._named(super().readinto, b)

    def readline(self, size=-1):
        return self._named(super().readline, size)

    def peek(self, n):
        return self._named(super().peek, n)

    def close(self):
        raw = self.fileobj  # ours: opened by open_bytes, which GzipFile would leave open
        try:
            super().close()
        finally:
            if raw is not None:
                raw.close()


def open_bytes(path: str | os.PathLike):
    """A user's input file opened for reading bytes, decompressed if it is gzip (its ``.gz`` suffix or, whatever its
    name, its first two bytes); a gzip file cut short, damaged or not gzip at all is a ValueError naming it when
    read. The file is opened once, so a pipe (``--data <(zcat ...)``) reads as a file does: the first bytes are
    peeked, not read by a second opening."""
    raw = open(path, "rb")
    try:
        gz = os.fspath(path).lower().endswith(".gz") or raw.peek(2)[:2] == GZIP_MAGIC
        if not gz:
            refuse_other_compression(path, raw.peek(10)[:10])
    except BaseException:
        raw.close()
        raise
    return _NamedGzip(filename=os.fspath(path), mode="rb", fileobj=raw) if gz else raw


# how files compressed otherwise than gzip begin: read as text, such a file was "invalid UTF-8 ... re-encode it" to
# pack, tokenizer train and eval ppl, and one document of U+FFFD to curate run
OTHER_COMPRESSIONS = (
    (b"BZh", "bzip2", "bunzip2 -k"),
    (b"\xfd7zXZ\x00", "xz", "unxz -k"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"PK\x03\x04", "zip", "unzip"),
)


def refuse_other_compression(path: str | os.PathLike, head: bytes | None = None) -> None:
    """Raise a ValueError naming ``path`` if its first bytes (``head``, else read) are those of a compression other
    than gzip, which cookmind does not read."""
    if head is None:
        with open(path, "rb") as f:
            head = f.read(10)
    for magic, name, tool in OTHER_COMPRESSIONS:
        bz2_block = head[3:4].isdigit() and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90")  # a block, or the stream's end
        if head.startswith(magic) and (name != "bzip2" or bz2_block):
            raise ValueError(
                f"{os.fspath(path)}: {name}-compressed, which cookmind does not read (gzip, .gz, it reads as it "
                f"comes): decompress it first (`{tool} {os.fspath(path)}`), or recompress it with gzip"
            )


def parquet_rows(path: str | os.PathLike) -> Iterator[dict]:
    """A Parquet file's rows as dicts; a file that is not Parquet (or is damaged) is a ValueError naming it."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        for batch in batches:
            yield from batch.to_pylist()
    except (pyarrow.ArrowException, OSError) as exc:
        raise ValueError(f"{os.fspath(path)}: not a Parquet file, or damaged ({exc})") from None


def parquet_num_rows(path: str | os.PathLike) -> int:
    """How many rows a Parquet file's footer says it holds (a ValueError naming a file that is not Parquet)."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pyarrow.ArrowException, OSError) as exc:
        raise ValueError(f"{os.fspath(path)}: not a Parquet file, or damaged ({exc})") from None


def readable_as_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is something one input file can be read from: a regular file, or a pipe (``<(command)``, a
    FIFO, /dev/stdin) — anything that exists and is no folder. ``Path.is_file()`` is False for a pipe: a config
    given as ``--config <(...)`` was refused as "no such file"."""
    return os.path.exists(path) and not os.path.isdir(path)


def pipe_refusal(path: str | os.PathLike, why: str) -> str | None:
    """The one-line refusal of an input that exists but is no regular file or folder (a pipe), for a reader that
    cannot take one (``why``: what it does with the file); None for anything else."""
    if not os.path.exists(path) or os.path.isdir(path) or os.path.isfile(path):
        return None
    return (
        f"input {os.fspath(path)} is a pipe, not a regular file, and {why}; write it to a file first "
        "(e.g. `zcat a.txt.gz > a.txt`) and name that"
    )


def refuse_a_second_naming(seen: dict, path: Path, named: str, what: str) -> None:
    """Note input file ``path`` (``named`` as the user named it) in ``seen``; refuse it if noted already (named twice:
    directly, by another spelling, or through its folder), as its ``what`` would be read twice."""
    key = Path(path).resolve()
    if key in seen:
        raise ValueError(
            f"input {named} is the same file as {seen[key]}: its {what} would be read twice; name each file once"
        )
    seen[key] = named


def refuse_unfinished_curate_output(folder: str | os.PathLike) -> None:
    """Refuse (ValueError) an input folder holding a ``cookmind curate run`` that has not finished: the run writes its
    shards one by one and its report last, so one stopped by Ctrl-C or a crash leaves some of its shards, which a
    reader of the folder would take for the whole corpus. ``_work/run.json`` names what the run writes."""
    import json

    folder = Path(folder)
    run_json = folder / "_work" / "run.json"
    if not run_json.is_file():
        return
    try:
        outputs = json.loads(run_json.read_text()).get("outputs") or []
    except (OSError, ValueError, AttributeError):
        outputs = []
    # its shards, and its report, written last (a run from before outputs were recorded has one too); not its lists
    # of removed documents, which a reader does not read and a user may delete
    shards = sorted(name for name in outputs if isinstance(name, str) and name.startswith("shard-"))
    missing = [name for name in [*shards, "report.json"] if not (folder / name).is_file()]
    if not missing:
        return
    there = [name for name in shards if (folder / name).is_file()]
    of = f"{len(there)} of its {len(shards)} shards" if shards else "some of its shards"
    raise ValueError(
        f"input folder {folder} holds an unfinished `cookmind curate run` ({of} written, {missing[0]} missing): its "
        f"shards are not the whole corpus; finish it by rerunning `cookmind curate run` with the same config and "
        f"inputs and --output {folder}, or name the shard files you want read"
    )


def written_by_cookmind(p: Path) -> bool:
    """Whether ``p`` is a file a cookmind command wrote beside its documents, no input of its own: a curate output's
    report (beside its ``_work/run.json``), a synthetic crawl's ``manifest.json`` (``is_synthetic_crawl``) or a token
    store's ``meta.json`` (``is_token_store``)."""
    if p.name in ("report.json", "report.md"):
        return (p.parent / "_work" / "run.json").is_file()
    if p.name == "manifest.json":
        return is_synthetic_crawl(p.parent)
    if p.name == "meta.json":
        return is_token_store(p.parent)
    return False


def is_token_store(folder: Path) -> bool:
    """Whether ``folder`` holds a token store ``cookmind pack`` wrote: its meta.json beside shard_NNNN folders or
    .h5 files (token ids, no text to read)."""
    return (folder / "meta.json").is_file() and any(folder.glob("shard_[0-9]*"))


def token_store_as_input(folder: Path) -> str:
    """What to say of a token store given where text goes: what it holds, the text it was packed from (its
    meta.json's ``sources``), and where a store goes."""
    try:
        sources = [s["path"] for s in json.loads((folder / "meta.json").read_text()).get("sources", [])]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        sources = []
    came = f"; it was packed from {', '.join(sources[:3])}{' ...' if len(sources) > 3 else ''}" if sources else ""
    return (
        f"{folder} is a token store (made by `cookmind pack`): it holds token ids, not text{came}. Give the text "
        f"instead; a store is trained on as it is: `cookmind train --train-data {folder}`"
    )


def is_synthetic_crawl(folder: Path) -> bool:
    """Whether ``folder`` holds a ``cookmind curate crawl``: HTML pages in crawl-*.jsonl.gz beside its manifest.json."""
    return (folder / "manifest.json").is_file() and any(folder.glob("crawl-*.jsonl.gz"))


def utf8_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line number, line with its newline) of a UTF-8 file, decompressed if it is gzip (``open_bytes``); a
    byte-order mark opening the file is no text. Invalid UTF-8 is a ValueError naming the file, line and byte."""
    name = os.fspath(path)
    with open_bytes(name) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(bad_utf8(name, n, exc.start)) from None
            yield n, line.removeprefix(BOM) if n == 1 else line


# pack's document separator in plain text, the one curate run splits a text file at too
ENDOFTEXT = "<|endoftext|>"


def separated_documents(text: str, separator: str = ENDOFTEXT) -> Iterator[tuple[int, str]]:
    """(line, document) for each document of a plain text between separators, whitespace around each left out, as
    pack, curate run and eval ppl read a text file. ``line`` is the 1-based line its text starts at (a blank one's:
    the line of the separator that ends it). A blank document between two separators is yielded (as "") for the
    reader to count as empty; blank text before the first separator or after the last (a file that ends with one)
    is no document."""
    line = 1
    docs = text.split(separator) if separator else [text]
    for i, doc in enumerate(docs):
        stripped = doc.strip()
        if stripped or 0 < i < len(docs) - 1:
            yield line + doc[: len(doc) - len(doc.lstrip())].count("\n"), stripped
        line += doc.count("\n") + separator.count("\n")


def read_utf8(path: str | os.PathLike) -> str:
    """A whole UTF-8 file's text (a byte-order mark opening it is no text); invalid UTF-8 is a ValueError naming the
    file, line and byte."""
    with open(os.fspath(path), "rb") as f:
        return decode_utf8(f.read(), path)


def decode_utf8(data: bytes, path: str | os.PathLike) -> str:
    """The text of ``data``, the bytes of the file at ``path`` (a leading byte-order mark dropped); invalid UTF-8 is a
    ValueError naming the file, line and byte."""
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise ValueError(bad_utf8(path, data.count(b"\n", 0, exc.start) + 1, exc.start - line_start)) from None


_ESCAPED = re.compile("[\udc80-\udcff]+")  # the bytes ``surrogateescape`` could not decode, one a byte


def decode_replacing(data: bytes) -> tuple[str, dict | None]:
    """The text of ``data`` with U+FFFD for invalid UTF-8 (as ``decode("utf-8", "replace")``; a leading byte-order
    mark dropped), and what was replaced (``not_utf8``), for readers that count what they replaced rather than
    stop."""
    try:
        return data.decode("utf-8").removeprefix(BOM), None
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace").removeprefix(BOM), not_utf8(data)


def not_utf8(data: bytes) -> dict | None:
    """What of ``data`` is not UTF-8 (what ``decode("utf-8", "replace")`` reads as U+FFFD): None, or ``{"lines": lines
    holding bad bytes, "bytes": bad bytes, "line": the first such line (1-based), "byte": the first bad byte's place
    in it}``."""
    escaped = data.decode("utf-8", "surrogateescape")  # valid UTF-8 never decodes to a lone surrogate
    lines = n_bytes = 0
    first = None
    line, pos, last_line = 1, 0, 0
    for m in _ESCAPED.finditer(escaped):
        line += escaped.count("\n", pos, m.start())
        pos = m.start()
        n_bytes += m.end() - m.start()
        if line != last_line:
            lines, last_line = lines + 1, line
        if first is None:
            start = escaped.rfind("\n", 0, m.start()) + 1
            first = (line, len(escaped[start : m.start()].encode("utf-8", "surrogateescape")))
    return None if first is None else {"lines": lines, "bytes": n_bytes, "line": first[0], "byte": first[1]}


BAD_UTF8 = "invalid_utf8"  # the name of the counts of bytes that were not UTF-8 and were read as U+FFFD


def bad_utf8_note(
    stats, what: str = "input document(s)", then: str = "rerun with --restart to keep their characters"
) -> str | None:
    """The warning (and report note) for the bytes that were not UTF-8 and were read as U+FFFD, as ``stats`` counted
    them (a curate ``StageStats``, or a ``Utf8Replaced``: ``counters`` ``invalid_utf8_docs``, ``_lines`` and
    ``_bytes``, ``first_at["invalid_utf8"]``), or None: the first file:line, how many ``what`` held such bytes, how
    many bytes on how many lines, and how to keep their characters (``then``, after re-encoding)."""
    n = stats.counters.get(f"{BAD_UTF8}_docs", 0)
    if not n:
        return None
    lines, n_bytes = stats.counters[f"{BAD_UTF8}_lines"], stats.counters[f"{BAD_UTF8}_bytes"]
    return (
        f"{stats.first_at.get(BAD_UTF8)}: invalid UTF-8, read as U+FFFD ({n} {what} held such bytes: "
        f"{n_bytes} bytes on {lines} lines); re-encode those files as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) and "
        f"{then}"
    )


class Utf8Replaced:
    """What readers asked to (``--utf8-errors replace``) read as U+FFFD, counted by file: the files holding bytes
    that are not UTF-8, the lines holding them, the bytes, and where the first is. Parts of a file read apart (a
    tokenizer's byte ranges, in worker processes) add up with ``update``. ``counters`` and ``first_at`` name them as
    a curate ``StageStats`` does, for ``bad_utf8_note``."""

    def __init__(self, order: Iterable[str | os.PathLike] = ()):
        self._order = {os.fspath(p): i for i, p in enumerate(order)}  # the first file, where parts come unordered
        self.files: dict[str, list] = {}  # path -> [lines, bytes, (byte the text began at, its line of the first)]

    def add(self, path: str | os.PathLike, bad: dict | None, line: int = 1, at: int = 0) -> None:
        """Count ``not_utf8``'s ``bad`` of a text of the file ``path`` that began at its line ``line``, or (a byte
        range whose line is unknown) at its byte ``at``, where a line begins."""
        if not bad:
            return
        counts = self.files.setdefault(os.fspath(path), [0, 0, None])
        counts[0] += bad["lines"]
        counts[1] += bad["bytes"]
        first = (at, line + bad["line"] - 1)
        counts[2] = first if counts[2] is None else min(counts[2], first)

    def update(self, other: Utf8Replaced | None) -> None:
        for path, (lines, n_bytes, (at, line)) in (other.files if other is not None else {}).items():
            self.add(path, {"lines": lines, "bytes": n_bytes, "line": line}, at=at)

    @property
    def counters(self) -> dict[str, int]:
        lines, n_bytes = (sum(c[i] for c in self.files.values()) for i in (0, 1))
        return {f"{BAD_UTF8}_docs": len(self.files), f"{BAD_UTF8}_lines": lines, f"{BAD_UTF8}_bytes": n_bytes}

    @property
    def first_at(self) -> dict[str, str]:
        """``{"invalid_utf8": "file:line"}`` of the first bad byte (of the first file in order), or {}."""
        if not self.files:
            return {}
        names = list(self.files)
        path = min(names, key=lambda p: (self._order.get(p, len(self._order)), names.index(p)))
        at, line = self.files[path][2]
        return {BAD_UTF8: f"{path}:{line_at(path, at) + line - 1 if at else line}"}

    def as_meta(self) -> dict:
        """``{"files", "lines", "bytes"[, "first": file:line]}``, for a store's meta.json or a summary."""
        c = self.counters
        return {
            "files": c[f"{BAD_UTF8}_docs"],
            "lines": c[f"{BAD_UTF8}_lines"],
            "bytes": c[f"{BAD_UTF8}_bytes"],
            **({"first": self.first_at[BAD_UTF8]} if self.files else {}),
        }


def line_at(path: str | os.PathLike, offset: int) -> int:
    """The 1-based line of a plain file holding byte ``offset``."""
    line = 1
    with open(path, "rb") as f:
        done = 0
        while done < offset:
            block = f.read(min(1 << 20, offset - done))
            if not block:
                break
            line += block.count(b"\n")
            done += len(block)
    return line


def bad_utf8(path: str | os.PathLike, line: int, byte: int) -> str:
    """The one-line error for invalid UTF-8 at ``byte`` of ``line``."""
    return f"{os.fspath(path)}:{line}: invalid UTF-8 at byte {byte} of the line; fix or re-encode the file as UTF-8"


def first_bad_utf8(path: str | os.PathLike) -> str:
    """The error for a file a text reader could not decode: its first invalid line (for readers, such as csv, that
    need a text stream and learn of the bad byte only from a ``UnicodeDecodeError``)."""
    try:
        for _ in utf8_lines(path):
            pass
    except ValueError as exc:
        return str(exc)
    return f"{os.fspath(path)}: invalid UTF-8; fix or re-encode the file as UTF-8"
