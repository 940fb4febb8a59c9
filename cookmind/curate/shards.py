"""Reading inputs (HTML files and folders, WARC/WET, JSONL(.gz), Parquet) and writing shards.

A document is a dict with "id" and either "text" or "html" (decoded with the detected encoding);
other fields ride along untouched. Shards are written to a temporary name and renamed.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from cookmind import json_input, text_input
from cookmind.atomic import temp_path

HTML_SUFFIXES = (".html", ".htm", ".xhtml")  # each gzipped too (.html.gz), as pack reads any input
WARC_SUFFIXES = (".warc", ".warc.gz", ".wet", ".wet.gz", ".arc", ".arc.gz")
# as pack reads them (cookmind.store.sources): a .json file holds JSON lines or one JSON array of records
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
HTML_FILES_PER_SHARD = 256
SIDE_FILE_SUFFIXES = (".json", ".md", ".done", ".npz", ".npy", ".yaml", ".yml")
NAMED_ALONE = "a .json file as JSON records, any other as text"  # what a file named on its own gives
# plain text in a folder (gzipped too); a file named on its own that is no other kind is text
TEXT_SUFFIXES = (".txt", ".text")
SOURCE_KEY = "_cookmind_source"  # where an input document came from, carried between curate's passes when listed


def is_separator_line(line: str) -> bool:
    """Whether ``line`` (or a piece of one, ``line_pieces``) is an ``<|endoftext|>`` separator (whitespace round it
    aside): in a plain text file it marks where a document ends, as pack reads it. In a record's text (JSONL,
    Parquet, WARC) it is text like any other: pack encodes it as the characters it is, and so the checks read it."""
    return line.strip() == text_input.ENDOFTEXT


def is_text_line(line: str) -> bool:
    """Whether ``line`` (or a piece of one) of a plain text holds text: not blank, not a separator."""
    return bool(line.strip()) and not is_separator_line(line)


# a separator with the whitespace round it: pack and curate run's reader cut a plain text there wherever it stands
_SEPARATOR = re.compile(r"(\s*" + re.escape(text_input.ENDOFTEXT) + r"\s*)")


def line_pieces(line: str) -> list[str]:
    """``line`` of a plain text cut at each ``<|endoftext|>`` in it: its text pieces and its separators (each with
    the whitespace round it), which join back to ``line``. "friends.<|endoftext|>" is the text "friends." and a
    separator: read as one line, line dedup removed the separator with a duplicated last line."""
    return [piece for piece in _SEPARATOR.split(line) if piece] or [line]


def edge_pieces(line: str) -> list[str]:
    """``line`` of a plain text with the separators at its start and end split off (``line_pieces`` keeps only
    those): what line dedup hashes and removes. A separator mid-sentence leaves the line one piece, so two lines that
    merely mention the token do not share their tails."""
    pieces = line_pieces(line)
    start = 0
    while start < len(pieces) and is_separator_line(pieces[start]):
        start += 1
    end = len(pieces)
    while end > start and is_separator_line(pieces[end - 1]):
        end -= 1
    middle = ["".join(pieces[start:end])] if end > start else []
    return pieces[:start] + middle + pieces[end:]


def text_lines(text: str, separated: bool) -> list[str]:
    """``text``'s text lines, blank ones left out: the lines a per-line check judges. ``separated``: ``text`` is a
    plain text file's, whose ``<|endoftext|>`` separators are no lines and end one wherever they stand
    (``line_pieces``); a record's text is not, and a line holding the token is a line of text."""
    if not separated:
        return [line for line in text.splitlines() if line.strip()]
    return [piece for line in text.splitlines() for piece in line_pieces(line) if is_text_line(piece)]


def kind_of(path: Path) -> str:
    """ "html" | "warc" | "jsonl" | "parquet" | "text" by file name."""
    name = path.name.lower()
    for kind, suffixes in (
        ("warc", WARC_SUFFIXES),
        ("jsonl", JSONL_SUFFIXES),
        ("parquet", PARQUET_SUFFIXES),
        ("html", HTML_SUFFIXES + tuple(s + ".gz" for s in HTML_SUFFIXES)),
    ):
        if name.endswith(suffixes):
            return kind
    return "text"


