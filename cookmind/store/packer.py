"""``pack``: tokenize input files into a sharded token store, in parallel, never half-written.

Items are read in order, cut into chunks, tokenized by a process pool (``imap`` keeps the
order, so the store is the same for any number of workers), and written by one
``StoreWriter``. A bad item stops the pack with ``file:line: reason`` — nothing is left on
disk — unless ``skip_bad`` is set, in which case it is counted in ``meta.json``. A pretraining document
with empty text is no bad item: it carries nothing, and is left out and counted (``empty_records``).
"""

from __future__ import annotations

import itertools
import json
import random
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from cookmind import text_input
from cookmind.pools import ignore_ctrl_c, pool_context, stop_pool
from cookmind.progress import progress_bar
from cookmind.store.records import (
    BadRecord,
    EmptyDocument,
    RecordOptions,
    SkippedRecords,
    make_record,
    make_seq,
    parse,
    reason_kind,
)
from cookmind.store.sources import (
    JSON_SUFFIXES,
    PARQUET_SUFFIXES,
    check_text_field_applies,
    count_items,
    estimate_items,
    iter_items,
    source_kind,
)
from cookmind.store.writer import StoreWriter, check_store_out
from cookmind.tokenizer.documents import document_end_id, document_framing, document_ids

CHUNK = 256
EMPTY = "empty document"  # _encode_chunk's record for an EmptyDocument (a string: it crosses the pool)

_worker: dict = {}


class PackError(ValueError):
    """A bad input line stopped the pack; the message names file:line and the reason."""


def _load_tokenizer(tokenizer):
    if isinstance(tokenizer, (str, Path)):
        from cookmind.tokenizer.hf_adapter import load_tokenizer

        return load_tokenizer(tokenizer)  # ours, else a Hugging Face one through transformers (Mistral's)
    return tokenizer


def _init_worker(tokenizer, opts: RecordOptions) -> None:
    _worker["tok"] = _load_tokenizer(tokenizer)
    _worker["opts"] = opts


def _init_pool_worker(tokenizer, opts: RecordOptions) -> None:
    ignore_ctrl_c()  # the parent stops the pool (cookmind.pools)
    _init_worker(tokenizer, opts)


def _encode_chunk(items) -> list[tuple]:
    """(source, where (``Item.where``), record or None, reason or None) for each item of a chunk."""
    tok, opts = _worker["tok"], _worker["opts"]
    out: list[tuple] = []
    if opts.train_type == "seq":  # batch the encoder over the chunk's texts
        texts, where = [], []
        for it in items:
            try:
                texts.append(make_seq(parse(it), tok, opts))
                where.append(len(out))
                out.append((it.source, it.where, None, None))
            except EmptyDocument:
                out.append((it.source, it.where, EMPTY, None))
            except BadRecord as exc:
                out.append((it.source, it.where, None, str(exc)))
        for k, ids in zip(where, tok.encode_batch(texts) if texts else []):
            src, where, _, _ = out[k]
            out[k] = (src, where, {"sequence": np.asarray(document_ids(tok, ids), dtype=np.int64)}, None)
        return out
    for it in items:
        try:
            out.append((it.source, it.where, make_record(it, tok, opts), None))
        except BadRecord as exc:
            out.append((it.source, it.where, None, str(exc)))
    return out


def _with_utf8_hint(exc: ValueError) -> ValueError:
    """A plain text file's bad UTF-8 (an error for the whole file) with the option that reads it anyway."""
    if "invalid UTF-8" not in str(exc):
        return exc
    return PackError(f"{exc}, or pass --utf8-errors replace to read bad bytes as U+FFFD")


def _items(path, separator: str, one_per_line: bool, utf8_errors: str, replaced: text_input.Utf8Replaced):
    """``iter_items`` of one input, a plain text file's bad UTF-8 saying how to go on (replaced: counted)."""
    try:
        yield from iter_items(path, separator, one_per_line, utf8_errors, replaced)
    except ValueError as exc:
        raise _with_utf8_hint(exc) from None


def _chunks(iterable, size):
    it = iter(iterable)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


