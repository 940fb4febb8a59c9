"""Count pre-tokens of a corpus once, streaming, in parallel over chunks cut at safe places.

A plain text file is split at ``<|endoftext|>``, its document separator as ``pack`` reads it (so no merge crosses
one), then into pre-tokens by the pattern; any other special token spelled in it, and every special token spelled in
a record's text, is learned as the text it is, as ``pack`` encodes it (text never becomes a control token). Files are
cut into chunks of about `chunk_bytes` at safe newlines (see patterns.py),
each worker reads and counts its own chunk, and only the counts travel back, so memory is
bounded by the number of distinct pre-tokens, not by the corpus size.

Any other input (JSON lines, a JSON array, Parquet, anything gzip-compressed, a `cookmind curate run` output
folder) is read by the packer's reader (cookmind.store.sources), so `tokenizer train` learns from the same
documents `pack` packs: each record's text field, in batches of about `chunk_bytes` characters per worker.

Inside a chunk, text is cut further into lines at safe cuts and identical pieces are
pre-tokenized once and weighted by their count: web text repeats boilerplate lines, and the
result is exactly the same as pre-tokenizing every line.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import os
import re
import sys
import threading
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import regex

from cookmind.pools import ignore_ctrl_c, pool_context, stop_pool, worker_pool
from cookmind.text_input import ENDOFTEXT, Utf8Replaced, bad_utf8_note, line_at, not_utf8, refuse_other_compression
from cookmind.tokenizer.bytes_unicode import without_lone_surrogates
from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.patterns import GPT2_PATTERN, is_safe_end, safe_cut_kind, safe_end_bytes

if TYPE_CHECKING:
    from cookmind.store.records import SkippedRecords

_SURROGATE = regex.compile("[\ud800-\udfff]")
_WINDOW = 1 << 20
_MIN_CHUNK = 256 << 10  # bytes: the smallest chunk count_pretokens cuts to spread work
_SPACE = r"[\s\x1c-\x1f]"  # what str.strip takes off a document (regex's \s leaves out U+001C..U+001F)


def document_split(separator: str = ENDOFTEXT, one_per_line: bool = False) -> str | None:
    """The regex that cuts a plain text file into documents as ``pack`` does: at ``separator`` and the whitespace
    round it (pack strips each document), or with ``one_per_line`` at each line end; None: not at all (an empty
    separator: the file is one document)."""
    if one_per_line:
        return r"\r*\n"
    return f"{_SPACE}*{regex.escape(separator)}{_SPACE}*" if separator else None


@dataclass
class ReadCounts:
    """What training read, for its summary: the input files (a folder: its ``shard-*`` files); of the files holding
    records, the records with text (JSON lines, JSON and Parquet records, gzip text documents) and those whose text
    was empty (left out: nothing to learn); the plain text files (read whole, as byte ranges: no records) and their
    lines (a last one without its newline too); the bytes of text: a plain text file's bytes (special tokens
    included), each record's text in UTF-8; and, reading with ``utf8_errors="replace"``, the bytes that were not
    UTF-8 and were read as U+FFFD (``Utf8Replaced``). ``as_dict`` names the records only where some file holds them,
    the text files only where some were read: a plain text file said "records": 0."""

    files: int = 0
    record_files: int = 0
    records: int = 0
    empty_records: int = 0
    text_files: int = 0
    text_lines: int = 0
    text_bytes: int = 0
    invalid_utf8: Utf8Replaced | None = None
    lone_surrogates: int = 0  # JSON text's "\\ud800" escapes, no character: learned as U+FFFD, as encode reads them
    chat_records: int = 0  # records holding a chat, pair or problem (no text field): learned from their texts

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            **({"records": self.records, "empty_records": self.empty_records} if self.record_files else {}),
            **({"text_files": self.text_files, "text_lines": self.text_lines} if self.text_files else {}),
            "text_bytes": self.text_bytes,
            **({"invalid_utf8": self.invalid_utf8.as_meta()} if self.invalid_utf8 is not None else {}),
            **({"lone_surrogates": self.lone_surrogates} if self.lone_surrogates else {}),
            **({"chat_records": self.chat_records} if self.chat_records else {}),
        }


def special_split_regex(special_tokens: Iterable[str]) -> regex.Pattern | None:
    """A regex matching any special token; the longest wins where several start at one place."""
    specials = sorted(set(special_tokens), key=len, reverse=True)
    if not specials:
        return None
    return regex.compile("|".join(regex.escape(s) for s in specials))


def safe_pieces(doc: str, kind: str | None) -> list[str]:
    """Cut a special-free text before newlines that follow a safe character; the pieces concatenate to `doc`."""
    if kind is None or "\n" not in doc:
        return [doc]
    lines = doc.split("\n")
    out: list[str] = []
    cur = [lines[0]]
    prev = lines[0]
    for line in lines[1:]:
        if prev and is_safe_end(prev[-1], kind):
            out.append("\n".join(cur))
            cur = ["", line]  # the next piece starts with the newline
        else:
            cur.append(line)
        prev = line
    out.append("\n".join(cur))
    return out


# The same pre-tokens as a pattern on ASCII text, in the standard library's re, which runs these about twice as
# fast as regex: \p{L} and \p{N} are [A-Za-z] and [0-9] there, and regex's \s is the class below (re's \s would
# also take U+001C..U+001F, which regex does not). A test checks them on every ASCII character and random text.
_WS = r"\t\n\x0b\x0c\r "
ASCII_PATTERNS = {
    GPT2_PATTERN: rf"""'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+""",
}