CURATE_LEFTOVERS = "in a curate output's _work/ or removed/"  # the warning's count of them


def _in_curate_leftovers(p: Path, root: Path) -> bool:
    """Whether ``p`` (found under the input folder ``root``) lies in a curate run's ``_work/`` (its passes'
    intermediate shards) or ``removed/`` (the documents it dropped): folders beside a ``_work/run.json``."""
    for folder in p.parents:
        if folder == root or root not in folder.parents:
            return False
        if folder.name in ("_work", "removed") and (folder.parent / "_work" / "run.json").is_file():
            return True
    return False


def left_out_note(left_out: dict[str, int]) -> str:
    """What a folder's files that are not documents (``left_out``: their count by suffix) mean, for the warning and
    the report."""
    counts = ", ".join(f"{n} {suffix}" for suffix, n in sorted(left_out.items(), key=lambda kv: (-kv[1], kv[0])))
    return (
        f"{sum(left_out.values())} files in the input folders are not documents and are left out ({counts}); a "
        f"folder gives its HTML, WARC, JSONL, Parquet and {'/'.join(TEXT_SUFFIXES)} files (name a file on its own to "
        f"read it: {NAMED_ALONE})"
    )


def plan_input_shards(inputs: Iterable[str | os.PathLike], left_out: dict[str, int] | None = None) -> list[list[str]]:
    """Group input paths into shards: each WARC/JSONL/Parquet file is one; HTML/text files go 256 to a shard.
    A file named twice (directly, by another spelling of its path, or through its folder) is a ValueError: it would
    be curated twice, every count doubled and its second copy removed as a duplicate (as pack refuses it).
    ``left_out`` (a dict) receives the count by suffix of the folders' files that are not documents (warned)."""
    shards: list[list[str]] = []
    loose: list[str] = []
    skipped: dict[str, int] = {} if left_out is None else left_out
    seen: dict[Path, str] = {}  # resolved path -> how the user named it
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            # a folder's side files (manifests, reports, markers) are not documents, nor its fonts, images, styles
            # and scripts (a saved site or a docs build): only documents it can read are taken, the rest counted
            files = []
            for p in sorted(path.rglob("*")):
                if not p.is_file() or p.name.startswith(".") or text_input.written_by_cookmind(p):
                    continue
                if _in_curate_leftovers(p, path):  # an earlier run's output gives its shards, not its passes
                    if not p.name.lower().endswith(
                        SIDE_FILE_SUFFIXES
                    ):  # its passes' shards are counted; their markers not
                        skipped[CURATE_LEFTOVERS] = skipped.get(CURATE_LEFTOVERS, 0) + 1
                    continue
                # side files (.md, .json, .yaml, ...) are no documents either, and are counted as the rest: a folder
                # of Markdown pages was "no input files found", and beside pages they were left out without a word
                if p.name.lower().endswith(SIDE_FILE_SUFFIXES) or (
                    kind_of(p) == "text" and not p.name.lower().removesuffix(".gz").endswith(TEXT_SUFFIXES)
                ):
                    suffix = p.suffix.lower() or "(no suffix)"
                    skipped[suffix] = skipped.get(suffix, 0) + 1
                    continue
                files.append(p)
            # an earlier run's output, or one in a subfolder, is read only once that run has written every shard
            for folder in sorted({path, *(f.parent for f in files)}):
                text_input.refuse_unfinished_curate_output(folder)
        elif path.is_file():
            files = [path]
        elif refusal := text_input.pipe_refusal(path, "curate names each document by its file and may read it twice"):
            raise ValueError(refusal)
        else:
            raise FileNotFoundError(
                f"input {path} does not exist (give files or folders of HTML, WARC, JSONL, Parquet)"
            )
        for f in files:
            named = str(f) if f is path else f"{f} (in the folder {path})"
            text_input.refuse_a_second_naming(seen, f, named, "documents")
            if kind_of(f) in ("html", "text"):
                loose.append(str(f))
            else:
                shards.append([str(f)])
    for i in range(0, len(loose), HTML_FILES_PER_SHARD):
        shards.append(loose[i : i + HTML_FILES_PER_SHARD])
    if skipped:
        warnings.warn(f"curate: {left_out_note(skipped)}", stacklevel=2)
    if not shards and (stores := [Path(i) for i in inputs if text_input.is_token_store(Path(i))]):
        raise ValueError(text_input.token_store_as_input(stores[0]))
    if not shards:
        raise ValueError(
            f"no documents to read in {list(map(str, inputs))}: a folder gives its HTML, WARC, JSONL, Parquet and "
            f"{'/'.join(TEXT_SUFFIXES)} files; name a file on its own to read it: {NAMED_ALONE}"
        )
    return shards