MINORITY = "minority grpo kind"  # the reason_kind of a grpo record --skip-bad leaves out for the input's rarer kind
_MINORITY_SAYS = "\0minority"  # stands in an example's reason until the kinds are counted (``_KindSkips``)


def _minority_reason(offline: bool, kinds: Counter) -> str:
    """Why --skip-bad leaves a grpo record of the input's rarer kind out (``reason_kind``: ``MINORITY``)."""
    one = {False: "a problem with its reference answer (online)", True: "a scored response (offline)"}
    many = {False: "problems with reference answers (online)", True: "scored responses (offline)"}
    return (
        f"{MINORITY}: this record is {one[offline]}, and {kinds[not offline]:,} of the input's "
        f"{kinds.total():,} good records are {many[not offline]}: a grpo store holds one kind, the input's more common "
        "one; pack this kind into its own store"
    )


class _KindSkips:
    """A grpo pack's records --skip-bad leaves out, in input order, as they would be were either kind the rarer one
    (which is, is known once the input is read: it is read once, each record tokenized once). ``kinds`` counts the
    good records of each kind (True: scored responses, offline; False: problems, online); a record bad anyway
    counts for neither, and is skipped for its own reason whichever kind is kept."""

    def __init__(self):
        self.kinds: Counter = Counter()
        self.if_rarer = {False: SkippedRecords(), True: SkippedRecords()}

    def bad(self, kind: str, where: str) -> None:
        for skips in self.if_rarer.values():
            skips.add(kind, where)

    def good(self, offline: bool, at: str) -> None:
        self.kinds[offline] += 1
        self.if_rarer[offline].add(MINORITY, f"{at}: {_MINORITY_SAYS}")

    def keep_offline(self) -> bool:
        """The kind to keep, the more common (an input of one kind, or none: that one); as many of each is refused."""
        kinds = self.kinds
        if kinds[True] and kinds[True] == kinds[False]:
            raise PackError(
                f"the input holds as many scored responses (offline) as problems (online), {kinds[True]:,} of each: "
                "a grpo store holds one kind, and --skip-bad keeps the more common one; pack each kind into its own "
                "store"
            )
        return kinds[True] > kinds[False]

    def skipped(self, offline_kept: bool) -> SkippedRecords:
        """The records left out when ``offline_kept`` says which kind is kept: the other kind's, and the bad ones."""
        skips = self.if_rarer[not offline_kept]
        says = _minority_reason(not offline_kept, self.kinds)
        return SkippedRecords(skips.by_reason, [e.replace(_MINORITY_SAYS, says) for e in skips.examples])


def _check_flags_apply(
    train_type: str, given: dict[str, bool], inputs: list[Path], separator: str | None, one_per_line: bool
) -> None:
    """Refuse a flag the train type or the inputs do not read (it was ignored without a word): the user believed it
    took effect. ``given`` says which flags were given (with any value, the default's too)."""
    only = {
        "--text-field": "seq",
        "--separator": "seq",
        "--one-per-line": "seq",
        "--add-system-ratio": "sft",
        "--drop-empty-think-ratio": "sft",
        "--prompt-template": "grpo",
        "--split-turns": "sft",
    }
    for flag, for_type in only.items():
        if given.get(flag) and train_type != for_type:
            raise PackError(f"{flag} applies to --train-type {for_type} only, and this pack is {train_type}: drop it")
    if one_per_line and separator is not None:
        raise PackError("--one-per-line and --separator both say where documents end: give one")
    kinds = {source_kind(p) for p in inputs}
    if (one_per_line or separator is not None) and "text" not in kinds:
        flag = "--one-per-line" if one_per_line else "--separator"
        raise PackError(
            f"{flag} says where a plain text file's documents end, and no input is plain text (JSON lines, JSON "
            "and Parquet hold one document a record): drop it"
        )
    if given.get("--text-field"):
        try:
            check_text_field_applies(inputs)
        except ValueError as exc:
            raise PackError(str(exc)) from None