def ascii_findall(pattern_str: str):
    """The findall of a pattern that splits ASCII text as `pattern_str` does (ASCII_PATTERNS), or None."""
    fast = ASCII_PATTERNS.get(pattern_str)
    return re.compile(fast).findall if fast is not None else None


def count_text(
    text: str, pattern: regex.Pattern, separator_re: regex.Pattern | None, kind: str | None, counts: Counter
) -> None:
    """Add the pre-token counts of `text`, split into documents at `separator_re` where given, to `counts`
    (identical safe pieces are split once; a document of whitespace alone is empty, as pack leaves it out)."""
    docs = separator_re.split(text) if separator_re is not None else [text]
    pieces: Counter = Counter()
    for doc in docs:
        if doc and not doc.isspace():
            pieces.update(safe_pieces(doc, kind))
    singles: list[str] = []  # pre-tokens of pieces seen once, counted in C in batches
    findall = pattern.findall
    fast = ascii_findall(pattern.pattern)
    if fast is not None:
        findall = fast if text.isascii() else (lambda s, full=findall: fast(s) if s.isascii() else full(s))
    for piece, n in pieces.items():
        if n == 1:
            singles.extend(findall(piece))
            if len(singles) > 65536:
                counts.update(singles)
                singles.clear()
        else:
            for tok in findall(piece):
                counts[tok] += n
    counts.update(singles)


def first_bad_utf8(path: str) -> tuple[int, int] | None:
    """(byte offset, 1-based line) of the first byte that is not valid UTF-8 in a file, or None."""
    dec = codecs.getincrementaldecoder("utf-8")()
    done, line = 0, 1
    with open(path, "rb") as f:
        while block := f.read(_WINDOW):
            try:
                dec.decode(block)
            except UnicodeDecodeError as exc:
                # exc.start counts from the undecoded tail the decoder kept (at most 3 bytes) plus this block
                pending = len(exc.object) - len(block)
                offset = done - pending + exc.start
                return offset, line + block[: max(0, exc.start - pending)].count(b"\n")
            done += len(block)
            line += block.count(b"\n")
    pending = len(dec.getstate()[0])  # a sequence cut off by the end of the file
    return (done - pending, line) if pending else None