def iter_source(path: str) -> Iterator[dict]:
    """Documents of one input file."""
    for doc, _ in iter_located(path):
        yield doc


# the version of how an input file becomes documents, recorded by a run: a run resumed under another would mix two
# readings in one output. 2: a .txt (and .txt.gz) holding <|endoftext|> is the documents between those, not one;
# Parquet rows are numbered from 1; gzipped text and HTML are read decompressed (runs without it read them the old way)
READING = 2


def reading_changes(files: Iterable[str]) -> list[str]:
    """The changes from input reading 1 to 2 that touch ``files`` (a run's inputs): a run of reading 1 over none of
    them (JSONL, WARC, plain HTML) read them as this one does."""
    kinds = {(kind_of(Path(f)), f.lower().endswith(".gz")) for f in files}
    changes = {
        "a text file was one document, now the documents between its <|endoftext|> lines": any(
            k == "text" for k, _ in kinds
        ),
        "Parquet rows were numbered from 0, now from 1": any(k == "parquet" for k, _ in kinds),
        "gzipped text and HTML were read as their gzip bytes": any(k in ("text", "html") and gz for k, gz in kinds),
    }
    return [change for change, applies in changes.items() if applies]


def iter_located(path: str, text_field: str = "text") -> Iterator[tuple[dict, dict]]:
    """Documents of one input file, each with where it is: ``{"file": path}`` plus the 1-based ``line`` of a JSONL
    record, the byte ``offset`` of a WARC record (in the compressed file for .gz, where its gzip member starts) or the
    1-based ``row`` of a Parquet row; an HTML file is one document, named by the file alone, and so is a text file
    unless it holds ``<|endoftext|>``: then each document between those, as pack reads it, with its line. A record's
    text is its ``text_field``, given to the stages as ``text``."""
    p = Path(path)
    kind = kind_of(p)
    if kind == "jsonl" and json_input.opens_array(p):
        for n, rec in _json_array_records(p, text_field):
            where = {"file": path, "record": n}
            yield _with_content(rec, where, text_field), where
    elif kind == "jsonl":
        try:
            for lineno, rec in _jsonl_lines(p, text_field):
                where = {"file": path, "line": lineno}
                yield _with_content(rec, where, text_field), where
        except json_input.JsonLineError as exc:  # a file of the user's that no reader can read: how to do without it
            raise ValueError(f"{exc}: fix the file, or leave it out of --input (name a folder's other files)") from None
    elif kind == "parquet":
        for row, rec in enumerate(read_parquet(p), 1):  # from 1, as pack, tokenizer train and eval ppl number rows
            where = {"file": path, "row": row}
            yield _with_content(rec, where, text_field), where
    elif kind == "warc":
        for offset, rec in _warc_records(p):
            yield rec, _noting_bad_utf8({"file": path, "offset": offset}, rec.pop(BAD_UTF8, None))
    elif kind == "html":
        from cookmind.curate.extract import decode_html_noting

        html, bad = decode_html_noting(_read_bytes(p))
        yield {"id": str(p), "html": html}, _noting_bad_utf8({"file": path}, bad)
    elif text_input.ENDOFTEXT in (text_bad := text_input.decode_replacing(_read_bytes(p)))[0]:
        # documents separated as pack separates them (TinyStories): read whole, the separator lines were removed as
        # duplicate lines and the stories ran together into one document
        text, bad = text_bad
        for k, (line, doc) in enumerate(text_input.separated_documents(text)):
            where = {"file": path, "line": line}
            if k == 0:  # the bytes that were not UTF-8 are counted once, on the file's first document
                where = _noting_bad_utf8(where, bad)
            yield {"id": f"{p}#{k}", "text": doc}, where
    else:
        text, bad = text_bad  # a file without a separator is one document, line ends as they are
        yield {"id": str(p), "text": text}, _noting_bad_utf8({"file": path}, bad)


