"""Read packing inputs as ``Item``s that remember where they came from (file and line).

- plain text (any suffix but .jsonl/.json/.parquet): documents split by a separator such as
  ``<|endoftext|>`` (a file without one is one document), or one document per line;
- JSON lines (``.jsonl``/``.json``): one JSON object per line, parsed later by the workers so
  that parse errors are reported as ``file:line``; a ``.json`` file holding one JSON array (how many
  datasets are shared) gives one item per element, numbered from 1 (errors say ``file: record N``);
- Parquet: one row per item, numbered from 1 (errors say ``file: row N``);
- any of the above gzip-compressed (``.gz``, or gzip's magic bytes), e.g. ``cookmind curate``'s
  default output ``shard-00000.jsonl.gz``; a curate output folder stands for its ``shard-*`` files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cookmind import json_input, text_input

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
GZIP_MAGIC = text_input.GZIP_MAGIC


@dataclass
class Item:
    """One input record: ``kind`` is "text" (payload str), "json" (payload: the raw line), "row" (a dict)
    or "bad" (payload: why the line could not even be read, e.g. invalid UTF-8)."""

    source: str
    line: int
    kind: str
    payload: object
    unit: str = "line"  # what ``line`` counts: "record" of a JSON array, "row" of a Parquet file

    @property
    def where(self) -> str:
        """``file:line``, or ``file: record N`` / ``file: row N`` where the number is no line to open the file at."""
        return f"{self.source}:{self.line}" if self.unit == "line" else f"{self.source}: {self.unit} {self.line}"


is_gzip = text_input.is_gzip
_open_bytes = text_input.open_bytes


# a UTF-8 byte-order mark opening a file (Notepad's and Excel's "UTF-8") is a signature, not text: readers drop it
BOM = text_input.BOM


def source_kind(path: Path) -> str:
    """ "json", "parquet" or "text" by the file name, a ``.gz`` suffix looked through."""
    path = Path(path)
    suffix = Path(path.stem).suffix.lower() if path.suffix.lower() == ".gz" else path.suffix.lower()
    if suffix in JSON_SUFFIXES:
        return "json"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return "text"


def iter_items(
    path,
    separator: str = "<|endoftext|>",
    one_per_line: bool = False,
    utf8_errors: str = "strict",
    replaced: text_input.Utf8Replaced | None = None,
) -> Iterator[Item]:
    """Yield the items of one input file in order. utf8_errors="replace" reads bad UTF-8 of text, JSON lines and
    JSON arrays as U+FFFD, counted in ``replaced`` where given; "strict" makes such a line a "bad" item (a text file
    or a JSON array: a ValueError naming file:line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input {path} does not exist")
    kind = source_kind(path)
    if kind == "parquet":
        yield from _parquet_rows(path)
    elif kind == "json" and json_input.opens_array(path):
        yield from _json_array_items(path, utf8_errors, replaced)
    elif kind == "json" or one_per_line:
        with _open_bytes(path) as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8", utf8_errors)
                except UnicodeDecodeError as exc:
                    yield Item(str(path), n, "bad", f"invalid UTF-8 at byte {exc.start} of the line")
                    continue
                if replaced is not None and "\ufffd" in line:  # read as U+FFFD, or a U+FFFD the line holds
                    replaced.add(path, text_input.not_utf8(raw), n)
                if n == 1:
                    line = line.removeprefix(BOM)
                if line.strip():
                    yield Item(str(path), n, kind, line if kind == "json" else line.rstrip("\r\n"))
                elif kind != "json" and line.endswith("\n"):  # a blank line is an empty document: counted
                    yield Item(str(path), n, kind, "")
    else:
        yield from _separated_documents(path, separator, utf8_errors, replaced)


def _whole_text(path: Path, utf8_errors: str, replaced: text_input.Utf8Replaced | None = None) -> str:
    """A whole file's text (decompressed, a leading BOM dropped); strict bad UTF-8 is a ValueError naming file:line,
    replaced bad UTF-8 U+FFFD, counted in ``replaced`` where given."""
    with _open_bytes(path) as f:
        data = f.read()
    if utf8_errors == "strict":
        return text_input.decode_utf8(data, path)
    text, bad = text_input.decode_replacing(data)
    if replaced is not None:
        replaced.add(path, bad)
    return text


def _separated_documents(
    path: Path, separator: str, utf8_errors: str = "strict", replaced: text_input.Utf8Replaced | None = None
) -> Iterator[Item]:
    """The documents between separators, whitespace around each left out. A blank one between two separators is
    yielded (as "") for the reader to count as an empty document; blank text before the first separator or after
    the last (a file that ends with one) is no document."""
    text = _whole_text(path, utf8_errors, replaced)
    for line, doc in text_input.separated_documents(text, separator):
        yield Item(str(path), line, "text", doc)


def _json_array_items(
    path: Path, utf8_errors: str = "strict", replaced: text_input.Utf8Replaced | None = None
) -> Iterator[Item]:
    """The elements of a file holding one JSON array; utf8_errors="replace" reads its bad UTF-8 as U+FFFD (counted in
    ``replaced`` where given)."""

    rows = json_input.array_elements(_whole_text(path, utf8_errors, replaced), path)
    for n, row in enumerate(rows, 1):
        yield Item(str(path), n, "row", row, "record")


def _parquet_rows(path: Path) -> Iterator[Item]:
    for n, row in enumerate(text_input.parquet_rows(path), 1):
        yield Item(str(path), n, "row", row, "row")


def count_items(path, separator: str = "<|endoftext|>", one_per_line: bool = False, utf8_errors: str = "strict") -> int:
    """How many items ``iter_items`` yields, exactly: a pass over the file (a Parquet file's footer says it)."""
    path = Path(path)
    if source_kind(path) == "parquet":
        return text_input.parquet_num_rows(path)
    return sum(1 for _ in iter_items(path, separator, one_per_line, utf8_errors))


def estimate_items(path, separator: str = "<|endoftext|>", one_per_line: bool = False) -> int:
    """About how many items ``iter_items`` will yield (for the progress bar's ETA)."""
    path = Path(path)
    kind = source_kind(path)
    if kind == "parquet":
        return text_input.parquet_num_rows(path)
    if kind == "json" and json_input.opens_array(path):
        return 0  # unknown until parsed; the bar counts up without an ETA
    count, last_open = 0, False  # last_open: text follows the last needle, an item it does not end
    needle = b"\n" if kind == "json" or one_per_line or not separator else separator.encode("utf-8")
    with _open_bytes(path) as f:
        tail = b""
        while data := f.read(1 << 22):
            block = tail + data
            count += block.count(needle)
            end = block.rfind(needle)
            if end >= 0:
                last_open = bool(block[end + len(needle) :].strip())
            else:  # the tail was seen in the block before
                last_open = last_open or bool(data.strip())
            tail = block[-(len(needle) - 1) :] if len(needle) > 1 else b""
    return count + last_open  # a file ending with its needle (a final newline) has no empty item after it


def check_text_field_applies(paths) -> None:
    """A --text-field given for inputs none of which holds records (JSON lines / JSON / Parquet) is a ValueError: it
    was read as if it were not there."""
    if not any(source_kind(p) in ("json", "parquet") for p in paths):
        raise ValueError(
            "--text-field names a field of JSON or Parquet records, and no input is JSON or Parquet (a plain text "
            "file's documents are its text): drop it"
        )


def expand_inputs(inputs) -> list[Path]:
    """Input paths with each folder replaced by its ``shard-*`` files (``cookmind curate run``'s output), sorted.
    A file named twice (directly, by another spelling of its path, or through its folder) is a ValueError: its
    records would be read twice."""
    out: list[Path] = []
    seen: dict[Path, str] = {}  # resolved path -> how the user named it
    for raw in inputs:
        path = Path(raw)
        if not path.is_dir():
            files = [(path, str(path))]
        else:
            text_input.refuse_unfinished_curate_output(path)  # some shards of a stopped run (or none): not the corpus
            shards = sorted(p for p in path.glob("shard-*") if p.is_file() and not p.name.endswith(".done"))
            if not shards and text_input.is_token_store(path):
                raise FileNotFoundError(text_input.token_store_as_input(path))
            if not shards:
                raise FileNotFoundError(
                    f"input folder {path} holds no shard-* files (the output of `cookmind curate run`); "
                    + _files_instead(path)
                )
            files = [(p, f"{p} (in the folder {path})") for p in shards]
        for p, named in files:
            text_input.refuse_a_second_naming(seen, p, named, "records")
            out.append(p)
    return out


def _files_instead(folder: Path) -> str:
    """What to pass instead of ``folder``, a folder that is no curate output: a synthetic crawl's pages are HTML, to
    curate first; otherwise a glob for each suffix of the files in it (not hidden, nor cookmind's own side files such
    as a crawl's manifest.json: ``folder/*`` took those in), or its files by name where they have no suffix."""
    if text_input.is_synthetic_crawl(folder):
        return (
            "it holds a `cookmind curate crawl`, whose pages are HTML, not text: curate it first, "
            f"`cookmind curate run --input {folder} --output CLEAN`, then pass CLEAN"
        )
    files = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and not text_input.written_by_cookmind(p)
    )
    if not files:
        return "it holds no other file either: name the input files instead"
    globs = {}  # in the order of the files: a glob a suffix (".jsonl.gz" apart from ".txt.gz"), a name where none
    for p in files:
        suffix = "".join(p.suffixes[-2:]) if p.suffix.lower() == ".gz" else p.suffix
        globs.setdefault(f"{folder}/*{suffix}" if suffix else str(p), None)
    return "name the input files instead, e.g. " + " ".join(globs)