def decode_chunk(data: bytes, path: str, start: int, utf8_errors: str) -> str:
    """Decode UTF-8; on bad bytes under the strict policy, raise naming file:line and the byte offset."""
    try:
        return data.decode("utf-8", errors=utf8_errors)
    except UnicodeDecodeError as exc:
        offset = start + exc.start
        raise TokenizerError(
            f"{path}:{line_at(path, offset)}: byte offset {offset} (0x{data[exc.start]:02x}) is not valid UTF-8. "
            "Tokenizer input must be UTF-8 text: convert it (e.g. `iconv -f latin1 -t utf-8`) or pass "
            "--utf8-errors replace (utf8_errors='replace') to read bad bytes as U+FFFD."
        ) from None


def _count_chunk(task: tuple, counts: Counter | None = None) -> tuple[Counter, int, Utf8Replaced | None, int]:
    """Count one byte range of a text file into `counts` (a new Counter where None); returns it, the bytes read,
    what of them was read as U+FFFD (None where nothing) and the lines it ends (the file's last, without its newline,
    too)."""
    path, start, end, pattern_str, split, strip, utf8_errors = task
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    bom = codecs.BOM_UTF8  # a leading byte-order mark is no text, as pack reads it
    mark = len(bom) if start == 0 and data.startswith(bom) else 0
    text = decode_chunk(data[mark:], path, start + mark, utf8_errors)
    replaced = None
    if utf8_errors == "replace" and "\ufffd" in text:  # read as U+FFFD, or a U+FFFD the text holds
        replaced = Utf8Replaced()
        replaced.add(path, not_utf8(data[mark:]), at=start)  # a range begins a line; which, found for the first only
    counts = Counter() if counts is None else counts
    split_re = regex.compile(split) if split is not None else None
    if strip:  # pack strips each document: the file's first and last too
        text = text.lstrip() if start == 0 else text
        text = text.rstrip() if end >= os.path.getsize(path) else text
    count_text(text, regex.compile(pattern_str), split_re, safe_cut_kind(pattern_str), counts)
    last_line = bool(data) and not data.endswith(b"\n") and end >= os.path.getsize(path)
    return counts, end - start, replaced, data.count(b"\n") + last_line


def _count_alongside(
    workers: int, tasks: Sequence[tuple], counts: Counter
) -> Iterator[tuple[Counter | None, int, Utf8Replaced | None, int]]:
    """Count file chunks in ``workers`` pool processes and in this process at once: the workers take tasks from
    the front, two each handed out at a time (so none waits for this process to hand it the next), this process
    takes them from the back and counts into ``counts`` itself. The pool starts in a thread (a forkserver takes
    ~0.15 s to answer), so this process counts from the first moment, and its counts need no pickling. Yields
    (a worker's Counter, or None where counted into ``counts``; the bytes read; what was read as U+FFFD; the lines)."""
    started: dict = {}

    def start() -> None:
        try:
            started["pool"] = pool_context().Pool(workers, initializer=ignore_ctrl_c)
        except BaseException as exc:  # raised again below, in this thread
            started["error"] = exc

    starter = threading.Thread(target=start, name="count-pool-start", daemon=True)
    starter.start()
    queue = deque(tasks)
    out: list = []
    pool = None
    try:
        while queue or out:
            if pool is None and not starter.is_alive():
                if "error" in started:
                    raise started["error"]
                pool = started["pool"]
            while pool is not None and queue and len(out) < 2 * workers:
                out.append(pool.apply_async(_count_chunk, (queue.popleft(),)))
            done = [r for r in out if r.ready()]
            for r in done:
                out.remove(r)
                yield r.get()
            if queue:
                yield None, *_count_chunk(queue.pop(), counts)[1:]
            elif out and not done:
                out[0].wait()
    finally:
        starter.join()
        if "pool" in started:
            stop_pool(started["pool"])