def _read_bytes(path: Path) -> bytes:
    """An HTML or text file's bytes, decompressed when it is gzip (``.gz``, or gzip's first bytes), as pack reads
    its inputs: read raw, a page.html.gz or stories.txt.gz was one document of gzip bytes read as U+FFFD."""
    with text_input.open_bytes(path) as f:
        return f.read()


# in ``where``: what of the document's bytes was not UTF-8 (``text_input.decode_replacing``)
BAD_UTF8 = text_input.BAD_UTF8


def _noting_bad_utf8(where: dict, bad: dict | None) -> dict:
    """``where``, noting (when ``bad``) the bytes that were not UTF-8 and were read as U+FFFD, where the first is."""
    if bad:
        line = {"line": bad["line"]} if "offset" not in where else {}  # a WET record: its offset names it
        where[BAD_UTF8] = {"lines": bad["lines"], "bytes": bad["bytes"], "first": place({**where, **line})}
    return where


def read_text_counting_bad_utf8(path: str | os.PathLike, stats) -> str:
    """A text file's text (a leading byte-order mark dropped), bytes that are not UTF-8 read as U+FFFD and counted in
    ``stats`` (a ``StageStats``, as ``count_bad_utf8`` counts them), for readers that do not go through
    ``iter_shard``: ``curate dedup --method minhash``'s documents, decontaminate's text eval files."""
    text, bad = text_input.decode_replacing(_read_bytes(Path(path)))  # gzipped too
    count_bad_utf8(_noting_bad_utf8({"file": os.fspath(path)}, bad), stats)
    return text


def count_bad_utf8(where: dict, stats) -> None:
    """Count in ``stats`` (a ``StageStats``) the document ``where`` names, if it held bytes that are not UTF-8
    (read as U+FFFD): ``invalid_utf8_docs``, ``_lines`` and ``_bytes``, and where the first one is."""
    bad = where.pop(BAD_UTF8, None)
    if bad and stats is not None:
        stats.counters.update(
            {f"{BAD_UTF8}_docs": 1, f"{BAD_UTF8}_lines": bad["lines"], f"{BAD_UTF8}_bytes": bad["bytes"]}
        )
        stats.first_at.setdefault(BAD_UTF8, bad["first"])


def _with_content(rec: dict, where: dict, text_field: str = "text") -> dict:
    """A record's text (its ``text_field``, then named "text") and "html" are strings; a null one is left out (a
    record with neither is counted as removed by extract, no_text)."""
    if text_field != "text" and "text" in rec and text_field not in rec:  # its text is under "text"
        fields = ", ".join(repr(k) for k in rec)
        raise ValueError(
            f"{place(where)}: the record has no {text_field!r} field, the --text-field (config text_field) to read; "
            f"its fields: {fields}; to read its 'text', use --text-field text (the default)"
        )
    if text_field != "text" and "text" in rec:  # the stages read and write "text": one of the two would be lost
        raise ValueError(
            f"{place(where)}: the record holds a 'text' field beside {text_field!r}, the --text-field (config "
            f"text_field) to read; curate writes the text it reads as 'text': rename the record's 'text' field"
        )
    if text_field in rec:
        rec["text"] = rec.pop(text_field)
    for key in ("text", "html"):
        if key in rec and rec[key] is None:
            del rec[key]
        elif key in rec and not isinstance(rec[key], str):
            name = text_field if key == "text" else key
            raise ValueError(
                f"{place(where)}: field {name!r} must be a string, got {type(rec[key]).__name__} ({rec[key]!r:.40}); "
                "fix the record or leave it out"
            )
    return rec


