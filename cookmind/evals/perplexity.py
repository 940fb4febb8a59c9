"""Perplexity and bits per byte of a model on a text file, documents (JSON lines, Parquet) or a token store.

    ppl = exp( sum NLL / tokens )        bpb = sum NLL / (ln 2 * UTF-8 bytes)
Bits per byte compares models with different tokenizers: it counts the text, not the tokens. A special token
(the ``<|endoftext|>`` between documents) is no text: its prediction is in the NLL (where a document ends is part
of what the model must tell), its spelling is not in the bytes.
Windows of ``window`` tokens slide by ``stride``; each token is scored once, with as much
left context as the window allows (the first window scores all of its predictions).
Documents are read as ``cookmind pack`` reads them and joined as it joins its records
(``cookmind.tokenizer.documents``): each one's BOS when the tokenizer opens every text with one (Llama's ``<s>``),
its text, then the end of a document (``<|endoftext|>``, else the tokenizer's EOS); plain text that spells
``<|endoftext|>`` gets that end there, and a blank piece before one is left out, as pack does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cookmind import text_input
from cookmind.align.losses import gather_log_probs, logits_of
from cookmind.align.prompts import encode_text, is_hf_tokenizer
from cookmind.progress import progress_bar
from cookmind.tokenizer.bytes_unicode import unicode_to_bytes, without_lone_surrogates
from cookmind.tokenizer.documents import document_end_id, document_start_ids

if TYPE_CHECKING:
    from cookmind.store.records import SkippedRecords

ENDOFTEXT = "<|endoftext|>"  # pack's document separator in plain text
_SURROGATE = re.compile("[\ud800-\udfff]")


@torch.no_grad()
def sequence_nll(
    model,
    ids: list[int],
    window: int,
    stride: int | None = None,
    progress: bool = False,
    windows: list[dict] | None = None,
) -> tuple[float, int]:
    """(sum of -log p(token | previous tokens) in nats, number of scored tokens) over ``ids``.

    The first token has no context and is not scored. ``windows``, when given, gets one row per window: its first
    token's position, the tokens it scored and their summed NLL (what ``eval ppl --out`` writes).
    """
    stride = stride or window
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and window > context:
        raise ValueError(
            f"perplexity: a window of {window} tokens exceeds the model's context of {context} tokens "
            f"(positions past it are meaningless); use --window {context} or less"
        )
    if not 0 < stride <= window:
        raise ValueError(f"perplexity: stride {stride} must be in 1..window ({window})")
    device = next(model.parameters()).device if hasattr(model, "parameters") else torch.device("cpu")
    ids_t = torch.tensor(ids, dtype=torch.long, device=device)
    total, count, scored_upto = 0.0, 0, 1  # position of the next target not yet scored
    starts = []  # up to the first window that reaches the end: the bar's total is the windows run (it ended at 5/6)
    for start in range(0, max(1, len(ids) - 1), stride):
        starts.append(start)
        if start + window + 1 >= len(ids):
            break
    for start in progress_bar(starts, desc="perplexity", unit="window", enabled=progress):
        chunk = ids_t[start : start + window + 1]
        if len(chunk) < 2:
            break
        logits = logits_of(model(chunk[None, :-1]))[0]
        lp = gather_log_probs(logits, chunk[1:])
        first_new = max(0, scored_upto - (start + 1))  # skip targets an earlier window scored
        nll = -lp[first_new:].sum().item()
        total += nll
        count += len(lp) - first_new
        if windows is not None:
            windows.append({"start": start, "tokens": len(lp) - first_new, "nll": nll})
        scored_upto = start + len(chunk)
    return total, count


def _report(nll: float, tokens: int, n_bytes: int) -> dict:
    return {
        "tokens": tokens,
        "bytes": n_bytes,
        "nll_per_token": nll / max(1, tokens),
        "perplexity": math.exp(nll / max(1, tokens)),
        "bits_per_byte": nll / math.log(2) / max(1, n_bytes),
    }


def _window_row(i: int, row: dict) -> dict:
    return {"window": i, **row, "nll_per_token": row["nll"] / max(1, row["tokens"])}


def text_bytes(tokenizer, ids) -> int:
    """The UTF-8 bytes of the text ``ids`` stand for; a special token counts none (it separates text, it is none)."""
    ids = [int(i) for i in ids]
    if is_hf_tokenizer(tokenizer):
        exact = _byte_level_bytes(tokenizer, ids)
        if exact is not None:
            return exact
        return len(tokenizer.decode(ids, skip_special_tokens=True).encode("utf-8"))
    specials = set(getattr(tokenizer, "special_tokens", {}).values())
    kept = [i for i in ids if i not in specials]
    if hasattr(tokenizer, "decode_bytes"):  # ours: the bytes themselves, a character cut by a window not replaced
        return len(tokenizer.decode_bytes(kept))
    return len(tokenizer.decode(kept).encode("utf-8"))


def _byte_level_bytes(tokenizer, ids: list[int]) -> int | None:
    """The bytes a byte-level transformers tokenizer's (GPT-2's, Qwen's) non-special ids stand for, counted by GPT-2's
    byte table as ours counts them: decoding a window cut inside a character gives U+FFFD's three bytes for each
    piece of it. None for another kind of tokenizer (SentencePiece's), or a token outside the table."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ != "ByteLevel":
        return None
    specials = set(tokenizer.all_special_ids)
    table = unicode_to_bytes()
    tokens = tokenizer.convert_ids_to_tokens([i for i in ids if i not in specials])
    if not all(isinstance(t, str) and all(c in table for c in t) for t in tokens):
        return None
    return sum(len(t) for t in tokens)


def _joined_ids(tokenizer, pieces: Sequence[str], end_id: int) -> list[int]:
    """The ids of ``pieces`` as pack lays out documents: each piece encoded on its own and opened by the document
    start (``document_start_ids``; an empty piece, which marks the one before as ended, by nothing), ``end_id``
    between each two."""
    pieces = list(pieces)
    if not is_hf_tokenizer(tokenizer) and hasattr(tokenizer, "encode_batch"):
        encoded = tokenizer.encode_batch(pieces)
    else:
        encoded = [encode_text(tokenizer, piece) for piece in pieces]
    start = document_start_ids(tokenizer)
    ids: list[int] = []
    for k, (piece, piece_ids) in enumerate(zip(pieces, encoded)):
        if k:
            ids.append(end_id)
        ids.extend([*start, *piece_ids] if piece else piece_ids)
    return ids


def _text_ids(
    tokenizer, text: str, end_last: bool = False, separator: str = ENDOFTEXT, one_per_line: bool = False
) -> tuple[list[int], int, int]:
    """Ids for ``text``, the UTF-8 bytes of its text and the empty documents left out, as pack reads a text file
    (``cookmind.store.sources``): where it spells ``separator`` goes the end of a document (``document_end_id``),
    and no bytes; each document is stripped of the whitespace around it, and a blank one is left out. With
    ``one_per_line`` each line is a document, less its line ending (pack keeps its other whitespace). ``end_last``:
    the last document is ended too where the text does not spell its end, as pack ends every document of a file
    (not of a file cut short by --max-bytes: its last document goes on past the cut)."""
    end = document_end_id(tokenizer)
    if end is None:  # no end of a document to put where the text spells one: it is all text
        return encode_text(tokenizer, text), len(text.encode("utf-8")), 0
    if one_per_line:
        *ended, last = (line.removesuffix("\r") for line in text.split("\n"))
    else:
        *ended, last = (piece.strip() for piece in (text.split(separator) if separator else [text]))
    last = last if last.strip() else ""
    docs = [p for p in ended if p.strip()]
    # blank text before the first separator is no document, as pack reads it; a blank first line is one
    empty = len(ended) - len(docs) - (not one_per_line and bool(ended) and not ended[0])
    docs += [last] if last else []
    pieces = docs if last and not end_last else [*docs, ""]  # "": the last document's end
    return _joined_ids(tokenizer, pieces, end), sum(len(p.encode("utf-8")) for p in pieces), empty


def _evaluate_ids(model, tokenizer, ids, n_bytes, window, stride, progress, rows, what="the text") -> dict:
    """``_report`` for ``ids`` whose text has ``n_bytes`` UTF-8 bytes: ``bytes`` those of the predicted tokens,
    ``context_bytes`` the first token's (context for the rest, never predicted); the two add up to ``n_bytes``."""
    if len(ids) < 2:
        raise ValueError(f"perplexity: {what} has fewer than 2 tokens; nothing to predict")
    windows: list[dict] = []
    nll, n = sequence_nll(model, ids, window, stride, progress, windows)
    if rows is not None:
        rows.extend(_window_row(i, w) for i, w in enumerate(windows))
    context = text_bytes(tokenizer, ids[:1])
    return {**_report(nll, n, n_bytes - context), "context_bytes": context}


def evaluate_text(
    model,
    tokenizer,
    text: str,
    window: int = 256,
    stride: int | None = None,
    progress: bool = False,
    rows: list[dict] | None = None,
    end_last: bool = False,
    separator: str = ENDOFTEXT,
    one_per_line: bool = False,
) -> dict:
    """Perplexity and bits per byte on ``text``. ``bytes`` exclude the first token's, ``context_bytes`` (it is never
    predicted).
    A ``<|endoftext|>`` (or ``separator``; each line with ``one_per_line``) in the text separates documents, as
    ``pack`` reads plain text (``_text_ids``); the last document ends only where the text spells its end, or with
    ``end_last`` (a whole file, ended as pack ends it).

    ``rows``, when given, gets one row per window: window, start (token), tokens scored, nll, nll_per_token."""
    ids, n_bytes, empty = _text_ids(tokenizer, text, end_last, separator, one_per_line)
    report = _evaluate_ids(model, tokenizer, ids, n_bytes, window, stride, progress, rows)
    return {**report, "empty_documents": empty}  # blank pieces between separators: nothing to score, left out


def evaluate_text_file(
    model,
    tokenizer,
    path,
    window: int = 256,
    stride: int | None = None,
    max_bytes: int | None = None,
    progress: bool = True,
    rows: list[dict] | None = None,
    separator: str = ENDOFTEXT,
    one_per_line: bool = False,
) -> dict:
    """``evaluate_text`` on a UTF-8 file (its first ``max_bytes`` bytes when given: ``file_bytes`` and
    ``bytes_not_evaluated`` say how much that left out), its documents split as ``pack --separator`` or
    ``--one-per-line`` splits them. A gzip file is read decompressed. The file's bytes add up: ``bytes`` +
    ``context_bytes`` + ``not_text_bytes`` (a byte-order mark, each separator spelled out and the whitespace around
    documents, in the part evaluated) + ``bytes_not_evaluated`` == ``file_bytes``."""
    with text_input.open_bytes(path) as f:
        data = f.read()
    file_bytes = len(data)
    cut = max_bytes is not None and file_bytes > max_bytes
    if cut:
        data = data[:max_bytes]
        # the cut may split a character: its first bytes are left out, not an error
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data":
                data = data[: exc.start]
    # a byte-order mark opening the file is no text: neither scored nor counted as left out
    mark = len(text_input.BOM.encode()) if data.startswith(text_input.BOM.encode()) else 0
    # bad bytes dropped or replaced would change the perplexity: an error naming file:line
    text = text_input.decode_utf8(data, path)
    report = evaluate_text(model, tokenizer, text, window, stride, progress, rows, not cut, separator, one_per_line)
    evaluated = mark + len(text.encode("utf-8"))
    return {
        "path": str(path),
        **report,
        "file_bytes": file_bytes,
        "not_text_bytes": evaluated - report["bytes"] - report["context_bytes"],
        "bytes_not_evaluated": file_bytes - evaluated,
    }


def read_documents(
    paths,
    text_field: str = "text",
    empty: list | None = None,
    skipped: SkippedRecords | None = None,
    lone_surrogates: list[int] | None = None,
) -> Iterator[str]:
    """The documents of JSON lines / Parquet / text files (gzip too), in order, as ``pack --train-type seq`` reads
    them (``cookmind.store.sources``): each record's ``text_field``; text split at ``<|endoftext|>``. A document
    with no text is left out (it has nothing to score; ``empty``, when given, gets its place); a bad record is a
    ValueError naming file:line, or, with ``skipped`` given (``--skip-bad``), counted there and left out. A lone
    surrogate in JSON text ("\\ud800", no character) is read as U+FFFD, as pack's encoder stores it
    (``lone_surrogates[0]``, when given, counts them)."""
    from cookmind.store.records import (
        BadRecord,
        EmptyDocument,
        RecordOptions,
        make_seq,
        parse,
        reason_kind,
        train_type_of,
    )
    from cookmind.store.sources import iter_items

    opts = RecordOptions("seq", text_field)
    for path in paths:
        for item in iter_items(path, separator=ENDOFTEXT):
            obj = None
            try:
                obj = parse(item)
                text = make_seq(obj, None, opts)
            except EmptyDocument:
                if empty is not None:
                    empty.append(item.where)
            except BadRecord as exc:
                kind = train_type_of(obj) if isinstance(obj, dict) and text_field not in obj else None
                if skipped is None and kind not in (None, "seq"):
                    # pack's advice (pack it as sft data, or --skip-bad) is a dead end here: ppl reads no sft store,
                    # and every record of such a file would be skipped
                    raise ValueError(
                        f"{item.where}: missing field {text_field!r} (found {sorted(obj)}): a record of {kind} data, "
                        "not a text document; eval ppl scores documents' text: name the field that holds it with "
                        "--text-field FIELD"
                    ) from None
                if skipped is None:
                    raise ValueError(
                        f"{item.where}: {exc}; fix the record, or pass --skip-bad to skip bad records and count them"
                    ) from None
                skipped.add(reason_kind(str(exc)), f"{item.where}: {exc}")
            else:
                if _SURROGATE.search(text):
                    fixed = without_lone_surrogates(text)
                    if lone_surrogates is not None:
                        lone_surrogates[0] += fixed.count("\ufffd") - text.count("\ufffd")
                    text = fixed
                yield text


def _first_bytes(docs: list[str], max_bytes: int) -> list[str]:
    """The pieces for ``_joined_ids`` that hold the first ``max_bytes`` bytes of the documents' text: the documents
    that fit whole (each then ends with its end token, which is no text), the next one cut where the bytes end (a
    split character dropped)."""
    pieces, left = [], max_bytes
    for doc in docs:
        raw = doc.encode("utf-8")
        if len(raw) > left:  # cut inside this document; a split character is dropped
            pieces.append(raw[:left].decode("utf-8", "ignore"))
            return pieces
        pieces.append(doc)
        left -= len(raw)
    return [*pieces, ""]


def evaluate_documents(
    model,
    tokenizer,
    paths,
    window: int = 256,
    stride: int | None = None,
    max_bytes: int | None = None,
    text_field: str = "text",
    progress: bool = True,
    rows: list[dict] | None = None,
    name: str | None = None,
    skipped: SkippedRecords | None = None,
) -> dict:
    """``evaluate_text`` on the documents of ``paths`` (``read_documents``) joined as pack joins its records: each
    document's ids, then the ``<|endoftext|>`` token; the same as the plain text of the documents each followed by
    ``<|endoftext|>``, and never the JSON around them. ``text_bytes`` counts the documents' text (an end token is
    none); ``max_bytes`` keeps its first bytes, ``bytes_not_evaluated`` says how many that left out, so that
    ``bytes`` + ``context_bytes`` + ``bytes_not_evaluated`` == ``text_bytes``; ``empty_documents`` counts the records
    with no text, left out. ``name``: what the user gave (a curate folder), the report's ``path`` and errors' name
    for the data (default: the paths, by commas). ``skipped`` (``--skip-bad``): bad records are counted there and
    left out, and the report's ``skipped`` says how many, by reason, and the first ones."""
    paths = [Path(p) for p in paths]
    where = name or ", ".join(map(str, paths))
    end = document_end_id(tokenizer)
    if end is None:
        raise ValueError(
            f"perplexity: {where}: the tokenizer has no <|endoftext|> (or EOS) token to end each document with, as "
            "pack does; use a tokenizer that has one"
        )
    empty: list[str] = []
    lone = [0]
    docs = list(read_documents(paths, text_field, empty, skipped, lone))
    if not docs and skipped is not None and skipped.count:
        raise ValueError(f"perplexity: {where} holds no document to score: every record was bad; {skipped.summary()}")
    if not docs:
        raise ValueError(
            f"perplexity: {where} holds no document with text in its {text_field!r} field; nothing to score"
        )
    all_bytes = sum(len(d.encode("utf-8")) for d in docs)
    pieces = [*docs, ""] if max_bytes is None else _first_bytes(docs, max_bytes)
    evaluated = sum(len(p.encode("utf-8")) for p in pieces)
    ids = _joined_ids(tokenizer, pieces, end)
    report = _evaluate_ids(model, tokenizer, ids, evaluated, window, stride, progress, rows, "the documents' text")
    return {
        "path": where,
        **report,
        "documents": len(docs),
        "empty_documents": len(empty),  # records with no text: nothing to score, left out
        **({"lone_surrogates": lone[0]} if lone[0] else {}),  # JSON's "\\ud800": scored as U+FFFD, as pack stores it
        **({"skipped": skipped.as_meta()} if skipped is not None else {}),  # bad records --skip-bad left out
        "text_bytes": all_bytes,
        "bytes_not_evaluated": all_bytes - evaluated,
    }


def data_kind(path) -> str:
    """How ``cookmind eval ppl --data`` reads ``path``, as ``cookmind pack --input`` would: ``store`` (a folder
    with meta.json, or an .h5 file), ``documents`` (JSON lines / Parquet files, gzip too, or a curate output
    folder's shard-* files) or ``text`` (any other file, as UTF-8). FileNotFoundError or ValueError (one line,
    what to pass) when it names nothing to read."""
    from cookmind.store.layout import META_NAME
    from cookmind.store.sources import source_kind

    path = Path(path)
    if path.is_dir():
        if (path / META_NAME).is_file():
            return "store"
        if any(path.glob("shard-*")):
            return "documents"
        raise ValueError(
            f"--data {path} is a folder with neither a token store's {META_NAME} nor a curate output's shard-* "
            "files; pass the store (made by `cookmind pack`), the curate output folder, or a text, JSON lines or "
            "Parquet file"
        )
    if not path.exists():
        raise FileNotFoundError(
            f"--data {path} does not exist; pass a text, JSON lines or Parquet file, a curate output folder or a "
            "token store made by `cookmind pack`"
        )
    if path.suffix.lower() in (".h5", ".hdf5"):
        return "store"
    return "documents" if source_kind(path) in ("json", "parquet") else "text"


def require_data(
    path,
    max_bytes=None,
    max_windows=None,
    stride=None,
    text_field=None,
    skip_bad=False,
    separator=None,
    one_per_line=False,
) -> str:
    """``data_kind(path)``, after refusing the options that do not apply to that kind (each was ignored without a
    word): --max-bytes and --stride are for text and documents, --max-windows for a token store, --text-field and
    --skip-bad for JSON lines / Parquet documents, --separator and --one-per-line (one of them) for plain text."""
    if one_per_line and separator is not None:
        raise ValueError("--one-per-line and --separator both say where documents end: drop one")
    kind = data_kind(path)
    if (one_per_line or separator is not None) and kind != "text":
        flag = "--one-per-line" if one_per_line else "--separator"
        held = "a token store" if kind == "store" else "JSON lines or Parquet records, one document a record"
        raise ValueError(f"{flag} says where a plain text file's documents end, and --data {path} is {held}: drop it")
    if skip_bad and kind != "documents":
        raise ValueError(
            f"--skip-bad skips bad JSON or Parquet records, and --data {path} is "
            f"{'a token store' if kind == 'store' else 'plain text, which has none'}: drop it"
        )
    if text_field is not None and kind != "documents":
        raise ValueError(
            f"--text-field names a field of JSON or Parquet records, and --data {path} is "
            f"{'a token store' if kind == 'store' else 'plain text'}: drop it"
        )
    if kind == "store" and (max_bytes is not None or stride is not None):
        flag = "--max-bytes" if max_bytes is not None else "--stride"
        raise ValueError(
            f"{flag} applies to text and documents, and --data {path} is a token store, scored in the windows of "
            "--window tokens it is read in: drop it (--max-windows N scores the first N windows)"
        )
    if kind != "store" and max_windows is not None:
        raise ValueError(
            f"--max-windows applies to a token store, and --data {path} is {kind}: drop it (--max-bytes N scores "
            "the first N bytes of its text)"
        )
    return kind


def evaluate_data(
    model,
    tokenizer,
    path,
    window: int = 256,
    stride: int | None = None,
    max_bytes: int | None = None,
    max_windows: int | None = None,
    text_field: str = "text",
    progress: bool = True,
    rows: list[dict] | None = None,
    skipped: SkippedRecords | None = None,
    separator: str | None = None,
    one_per_line: bool = False,
) -> dict:
    """What ``cookmind eval ppl --data`` names (``data_kind``): a token store by ``evaluate_store``; JSON lines /
    Parquet files and a curate output folder by ``evaluate_documents``; any other file as UTF-8 text by
    ``evaluate_text_file`` (``separator``, default ``<|endoftext|>``, or ``one_per_line`` split its documents). A
    limit that does not apply to the kind is a ValueError (``require_data``); ``skipped`` (``--skip-bad``, documents
    only) counts the bad records left out."""
    from cookmind.store.sources import expand_inputs

    path = Path(path)
    kind = require_data(path, max_bytes, max_windows, stride, None, skipped is not None, separator, one_per_line)
    if kind == "store":
        return evaluate_store(model, tokenizer, path, window, max_windows, progress, rows)
    if kind == "documents":
        paths = expand_inputs([path]) if path.is_dir() else [path]
        return evaluate_documents(
            model, tokenizer, paths, window, stride, max_bytes, text_field, progress, rows, str(path), skipped
        )
    separator = ENDOFTEXT if separator is None else separator
    return evaluate_text_file(
        model, tokenizer, path, window, stride, max_bytes, progress, rows, separator, one_per_line
    )


def evaluate_store(
    model,
    tokenizer,
    path,
    window: int = 256,
    max_windows: int | None = None,
    progress: bool = True,
    rows: list[dict] | None = None,
) -> dict:
    """Perplexity and bits per byte over a packed token store's windows (read as a ``seq`` dataset).

    Each window predicts its own tokens 2..T from their prefixes; the tokens after the last full window form one
    shorter window, so every token but each window's first is scored. Bytes are the text bytes of the predicted
    tokens (``text_bytes``: a special token has none), so bits per byte stays comparable with ``evaluate_text``.
    ``windows``/``windows_total`` and ``store_tokens``/``tokens_not_evaluated`` say how much ``max_windows`` left
    out; ``rows``, when given, gets one row per window: window, start, stop, tokens scored, bytes, nll,
    nll_per_token, bits_per_byte.
    """
    from cookmind.data import DatasetFactory
    from cookmind.tokenizer.documents import tokenizer_identity

    # a store packed with another tokenizer than the model's is refused: its ids would be scored as other text, and
    # its documents framed otherwise than the model's would be scored otherwise than the model reads text
    fingerprint, framing = tokenizer_identity(tokenizer)
    ds = DatasetFactory.load(
        "seq",
        str(path),
        window,
        tokenizer_fingerprint=fingerprint,
        tokenizer_path="the model's tokenizer",
        tokenizer_framing=framing,
    )
    spans = [ds.window_bounds(i) for i in range(len(ds))]
    stream_length = ds.store.stream_length("sequence")
    end = spans[-1][1] if spans else 0
    if stream_length - end >= 2:  # the tail (or a whole store shorter than one window)
        spans.append((end, stream_length))
    if not spans:
        raise ValueError(f"perplexity: the store at {path} has {stream_length} token(s); nothing to predict")
    total, count, n_bytes = 0.0, 0, 0
    evaluated = spans[:max_windows]
    for i, (start, stop) in enumerate(progress_bar(evaluated, desc="perplexity", unit="window", enabled=progress)):
        ids = ds.store.stream("sequence", start, stop).tolist()
        nll, k = sequence_nll(model, ids, window)
        b = text_bytes(tokenizer, ids[1:])
        total += nll
        count += k
        n_bytes += b
        if rows is not None:
            row = _window_row(i, {"start": start, "stop": stop, "tokens": k, "bytes": b, "nll": nll})
            rows.append({**row, "bits_per_byte": nll / math.log(2) / max(1, b)})
    return {
        "path": str(path),
        **_report(total, count, n_bytes),
        "windows": len(evaluated),
        "windows_total": len(spans),
        "store_tokens": stream_length,
        "tokens_not_evaluated": stream_length - evaluated[-1][1],
    }