def _next_cut(f, pos: int, size: int, specials: Sequence[bytes], safe: frozenset[int]) -> int | None:
    """First safe byte position >= pos: before a newline that follows a safe ASCII byte, spanned by none of
    ``specials`` (the separators)."""
    if not safe:
        return None
    margin = max((len(s) for s in specials), default=1)
    while pos < size:
        base = max(0, pos - margin)
        f.seek(base)
        want = pos - base + _WINDOW + margin
        buf = f.read(want)
        i = buf.find(b"\n", pos - base)
        while i != -1 and base + i < size:
            cut = i
            if cut >= 2 and buf[cut - 1] == 0x0D:  # cut before "\r\n"
                cut -= 1
            if (
                cut >= 1
                and buf[cut - 1] in safe
                and not any(buf.find(s, max(0, cut - len(s) + 1), cut + len(s) - 1) != -1 for s in specials)
            ):
                return base + cut
            i = buf.find(b"\n", i + 1)
        if len(buf) < want:
            return None  # reached the end of the file without a safe cut
        pos = base + len(buf) - margin  # overlap by `margin` so a special token across windows is seen whole
    return None


def chunk_file(path: str, chunk_bytes: int, specials: Sequence[str], pattern: str) -> list[tuple[int, int]]:
    """Cut a file into (start, end) byte ranges of about chunk_bytes, each ending at a safe cut (inside none of
    ``specials``)."""
    size = os.path.getsize(path)
    if size == 0:
        return []
    safe = safe_end_bytes(safe_cut_kind(pattern))
    sp = [s.encode("utf-8") for s in specials]
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] + chunk_bytes < size:
            cut = _next_cut(f, bounds[-1] + chunk_bytes, size, sp, safe)
            if cut is None or cut <= bounds[-1]:
                break
            bounds.append(cut)
    bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:]))


def check_inputs(paths: Sequence[str | os.PathLike]) -> list[str]:
    """Resolve input paths (a folder: its ``shard-*`` files, as pack reads it), failing clearly on a missing or
    unreadable one."""
    from cookmind.store.sources import expand_inputs

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    try:
        paths = expand_inputs(paths)
    except (FileNotFoundError, ValueError) as exc:  # a folder without shards, a file named twice
        raise TokenizerError(str(exc)) from None
    for path in paths:
        if not path.exists():
            raise TokenizerError(f"input file {path} does not exist; pass existing text files with --input")
        if not path.is_file():
            raise TokenizerError(f"input {path} is not a regular file; pass text, JSON lines, Parquet or gzip files")
        if not os.access(path, os.R_OK):
            raise TokenizerError(f"input file {path} is not readable (permissions)")
        out.append(str(path))
    if not out:
        raise TokenizerError("no input files given; pass at least one text file")
    return out


def is_plain_text(path: str | os.PathLike) -> bool:
    """An uncompressed text file (not JSON lines/Parquet): the workers read it in byte ranges."""
    from cookmind.store.sources import is_gzip, source_kind

    return source_kind(Path(path)) == "text" and not is_gzip(Path(path))