# the count of input records that held neither text nor html (first_at: the first's place and fields)
NO_TEXT_FIELDS = "records_without_text"


def no_text_note(stats, text_field: str = "text") -> str | None:
    """The report note for the records that held neither a text (``text_field``) nor an html field, as
    ``iter_shard`` counted them in ``stats`` (the first stage's ``StageStats``), or None."""
    n = stats.counters.get(NO_TEXT_FIELDS, 0)
    if not n:
        return None
    return (
        f"{n} records held no {text_field!r} field nor 'html', and extract removed them as no_text; the first: "
        f"{stats.first_at.get(NO_TEXT_FIELDS)}. If their text is under another name, name it with --text-field "
        "(config key text_field), as pack and tokenizer train take it"
    )


def iter_shard(
    spec: str | list[str],
    source_key: str | None = None,
    need_text: bool = False,
    stats=None,
    bar: bool = True,
    text_field: str = "text",
) -> Iterator[dict]:
    """Documents of a shard: one intermediate/output file, or a list of input files (each document then noting
    where it is, as ``iter_located`` says, under ``source_key`` if given). ``need_text``: the input documents go to a
    first stage other than extract, and one without text (an HTML page) is an error naming it. ``stats``: a
    ``StageStats`` that counts the input documents whose bytes were not all UTF-8 (``count_bad_utf8``). ``bar``: the
    documents read are counted on the document bar (``document_bar``); a reader that counts the documents it is done
    with itself (``documents_done_bar``) passes False. ``text_field``: the input records' text field (``iter_located``);
    records with neither text nor html are counted in ``stats`` (``no_text_note``)."""
    from cookmind.curate.executors import document_bar

    paths = [spec] if isinstance(spec, str) else spec
    inputs = not isinstance(spec, str)
    read = (iter_located(path, text_field if inputs else "text") for path in paths)
    located = ((path, i, doc, where) for path, docs in zip(paths, read) for i, (doc, where) in enumerate(docs))
    # one bar for the shard, however many files it has
    for path, i, doc, where in document_bar(located) if bar else located:
        count_bad_utf8(where, stats)
        if inputs and stats is not None and "text" not in doc and "html" not in doc:  # a record without either
            stats.counters[NO_TEXT_FIELDS] += 1
            stats.first_at.setdefault(NO_TEXT_FIELDS, f"{place(where)} (fields: {', '.join(map(str, doc)) or 'none'})")
        if need_text and not isinstance(spec, str) and "text" not in doc:
            raise ValueError(
                f"{place(where)}: {'an HTML document' if 'html' in doc else 'a record without text'}, but the "
                "config's stages do not begin with extract, and the others read text: put extract first (it "
                "turns HTML into text and counts documents without any as removed)"
            )
        doc.setdefault("id", f"{path}#{i}")
        if source_key and not isinstance(spec, str):
            doc[source_key] = where
        yield doc


def place(where: dict) -> str:
    """file:line, file: row N, file at byte N, or the file: where ``iter_located`` says a document is."""
    if "line" in where:
        return f"{where['file']}:{where['line']}"
    if "row" in where:
        return f"{where['file']}: row {where['row']}"
    if "record" in where:
        return f"{where['file']}: record {where['record']}"
    if "offset" in where:
        return f"{where['file']} at byte {where['offset']}"
    return where["file"]


def read_jsonl(path: Path) -> Iterator[dict]:
    """Records of a JSONL(.gz) file, or of one holding a JSON array; a bad line is an error naming file:line."""
    records = _json_array_records(path) if json_input.opens_array(Path(path)) else _jsonl_lines(path)
    for _, rec in records:
        yield rec