def _check_inputs_hold_records(train_type: str, inputs: list[Path]) -> None:
    """Refuse a plain text input (by its suffix) to an sft/dpo/grpo pack before any line is read: its documents are
    strings, never records, so every one was "expected a JSON object, got str", even a line of JSON in a .txt file."""
    if train_type == "seq":
        return
    for p in inputs:
        if source_kind(p) == "text":
            stem = Path(p.stem).stem if p.suffix.lower() == ".gz" else p.stem
            raise PackError(
                f"{p}: --train-type {train_type} reads records, from JSON lines ({', '.join(JSON_SUFFIXES)}) or "
                f"Parquet ({', '.join(PARQUET_SUFFIXES)}) files, optionally .gz, and this file's suffix makes it plain "
                f"text, which only --train-type seq reads; rename it (e.g. {stem}.jsonl if it holds JSON lines)"
            )


def _check_options(opts: RecordOptions, tok, tokenizer) -> None:
    """Refuse, before any line is read, options under which no record could come out right."""
    name = f"tokenizer {tokenizer}" if isinstance(tokenizer, (str, Path)) else "the tokenizer"
    from cookmind.prompt_templates import PROMPTS

    if opts.prompt_template != "chat" and "{question}" not in PROMPTS.get(opts.prompt_template, opts.prompt_template):
        raise PackError(
            f"--prompt-template {opts.prompt_template!r} has no {{question}}: every prompt would be that text alone; "
            f"put {{question}} where the question goes (e.g. 'Q: {{question}}\\nA:'), or name one of chat, "
            f"{', '.join(sorted(PROMPTS))}"
        )
    for flag, ratio in (
        ("--add-system-ratio", opts.add_system_ratio),
        ("--drop-empty-think-ratio", opts.drop_empty_think_ratio),
    ):
        if not 0.0 <= ratio <= 1.0:
            raise PackError(f"{flag} {ratio} is not a probability between 0 and 1")
    if document_end_id(tok) is None:
        raise PackError(
            f"{name} has neither <|endoftext|> nor an EOS token (tokenizer_config.json's eos_token) to end every "
            "packed record with: train the tokenizer with --special-token '<|endoftext|>' (the default set has it) "
            "or import GPT-2 style files with `cookmind tokenizer import --special-token '<|endoftext|>' ...`, "
            "or name a Hugging Face tokenizer's EOS in its tokenizer_config.json"
        )
    chat = opts.train_type in ("sft", "dpo") or (opts.train_type == "grpo" and opts.prompt_template == "chat")
    own_template = getattr(getattr(tok, "hf", None), "chat_template", None)  # a Hugging Face tokenizer's renders chats
    if chat and not own_template and (tok.im_start_id is None or tok.im_end_id is None):
        raise PackError(
            f"{name} has no <|im_start|>/<|im_end|> tokens, which cookmind's ChatML template needs for "
            f"{opts.train_type}, and no chat template of its own: `cookmind tokenizer train` with the default "
            "--special-token set, or add them to GPT-2 style files with `cookmind tokenizer import --vocab "
            "vocab.json --merges merges.txt --special-token '<|endoftext|>' '<|im_start|>' '<|im_end|>'`, "
            "or give a Hugging Face tokenizer its model's chat template (tokenizer_config.json's chat_template), "
            "or pack the data as --train-type seq"
            + (", or give grpo prompts a --prompt-template with {question}" if opts.train_type == "grpo" else "")
        )


def _count_records(inputs, separator, one_per_line: bool, utf8_errors: str, progress: bool) -> int:
    """How many records the inputs hold (``--val-fraction`` splits by that count): a pass over them, with a bar of
    its own, not minutes of silence before the pack's."""
    total = sum(estimate_items(p, separator, one_per_line) for p in inputs) if progress else None
    count = 0
    with progress_bar(desc="pack: counting records", unit="doc", total=total, enabled=progress) as bar:
        for p in inputs:  # a disabled bar counts nothing: the count is kept here
            if source_kind(p) == "parquet":  # its footer says
                n = count_items(p, separator, one_per_line, utf8_errors)
                count += n
                bar.update(n)
            else:
                for _ in iter_items(p, separator, one_per_line, utf8_errors):
                    count += 1
                    bar.update()
    return count