def document_texts(
    path: str | os.PathLike,
    text_field: str = "text",
    utf8_errors: str = "strict",
    skipped: SkippedRecords | None = None,
    read: ReadCounts | None = None,
    separator: str = ENDOFTEXT,
    one_per_line: bool = False,
) -> Iterator[str]:
    """The documents of a JSON-lines, JSON, Parquet or gzip file as ``pack --train-type seq`` reads them (each
    record's ``text_field``; gzip text split at ``separator``, or its lines with ``one_per_line``); an empty document
    is skipped (nothing to learn). A record without ``text_field`` that holds a chat, a preference pair or an RL
    problem (what ``pack --train-type sft/dpo/grpo`` reads) gives each of its texts as a document (``chat_texts``),
    counted in ``read.chat_records``.
    A bad record (invalid JSON, a missing or non-text field, bad UTF-8 under ``utf8_errors="strict"``) is an
    error naming file:line, or, with ``skipped`` given, counted there and left out (``--skip-bad``). ``read``, where
    given, counts the records yielded and the empty ones left out."""
    from cookmind.store.records import (
        BadRecord,
        EmptyDocument,
        RecordOptions,
        chat_texts,
        make_seq,
        parse,
        reason_kind,
        train_type_of,
    )
    from cookmind.store.sources import iter_items

    opts = RecordOptions("seq", text_field)
    replaced = read.invalid_utf8 if read is not None else None
    try:
        for item in iter_items(path, separator, one_per_line, utf8_errors=utf8_errors, replaced=replaced):
            try:
                obj = parse(item)
                chat = isinstance(obj, dict) and text_field not in obj and train_type_of(obj) in ("sft", "dpo", "grpo")
                texts = chat_texts(obj) if chat else [make_seq(obj, None, opts)]
                if not texts:
                    raise EmptyDocument("a chat with no text")
            except EmptyDocument:
                if read is not None:
                    read.empty_records += 1
                continue
            except BadRecord as exc:
                kind = reason_kind(str(exc))
                where = f"{item.where}: {exc}"
                if skipped is not None:
                    skipped.add(kind, where)
                    continue
                hint = (
                    "; convert it to UTF-8, pass --utf8-errors replace, or --skip-bad to skip bad records"
                    if kind == "invalid UTF-8"
                    else "; fix the record, or pass --skip-bad to skip bad records and count them"
                )
                raise TokenizerError(where + hint) from None
            if read is not None:
                read.records += 1
                read.chat_records += chat
            for text in texts:
                if _SURROGATE.search(text):  # JSON text may spell one; no UTF-8 holds it: U+FFFD, as encode reads it
                    fixed = without_lone_surrogates(text)
                    if read is not None:
                        read.lone_surrogates += fixed.count("\ufffd") - text.count("\ufffd")
                    text = fixed
                yield text
    except TokenizerError:
        raise
    except ValueError as exc:  # the reader's own one-line errors (bad UTF-8 in gzip text, a broken JSON array)
        raise TokenizerError(str(exc)) from None


def _text_batches(
    files: Sequence[str],
    text_field: str,
    utf8_errors: str,
    batch_chars: int,
    skipped: SkippedRecords | None = None,
    read: ReadCounts | None = None,
    separator: str = ENDOFTEXT,
    one_per_line: bool = False,
) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for path in files:
        for text in document_texts(path, text_field, utf8_errors, skipped, read, separator, one_per_line):
            batch.append(text)
            size += len(text)
            if size >= batch_chars:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _count_texts(task: tuple) -> tuple[Counter, int, None, int]:
    """Count a batch of records' texts, each a document whole (what they read as U+FFFD was counted as they were
    read: None; lines are counted of plain text files only: 0)."""
    texts, pattern_str = task
    pattern, kind = regex.compile(pattern_str), safe_cut_kind(pattern_str)
    counts: Counter = Counter()
    for text in texts:
        count_text(text, pattern, None, kind, counts)
    return counts, sum(len(t.encode("utf-8")) for t in texts), None, 0