def _jsonl_lines(path: Path, text_field: str = "text") -> Iterator[tuple[int, dict]]:
    """(1-based line number, record) of a JSONL(.gz) file's non-blank lines (``_record``)."""
    for lineno, rec in json_input.jsonl_lines(path):
        yield lineno, _record(rec, f"{path}:{lineno}", text_field)


def _json_array_records(path: Path, text_field: str = "text") -> Iterator[tuple[int, dict]]:
    """(1-based record number, record) of a file holding one JSON array of records (``_record``), as pack reads
    one."""
    with text_input.open_bytes(path) as f:
        rows = json_input.array_elements(text_input.decode_utf8(f.read(), path), path)
    for n, rec in enumerate(rows, 1):
        yield n, _record(rec, f"{path}: record {n}", text_field)


def _record(value, where: str, text_field: str = "text") -> dict:
    """A JSON record as a document: an object as it is, a string as its text (its ``text_field``: a string is the
    text whatever the field, as pack reads one); anything else is a ValueError naming ``where``."""
    if isinstance(value, str):
        return {text_field: value}
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: expected a JSON object (or a string, a document's text), got {type(value).__name__}; fix the "
            "record or leave it out"
        )
    return value


def read_parquet(path: Path) -> Iterator[dict]:
    """Rows of a Parquet file as dicts (a file that is not Parquet: a ValueError naming it)."""
    return text_input.parquet_rows(path)


def read_warc(path: Path) -> Iterator[dict]:
    """HTML responses (as "html") and WET conversions (as "text") of a WARC/WET file, via fastwarc."""
    for _, doc in _warc_records(path):
        doc.pop(BAD_UTF8, None)
        yield doc


def _warc_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(byte offset of the record in the file, document) of read_warc's records."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    from cookmind.curate.extract import charset_of, decode_html_noting

    types = WarcRecordType.response | WarcRecordType.resource | WarcRecordType.conversion
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, record_types=types, parse_http=True):
            url = rec.headers.get("WARC-Target-URI", "")
            rid = rec.headers.get("WARC-Record-ID", "") or url
            body = rec.reader.read()
            if rec.record_type == WarcRecordType.conversion:
                text, bad = text_input.decode_replacing(body)
                yield rec.stream_pos, {"id": rid, "url": url, "text": text, **({BAD_UTF8: bad} if bad else {})}
                continue
            ctype = (rec.http_headers.get("Content-Type", "") if rec.http_headers else "") or ""
            if ctype and "html" not in ctype.lower():
                continue
            html, bad = decode_html_noting(body, charset_of(ctype))
            yield rec.stream_pos, {"id": rid, "url": url, "html": html, **({BAD_UTF8: bad} if bad else {})}


def write_shard(docs: Iterable[dict], path: str | os.PathLike, fmt: str | None = None) -> int:
    """Write documents to ``path`` (JSONL, JSONL.gz or Parquet by ``fmt`` or suffix) atomically; returns count."""
    path = Path(path)
    fmt = fmt or ("parquet" if path.name.endswith(".parquet") else "jsonl.gz" if path.name.endswith(".gz") else "jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with temp_path(path) as tmp:
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            rows = list(docs)
            n = len(rows)
            pq.write_table(
                pa.Table.from_pylist(rows)
                if rows
                else pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                tmp,
            )
        else:
            raw = gzip.open(tmp, "wb", compresslevel=3) if fmt == "jsonl.gz" else open(tmp, "wb")
            with raw:
                for doc in docs:
                    raw.write(json.dumps(doc, ensure_ascii=False).encode("utf-8") + b"\n")
                    n += 1
    return n


def shard_suffix(fmt: str) -> str:
    """File suffix of an output format."""
    suffixes = {"jsonl.gz": ".jsonl.gz", "jsonl": ".jsonl", "parquet": ".parquet"}
    if fmt not in suffixes:
        raise ValueError(f"unknown output format {fmt!r}; use one of {sorted(suffixes)}")
    return suffixes[fmt]