def pack(
    inputs,
    out,
    tokenizer,
    train_type: str,
    storage_type: str = "bin",
    text_field: str | None = None,
    skip_bad: bool = False,
    workers: int = 0,
    shard_tokens: int = 100_000_000,
    overwrite: bool = False,
    separator: str | None = None,
    one_per_line: bool = False,
    prompt_template: str | None = None,
    add_system_ratio: float = 0.0,
    drop_empty_think_ratio: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    val_fraction: float | None = None,
    val_out=None,
    utf8_errors: str = "strict",
    skipped: SkippedRecords | None = None,
    split_turns: bool = False,
) -> dict:
    """Pack ``inputs`` into a ``train_type`` store at ``out``; return the store's ``meta.json`` dict.

    ``tokenizer`` is a tokenizer directory (loaded with ``Tokenizer.load``) or a tokenizer
    object. ``workers`` > 1 tokenizes in that many processes. ``val_fraction`` > 0 holds that share of the records
    out for a validation store at ``val_out``: round(share x records) of them, at least one and never all, chosen
    from ``seed`` by their places in the input (the same split with any number of workers); both stores' meta.json
    say how they were split. With ``skip_bad``, bad lines draw places too (a line is known bad only once parsed and
    tokenized), so the count held out can differ from the count asked; meta.json's split gives both. Each store's
    meta.json counts what fell to it: its records by source, the bad lines skipped and the empty documents left out
    in its places (the two stores' counts add up to the input's). ``skipped``, when given, gets every bad line
    skipped, both stores' together (the command reports the totals from it).
    ``utf8_errors="replace"`` reads bad UTF-8 bytes as U+FFFD (as ``tokenizer train
    --utf8-errors replace`` does); "strict" makes them an error naming file:line (a bad JSON line, with ``skip_bad``,
    is skipped and counted). ``text_field`` (default "text"), ``separator`` (default ``<|endoftext|>``) and
    ``prompt_template`` (default "chat") are None when not given: a given one the pack would not read is refused.
    ``split_turns`` (sft): each assistant turn of a chat its own record, the chat before it rendered as the prompt
    it answers at inference; meta.json's pack.split_turns says how many chats became how many records.
    """
    if utf8_errors not in ("strict", "replace"):
        raise PackError(f"--utf8-errors {utf8_errors!r}: choose strict or replace")
    if val_fraction and not 0 < val_fraction < 1:
        raise PackError(f"--val-fraction {val_fraction}: give a share between 0 and 1 (e.g. 0.01)")
    if val_fraction == 0 and val_out is not None:  # both given, the share nothing (None: not given)
        raise PackError(
            f"--val-fraction 0 holds nothing out for --val-out {val_out}: give a share between 0 and 1 (e.g. 0.01), "
            "or leave both out"
        )
    if bool(val_fraction) != (val_out is not None):
        raise PackError("--val-fraction and --val-out go together: the share of records to hold out, and its store")
    if val_fraction and train_type == "grpo":  # the store it wrote was one `cookmind train` then refused
        raise PackError(
            f"--val-fraction {val_fraction}: a grpo run takes no validation store (`cookmind train` refuses "
            "--val-data for grpo); its held-out check is grpo.eval_problems=FILE, a JSON lines file of problems: split "
            "the held-out problems off into a file of their own, pack the rest without --val-fraction, and pass that "
            "file to train as grpo.eval_problems=FILE"
        )
    if val_out is not None and Path(val_out).resolve() == Path(out).resolve():
        raise PackError(f"--val-out {val_out} is --out; give the validation store its own folder")
    if val_out is not None:
        a, b = Path(val_out).resolve(), Path(out).resolve()
        if a.is_relative_to(b) or b.is_relative_to(a):  # a store holds only its own files: the second would be refused
            raise PackError(
                f"--val-out {val_out} and --out {out}: one store inside the other; give them sibling folders "
                "(e.g. data/train and data/val)"
            )
    from cookmind.run_layout import refuse_output_in_checkpoints

    for flag, target in (("--out", out), ("--val-out", val_out)):  # where training would prune or replace it
        if target is not None:
            refuse_output_in_checkpoints(target, flag, PackError)
    inputs = [Path(p) for p in inputs]
    for p in inputs:
        if refusal := text_input.pipe_refusal(p, "pack reads each input more than once (its kind, then its items)"):
            raise PackError(refusal)
        if not p.is_file():
            raise FileNotFoundError(f"input {p} does not exist")
        for flag, target in (("--out", out), ("--val-out", val_out)):
            if target is not None and p.resolve().is_relative_to(Path(target).resolve()):
                raise PackError(
                    f"input {p} lies inside {flag} {target}, which packing replaces; write the store elsewhere"
                )
    given = {
        "--text-field": text_field is not None,
        "--separator": separator is not None,
        "--one-per-line": one_per_line,
        "--add-system-ratio": add_system_ratio > 0,
        "--drop-empty-think-ratio": drop_empty_think_ratio > 0,
        "--prompt-template": prompt_template is not None,
        "--split-turns": split_turns,
    }
    _check_flags_apply(train_type, given, inputs, separator, one_per_line)
    _check_inputs_hold_records(train_type, inputs)
    text_field = "text" if text_field is None else text_field
    separator = "<|endoftext|>" if separator is None else separator
    prompt_template = "chat" if prompt_template is None else prompt_template
    opts = RecordOptions(
        train_type, text_field, prompt_template, add_system_ratio, drop_empty_think_ratio, seed, split_turns
    )
    tok = _load_tokenizer(tokenizer)
    _check_options(opts, tok, tokenizer)
    if isinstance(tokenizer, (str, Path)):
        from cookmind.tokenizer.hf_format import transformers_differences

        for difference in transformers_differences(tokenizer, tok, packing=True):
            warnings.warn(difference, stacklevel=2)  # a Hugging Face model's own tokenizer: packed otherwise
    framing = document_framing(tok)  # a training run checks its tokenizer frames documents the same
    tok_meta = {
        "fingerprint": tok.fingerprint(),
        "vocab_size": int(tok.vocab_size),
        "eos_id": int(framing["eos_id"]),
        "bos_ids": [int(i) for i in framing["bos_ids"]],
        "pad_id": int(tok.pad_id),
    }
    if isinstance(tokenizer, (str, Path)):
        tok_meta["path"] = str(Path(tokenizer).resolve())
    for target in (out, val_out):  # before the inputs are read through to count them: a refusal costs nothing
        if target is not None:
            check_store_out(target, overwrite)
    try:
        to_read = _count_records(inputs, separator, one_per_line, utf8_errors, progress) if val_out is not None else 0
    except ValueError as exc:
        raise _with_utf8_hint(exc) from None
    if val_out is not None and to_read < 2:
        raise PackError(
            f"--val-fraction {val_fraction}: the input holds {to_read} record{'' if to_read == 1 else 's'}, and a "
            "split needs at least 2 (one for each store); pack more records or leave --val-fraction out"
            + (
                " (a plain text file is one record per --separator; --one-per-line makes each line one)"
                if train_type == "seq" and not one_per_line and any(source_kind(p) == "text" for p in inputs)
                else ""
            )
        )
    to_hold = min(max(round(val_fraction * to_read), 1), to_read - 1) if val_out is not None else 0
    # a grpo store holds problems (online) or scored responses (offline): with skip_bad the input's rarer kind is
    # left out and counted, as a bad line is. Which kind that is is known once every record is read: each kind is
    # written to a store of its own meanwhile, and the rarer one's thrown away (no val store: grpo takes none)
    by_kind = _KindSkips() if train_type == "grpo" and skip_bad else None
    replaced = text_input.Utf8Replaced()  # bytes read as U+FFFD (--utf8-errors replace): counted, warned of
    items = itertools.chain.from_iterable(_items(p, separator, one_per_line, utf8_errors, replaced) for p in inputs)
    chunks = _chunks(items, CHUNK)

    # by store ("train", "val"): what fell to each, its meta.json's counts (a bad line or an empty document drew a
    # place too, so each is counted in the store whose place it drew, once)
    per_source = {"train": Counter(), "val": Counter()}
    skipped_in = {"train": SkippedRecords(), "val": SkippedRecords()}
    empty = Counter()
    skipped = SkippedRecords() if skipped is None else skipped  # both stores' together
    writer = StoreWriter(
        out, train_type, tok_meta["vocab_size"], storage_type, shard_tokens, overwrite, meta={"tokenizer": tok_meta}
    )
    writers = [writer]  # each aborted on an error
    offline_writer = None  # by_kind's offline records, beside writer's online ones
    if by_kind is not None:
        offline_writer = StoreWriter(
            out,
            train_type,
            tok_meta["vocab_size"],
            storage_type,
            shard_tokens,
            overwrite,
            {"tokenizer": tok_meta},
            part="offline",
        )
        writers.append(offline_writer)
        offline_source = Counter()  # per_source["train"] of the offline records
    val_writer = None
    if val_out is not None:
        val_writer = StoreWriter(
            val_out, train_type, tok_meta["vocab_size"], storage_type, shard_tokens, overwrite, {"tokenizer": tok_meta}
        )
        writers.append(val_writer)
    held_out = random.Random(f"{seed}:val")
    per_store = Counter()
    chats = Counter()  # by store: the items whose turns became records (split_turns), each one place in the split
    pool = None
    start = time.perf_counter()
    total = (to_read or sum(estimate_items(p, separator, one_per_line) for p in inputs)) if progress else None
    # a bar on a terminal, plain lines in a pipe or a log (cookmind.progress)
    bar = progress_bar(desc=f"pack {train_type}", unit="doc", total=total, enabled=progress, dynamic_ncols=True)
    try:
        if workers > 1:
            pool = pool_context().Pool(workers, initializer=_init_pool_worker, initargs=(tokenizer, opts))
            results = pool.imap(_encode_chunk, chunks)
        else:
            _init_worker(tok, opts)
            results = map(_encode_chunk, chunks)
        for chunk in results:
            for source, at, record, reason in chunk:
                into = writer
                # selection sampling: P(held out) = still to hold / still to read, so exactly to_hold are; a bad line
                # draws too, so which records are held out depends only on their places in the input
                if val_writer is not None:
                    if held_out.random() * to_read < to_hold:
                        into, to_hold = val_writer, to_hold - 1
                    to_read -= 1
                store = "val" if into is val_writer else "train"
                if by_kind is not None:
                    if reason is not None:
                        by_kind.bad(reason_kind(reason), f"{at}: {reason}")
                        continue
                    offline = "responses" in record
                    by_kind.good(offline, at)
                    (offline_writer if offline else writer).add(record)
                    (offline_source if offline else per_source["train"])[source] += 1
                    continue
                if reason is not None:
                    where = f"{at}: {reason}"
                    if not skip_bad:
                        utf8 = ", or --utf8-errors replace to read bad bytes as U+FFFD" * reason.startswith(
                            "invalid UTF-8"
                        )
                        raise PackError(f"{where}; fix the line, or pass --skip-bad to skip and count bad lines{utf8}")
                    skipped.add(reason_kind(reason), where)
                    skipped_in[store].add(reason_kind(reason), where)
                    continue
                if isinstance(record, str) and record == EMPTY:
                    empty[store] += 1
                    continue
                records = record if isinstance(record, list) else [record]  # a chat's turns (split_turns)
                try:
                    for one in records:
                        into.add(one)
                except ValueError as exc:
                    mixed = train_type == "grpo" and "a grpo store holds one kind" in str(exc)
                    hint = ", or pass --skip-bad to keep the input's more common kind and skip and count the other"
                    raise PackError(f"{at}: {exc}{hint * mixed}") from None
                chats[store] += 1
                per_source[store][source] += len(records)
                per_store[store] += len(records)
            bar.update(len(chunk))
            elapsed = time.perf_counter() - start
            written = sum(w.num_tokens + w._buf_tokens for w in writers)
            bar.set_postfix_str(f"{written / max(elapsed, 1e-9):,.0f} tok/s")
        seconds = time.perf_counter() - start
        if by_kind is not None:  # keep the more common kind's store; the other kind's records were skipped
            keep_offline = by_kind.keep_offline()
            (writer if keep_offline else offline_writer).abort()
            if keep_offline:
                writer, per_source["train"] = offline_writer, offline_source
            skipped_in["train"] = by_kind.skipped(keep_offline)
            for kind, n in skipped_in["train"].by_reason.items():  # the caller's, given empty: as added one by one
                skipped.by_reason[kind] += n
            skipped.examples.extend(skipped_in["train"].examples[: SkippedRecords.MAX_EXAMPLES - len(skipped.examples)])
        meta = {
            "sources": [{"path": str(p), "records": per_source["train"].get(str(p), 0)} for p in inputs],
            "skipped": skipped_in["train"].as_meta(),
            "empty_records": empty["train"],  # documents with empty text: nothing to learn, left out
            "pack": {
                "seconds": round(seconds, 3),
                "workers": workers,
                "text_field": text_field,
                "prompt_template": prompt_template,
                "add_system_ratio": add_system_ratio,
                "drop_empty_think_ratio": drop_empty_think_ratio,
                "seed": seed,
                "utf8_errors": utf8_errors,
                **({"invalid_utf8": replaced.as_meta()} if utf8_errors == "replace" else {}),
                **({"split_turns": {"chats": chats.total(), "records": per_store.total()}} if split_turns else {}),
            },
        }
        if note := text_input.bad_utf8_note(replaced, "input file(s)", "pack again to keep their characters"):
            warnings.warn(f"pack: {note}", stacklevel=2)
        if writer.keys is None and skipped.count:  # the writer's own message would not say why nothing was kept
            raise PackError(f"no records to write to {out}: every one was bad; {skipped.summary()}")
        if writer.keys is None and empty.total():
            raise PackError(
                f"no records to write to {out}: every one had empty text ({empty.total()}); check --text-field"
            )
        if val_writer is not None:
            if not per_store["val"] or not per_store["train"]:  # a store of no records: say which way to move
                kept, total = per_store["val"], per_store["val"] + per_store["train"]
                raise PackError(
                    f"--val-fraction {val_fraction} held out {'none' if not kept else 'all'} of the {total} records; "
                    f"{'raise' if not kept else 'lower'} it"
                )
            # bad lines and empty documents drew places too (they are known only once parsed and tokenized; counting
            # the good records first would cost a second full parse), so say how many were asked of the records kept
            places = chats if split_turns else per_store  # a chat's turns go to one store together
            kept = places["val"] + places["train"]
            asked = min(max(round(val_fraction * kept), 1), kept - 1)
            split = {"val_fraction": val_fraction, "seed": seed, "train_out": str(out), "val_out": str(val_out)}
            split.update(train_records=per_store["train"], val_records=per_store["val"])
            if split_turns:
                split.update(train_chats=chats["train"], val_chats=chats["val"], val_chats_asked=asked)
            else:
                split["val_records_asked"] = asked
            meta["split"] = split
            val_meta = {
                **meta,
                "sources": [{"path": str(p), "records": per_source["val"].get(str(p), 0)} for p in inputs],
                "skipped": skipped_in["val"].as_meta(),
                "empty_records": empty["val"],
            }
            val_writer.finish({**val_meta, "role": "validation"})
        writer.finish(meta)  # the training store's last shard may be large: both stores whole before either moves
        if val_writer is not None:
            val_writer.commit()
        writer.commit()
        bar.total = bar.n  # the estimate counted lines; show the true end
        bar.refresh()
    except BaseException:
        for w in writers:
            w.abort()
        raise
    finally:
        bar.close()
        if pool is not None:
            stop_pool(pool)
    return json.loads((Path(out) / "meta.json").read_text(encoding="utf-8"))