def count_pretokens(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    pattern: str,
    *,
    workers: int | None = None,
    chunk_bytes: int = 4 << 20,
    utf8_errors: str = "strict",
    progress: bool | None = None,
    text_field: str = "text",
    skipped: SkippedRecords | None = None,
    read: ReadCounts | None = None,
    separator: str = ENDOFTEXT,
    one_per_line: bool = False,
) -> Counter:
    """Pre-token (str) -> count over all inputs: a plain text file split into documents first, as ``pack`` splits it
    (at ``separator``, default ``<|endoftext|>``, or at each line end with ``one_per_line``), a record's text whole;
    a special token spelled in the text is that text, as ``pack`` encodes it.

    Inputs: text files, JSON lines / JSON / Parquet (the ``text_field`` of each record), any of them gzipped,
    and folders of ``shard-*`` files (``cookmind curate run``'s output), read as ``pack`` reads them.
    workers: processes to use (default: all CPUs); chunk_bytes: work unit per process.
    utf8_errors: "strict" (default: bad bytes are an error naming file:line) or "replace" (U+FFFD: counted in
    ``read.invalid_utf8`` and warned of, the first by file:line).
    skipped: where given, bad records are counted there and left out instead of raising (``document_texts``).
    read: where given, filled with the files, records and bytes of text read (``ReadCounts``).
    """
    from cookmind.progress import is_terminal, progress_bar

    if utf8_errors not in ("strict", "replace"):
        raise TokenizerError(f"utf8_errors must be 'strict' or 'replace', got {utf8_errors!r}")
    files = check_inputs(paths)
    read = read if read is not None else ReadCounts()
    read.files = len(files)
    if utf8_errors == "replace":
        read.invalid_utf8 = Utf8Replaced(files)
    plain = [p for p in files if is_plain_text(p)]
    for p in plain:  # read in byte ranges, not through text_input.open_bytes, which refuses these
        try:
            refuse_other_compression(p)
        except ValueError as exc:
            raise TokenizerError(str(exc)) from None
    records = [p for p in files if p not in plain]
    read.text_files, read.record_files = len(plain), len(records)
    want = workers or os.cpu_count() or 1
    piece = chunk_bytes
    if want > 1:  # about 8 chunks per process, so that they end together (chunk_bytes stays the largest)
        piece = min(chunk_bytes, max(_MIN_CHUNK, -(-sum(os.path.getsize(p) for p in plain) // (8 * want))))
    split = document_split(separator, one_per_line)
    within = [separator] if separator and not one_per_line else []  # no chunk ends inside a separator
    tasks = [
        (p, s, e, pattern, split, not one_per_line, utf8_errors)
        for p in plain
        for s, e in chunk_file(p, piece, within, pattern)
    ]
    batches = _text_batches(records, text_field, utf8_errors, chunk_bytes, skipped, read, separator, one_per_line)
    record_tasks = ((batch, pattern) for batch in batches)
    # the record batches are not known ahead: about one per chunk_bytes on disk (more where compressed)
    expected = len(tasks) + -(-sum(os.path.getsize(p) for p in records) // chunk_bytes)
    workers = max(1, min(want, expected or 1))
    counts: Counter = Counter()
    with (
        contextlib.ExitStack() as stack,
        progress_bar(
            total=None if records else sum(e - s for _, s, e, *_ in tasks),
            unit="B",
            unit_scale=True,
            desc="pre-tokenize",
            enabled=is_terminal(sys.stderr) if progress is None else progress,  # None: a terminal only; True: a pipe
            leave=not is_terminal(sys.stderr),  # goes when done on a terminal; a log keeps its first and last lines
        ) as bar,
    ):
        if workers == 1:
            results: Iterable = itertools.chain(map(_count_chunk, tasks), map(_count_texts, record_tasks))
        elif not records:  # text files only: this process counts too, beside workers - 1 worker processes
            # closed on leaving, an error or a Ctrl-C in this loop's body included: its pool stops then, not when
            # the traceback is freed (with COOKMIND_DEBUG=1, at exit, where stopping it hung)
            results = stack.enter_context(contextlib.closing(_count_alongside(workers - 1, tasks, counts)))
        else:
            pool = stack.enter_context(worker_pool(workers))
            results = itertools.chain(
                pool.imap_unordered(_count_chunk, tasks), _in_waves(pool, _count_texts, record_tasks, 2 * workers)
            )
        for part, n, replaced, lines in results:
            read.text_lines += lines
            if part is not None:
                counts.update(part)
            if replaced is not None:
                read.invalid_utf8.update(replaced)
            read.text_bytes += n
            bar.update(n)
    if read.invalid_utf8 is not None and (note := bad_utf8_note(read.invalid_utf8, "input file(s)", RETRAIN)):
        warnings.warn(f"tokenizer: {note}", stacklevel=2)
    return counts


RETRAIN = "train again to learn their characters"  # what to do once bad bytes were re-encoded


def _in_waves(pool, fn, tasks: Iterator, size: int) -> Iterator:
    """pool.imap_unordered over a lazy iterator, ``size`` tasks at a time: Pool would read it all into memory."""
    while wave := list(itertools.islice(tasks, size)):
        yield from pool.imap_unordered(fn, wave)
