"""`cookmind tokenizer train|encode|decode|export|import|info`: train, use and convert byte-level BPE tokenizers."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from cookmind import text_input
from cookmind.atomic import building_dir, check_output_file, check_replaceable, write_text, writing
from cookmind.cli import say
from cookmind.run_layout import refuse_output_in_checkpoints
from cookmind.tokenizer.chat_template import DEFAULT_SPECIAL_TOKENS, ENDOFTEXT
from cookmind.tokenizer.errors import TokenizerError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Build the nested subcommands."""
    from cookmind.cli import float_in, int_in

    sub = parser.add_subparsers(dest="action", metavar="<action>", required=True)

    t = sub.add_parser("train", help="learn a byte-level BPE from UTF-8 text, JSON lines or Parquet files")
    t.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="the inputs `cookmind pack` reads: UTF-8 text, JSON lines / JSON / Parquet (the --text-field "
        "of each record), any of them gzipped, or a `cookmind curate run` output folder",
    )
    t.add_argument(
        "--text-field",
        default=None,
        help="JSON/Parquet field holding a document's text (default text, as curate writes); a record without "
        "it that holds a chat, a preference pair or an RL problem (what pack --train-type sft/dpo/grpo reads) is "
        "learned from each message's, prompt's and answer's text",
    )
    t.add_argument(
        "--separator",
        default=None,
        help="document separator in plain text files, as pack's (default <|endoftext|>): no merge crosses one",
    )
    t.add_argument("--one-per-line", action="store_true", help="plain text: one document per line, as pack's")
    t.add_argument("--vocab-size", type=int, required=True, help="final vocabulary size (bytes + specials + merges)")
    t.add_argument(
        "--special-token",
        nargs="*",
        default=None,
        metavar="TOK",
        help=f"special tokens kept whole, ids 256.. in this order; {ENDOFTEXT}, which pack ends documents with, is "
        f"added after them when missing (default: {' '.join(DEFAULT_SPECIAL_TOKENS)})",
    )
    t.add_argument("--pattern", default="gpt2", help="pre-tokenization regex: gpt2, gpt4 or a regex (default gpt2)")
    t.add_argument("--out", required=True, help="output directory (our JSON + Hugging Face files)")
    t.add_argument("--workers", type=int_in(1), default=None, help="processes for pre-tokenization (default: all CPUs)")
    t.add_argument(
        "--chunk-mb", type=float_in(0, above=True), default=4.0, help="work unit per process in MB (default 4)"
    )
    t.add_argument(
        "--utf8-errors",
        choices=["strict", "replace"],
        default="strict",
        help="non-UTF-8 bytes: strict = error naming file:line (default); replace = read as U+FFFD",
    )
    t.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out bad JSON/Parquet records (invalid JSON, a missing or non-text field, bad UTF-8) and "
        "report how many, as `pack --skip-bad` does (default: the first is an error naming file:line)",
    )
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a tokenizer already at --out (only a folder holding nothing but tokenizer files)",
    )
    t.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (a bar on a terminal; in a pipe or a log, a plain line now and then, as pack's)",
    )

    e = sub.add_parser("encode", help="text -> token ids")
    e.add_argument("--tokenizer", required=True, help="tokenizer directory")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to encode")
    src.add_argument(
        "--input",
        help="UTF-8 file to encode, streamed with a cookmind tokenizer; a tokenizer read through transformers encodes "
        "it whole, in memory (its ids depend on the whole text: blocks would give others)",
    )
    e.add_argument(
        "--output", "--out", help="write ids here: .bin = raw little-endian uint32, else text; default stdout"
    )
    e.add_argument("--overwrite", action="store_true", help="replace a file already at --output")
    e.add_argument("--reference", action="store_true", help="use the pure-Python reference encoder")

    d = sub.add_parser("decode", help="token ids -> text")
    d.add_argument("--tokenizer", required=True, help="tokenizer directory")
    d.add_argument("ids", nargs="*", type=int, help="the ids to decode (or --input)")
    d.add_argument(
        "--input",
        help="a file of ids, as encode --output writes them: .bin = raw little-endian uint32, else the ids as text",
    )
    d.add_argument(
        "--output",
        "--out",
        help="write the bytes the ids stand for here, exactly (encode then decode gives the file back; a tokenizer "
        "read through transformers: the UTF-8 of its decoded text); default: print the text",
    )
    d.add_argument("--overwrite", action="store_true", help="replace a file already at --output")
    d.add_argument(
        "--raw",
        action="store_true",
        help="print the text exactly as decoded. By default its control characters but newline and tab (\\x1b, "
        "\\r) and the bidirectional controls (\\u202e) are printed escaped, as generate prints a model's text: "
        "ids a model generated can spell an ESC that drives the terminal",
    )

    x = sub.add_parser("export", help="write the tokenizer in another format")
    x.add_argument("--tokenizer", required=True, help="tokenizer directory")
    x.add_argument("--out", required=True, help="output directory (made if missing)")
    x.add_argument(
        "--format",
        choices=["hf", "tiktoken", "gpt2"],
        default="hf",
        help="hf: tokenizer.json + tokenizer_config.json; tiktoken: ranks file; gpt2: vocab.json + merges.txt",
    )
    x.add_argument("--overwrite", action="store_true", help="replace files of these names already in --out")

    i = sub.add_parser("import", help="import GPT-2 vocab.json + merges.txt, or a byte-level tokenizer.json")
    i.add_argument("--vocab", help="GPT-2 style vocab.json (with --merges)")
    i.add_argument("--merges", help="GPT-2 style merges.txt (with --vocab)")
    i.add_argument("--tokenizer-json", help="a Hugging Face byte-level BPE tokenizer.json")
    i.add_argument(
        "--special-token",
        nargs="*",
        default=None,
        metavar="TOK",
        help="--vocab/--merges: the vocabulary's special tokens, kept whole (default: every vocab.json entry that is "
        "neither a byte nor made by a merge, in id order: GPT-2's <|endoftext|>, or all five of a cookmind tokenizer "
        "exported with --format gpt2). A tokenizer.json names its own",
    )
    i.add_argument(
        "--pattern",
        default=None,
        help="--vocab/--merges: pre-tokenization regex: gpt2 (default), gpt4 or a regex (tokenizer.json: its own)",
    )
    i.add_argument("--out", required=True, help="output tokenizer directory")
    i.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a tokenizer already at --out (only a folder holding nothing but tokenizer files)",
    )

    n = sub.add_parser(
        "info",
        help="print vocabulary size, specials, fingerprint and the ids that open and end a document "
        "(bos_ids, eos_id: what a token store records and training checks)",
    )
    n.add_argument("--tokenizer", required=True, help="tokenizer directory")


# What Tokenizer.save writes: a folder holding only these is a tokenizer that --overwrite may replace.
SAVED_FILES = frozenset({"cookmind_tokenizer.json", "tokenizer.json", "tokenizer_config.json"})


def is_saved_tokenizer(path: Path) -> bool:
    """Whether ``path`` is a folder that ``Tokenizer.save`` made (our files and nothing else)."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return "cookmind_tokenizer.json" in names and names <= SAVED_FILES


def _has_tokenizer(path: Path) -> bool:
    """Whether ``path`` holds our tokenizer file; ``SAVED_FILES`` says whether it holds anything else."""
    return (Path(path) / "cookmind_tokenizer.json").is_file()


# what --overwrite may replace: a folder holding our tokenizer and none but SAVED_FILES (the first other one named)
_REPLACEABLE = {"is_ours": _has_tokenizer, "what": "tokenizer folder", "own_file": SAVED_FILES.__contains__}


def check_out(out: Path, overwrite: bool, inputs=()) -> None:
    """Refuse an --out that holds anything but an empty folder, unless --overwrite and it is one of our tokenizers,
    or that lies in a run's checkpoints folder."""
    refuse_output_in_checkpoints(out, "--out", TokenizerError)
    for p in inputs:
        if p and Path(p).resolve().is_relative_to(out.resolve()):
            raise TokenizerError(f"input {p} lies inside --out {out}, which would be replaced; choose another --out")
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    try:
        check_replaceable(out, overwrite, **_REPLACEABLE)
    except FileExistsError as exc:
        raise TokenizerError(str(exc)) from None


def _save_new(tok, out: Path, overwrite: bool) -> None:
    """Save into a fresh temporary directory, then rename it into place: no half-written tokenizer."""
    check_out(out, overwrite)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # an empty folder the user made for us
    with building_dir(out, replace=overwrite, **_REPLACEABLE) as tmp:
        tok.save(tmp)


def _check_text_flags(args) -> None:
    """Refuse --separator or --one-per-line where they would be ignored, as pack does."""
    from cookmind.store.sources import expand_inputs, source_kind

    if args.one_per_line and args.separator is not None:
        raise TokenizerError("--one-per-line and --separator both say where documents end: give one")
    if (args.one_per_line or args.separator is not None) and not any(
        source_kind(p) == "text" for p in expand_inputs(args.input)
    ):
        flag = "--one-per-line" if args.one_per_line else "--separator"
        raise TokenizerError(
            f"{flag} says where a plain text file's documents end, and no input is plain text (JSON lines, JSON "
            "and Parquet hold one document a record): drop it"
        )


def _train(args) -> int:
    from cookmind.store.records import SkippedRecords
    from cookmind.tokenizer.bpe_train import check_specials, train_bpe
    from cookmind.tokenizer.pretokenize import ReadCounts
    from cookmind.tokenizer.tokenizer import Tokenizer

    specials = check_specials(DEFAULT_SPECIAL_TOKENS if args.special_token is None else args.special_token)
    if ENDOFTEXT not in specials:  # pack ends every document with it and refuses a tokenizer without one
        specials.append(ENDOFTEXT)  # after the user's: their ids stay as asked
        say(
            "cookmind tokenizer train",
            None,
            f"added {ENDOFTEXT} (id {255 + len(specials)}) to the --special-token set: cookmind pack ends every "
            "document with it",
        )
    least = 256 + len(specials)
    if args.vocab_size < least:  # said here by its flag: train_bpe's own refusal names its vocab_size argument
        raise TokenizerError(
            f"--vocab-size {args.vocab_size} is too small: the 256 byte tokens and {len(specials)} special tokens "
            f"already take {least} ids; pass --vocab-size {least} or more"
        )
    out = Path(args.out)
    check_out(out, args.overwrite, args.input)  # before the (long) training
    if args.text_field is not None:
        from cookmind.store.sources import check_text_field_applies, expand_inputs

        check_text_field_applies(expand_inputs(args.input))
    _check_text_flags(args)
    t0 = time.perf_counter()
    skipped = SkippedRecords() if args.skip_bad else None
    read = ReadCounts()
    vocab, merges = train_bpe(
        args.input,
        args.vocab_size,
        specials,
        pattern=args.pattern,
        workers=args.workers,
        chunk_bytes=int(args.chunk_mb * (1 << 20)),
        utf8_errors=args.utf8_errors,
        text_field=args.text_field or "text",
        skipped=skipped,
        read=read,
        progress=not args.quiet,
        separator=ENDOFTEXT if args.separator is None else args.separator,
        one_per_line=args.one_per_line,
    )
    tok = Tokenizer(vocab, merges, specials, args.pattern)
    _save_new(tok, out, args.overwrite)
    print(
        json.dumps(
            {
                "out": str(out),
                "vocab_size": tok.vocab_size,
                "merges": len(merges),
                "specials": tok.special_tokens,
                "seconds": round(time.perf_counter() - t0, 3),
                "fingerprint": tok.fingerprint(),
                "read": read.as_dict(),
                **({"skipped": skipped.count} if skipped is not None else {}),
            }
        )
    )
    if read.chat_records:
        say(
            "cookmind tokenizer train",
            None,
            f"{read.chat_records:,} record(s) held a chat, a preference pair or an RL problem, not a "
            f"{args.text_field or 'text'!r} field: learned from their messages', prompts' and answers' text, each "
            "its own document (read.chat_records)",
        )
    if skipped is not None and skipped.count:
        say("cookmind tokenizer train", None, skipped.summary())  # names the first bad record's file
    if read.lone_surrogates:
        say(
            "cookmind tokenizer train",
            "warning",
            f"{read.lone_surrogates:,} lone surrogate(s) in the records' text (JSON escapes such as \\ud800, no "
            "character) were learned as U+FFFD, as encode and pack read them (read.lone_surrogates)",
        )
    if tok.vocab_size < args.vocab_size:
        say(
            "cookmind tokenizer train",
            "warning",
            f"the corpus ran out of pairs to merge at {tok.vocab_size} tokens, short of --vocab-size "
            f"{args.vocab_size}: the tokenizer written has {tok.vocab_size}; train on more text for a larger one",
        )
    return 0


def _read_stream(path: str):
    """Yield the file's lines (newlines kept) with a progress bar in bytes."""
    from cookmind.progress import progress_bar

    if Path(path).is_dir():
        raise TokenizerError(f"input {path} is a directory; name the text file to encode")
    if not text_input.readable_as_file(path):  # a pipe (--input <(zcat ...)) is read like a file: it is read once
        raise TokenizerError(f"input file {path} does not exist")
    size = Path(path).stat().st_size if Path(path).is_file() else None  # a pipe's size is unknown
    with (
        open(path, encoding="utf-8-sig", newline="") as f,  # -sig: a leading byte-order mark is no text
        progress_bar(total=size, unit="B", unit_scale=True, desc="encode", leave=False) as bar,
    ):
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):  # noqa: B007 - the except below names the line
                bar.update(len(line.encode("utf-8")))
                yield line
        except UnicodeDecodeError:
            from cookmind.tokenizer.pretokenize import first_bad_utf8

            offset, line = first_bad_utf8(path) or (-1, lineno + 1)
            raise TokenizerError(
                f"{path}:{line}: byte offset {offset} is not valid UTF-8; "
                "convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
            ) from None


def _encode(args) -> int:
    import numpy as np

    from cookmind.tokenizer.hf_adapter import load_tokenizer
    from cookmind.tokenizer.tokenizer import Tokenizer, tokenizer_files

    if args.output:  # the tokenizer's files are inputs too: ids written over one destroy it
        inputs = ([args.input] if args.input else []) + tokenizer_files(args.tokenizer)
        check_output_file(args.output, inputs, args.overwrite, "--output")
    tok = load_tokenizer(args.tokenizer)  # what pack, generate and eval read: a SentencePiece one through transformers
    if args.reference and isinstance(tok, Tokenizer):
        tok._fast, tok._fast_checked = None, True
    t0 = time.perf_counter()
    source = [args.text] if args.text is not None else _read_stream(args.input)
    if not isinstance(tok, Tokenizer):  # transformers encodes the whole text, as pack hands it a whole record
        tok = _WholeText(tok)
    n = 0
    if args.output and args.output.endswith(".bin"):
        with writing(args.output, "wb") as f:
            buf: list[int] = []
            for i in tok.encode_iterable(source):
                buf.append(i)
                if len(buf) >= 1 << 20:
                    f.write(np.asarray(buf, dtype="<u4").tobytes())
                    n += len(buf)
                    buf = []
            f.write(np.asarray(buf, dtype="<u4").tobytes())
            n += len(buf)
    else:
        ids = list(tok.encode_iterable(source))
        n = len(ids)
        text = " ".join(map(str, ids)) + "\n"
        if args.output:
            write_text(args.output, text)
        else:
            sys.stdout.write(text)
    print(json.dumps({"tokens": n, "seconds": round(time.perf_counter() - t0, 3)}), file=sys.stderr)
    return 0


class _WholeText:
    """A transformers-read tokenizer's encode_iterable: the chunks joined and encoded at once. Such a tokenizer (Llama
    2's SentencePiece kind) has no pre-tokenizer and puts a "▁" before the text's start: its merges can span a line's
    end and a block's start reads as a text's, so no cut is known to keep the whole text's ids (the help says so)."""

    def __init__(self, tok):
        self.tok = tok

    def encode_iterable(self, chunks):
        return iter(self.tok.encode("".join(chunks)))


def _read_ids(path: str) -> list[int]:
    """The ids of a file encode --output wrote: a .bin of little-endian uint32, else the ids as text."""
    import numpy as np

    if Path(path).is_dir() or not text_input.readable_as_file(path):
        raise TokenizerError(f"input {path} {'is a directory' if Path(path).is_dir() else 'does not exist'}")
    if path.endswith(".bin"):
        data = Path(path).read_bytes()
        if len(data) % 4:
            raise TokenizerError(f"{path}: {len(data)} bytes, not a whole number of uint32 ids (4 bytes each)")
        return np.frombuffer(data, dtype="<u4").tolist()
    try:
        words = Path(path).read_text(encoding="utf-8").split()
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not text of token ids (nor a .bin of them)") from None
    bad = next((w for w in words if not w.isascii() or not w.isdigit()), None)
    if bad is not None:
        raise TokenizerError(f"{path}: {bad!r} is not a token id; give the ids encode wrote (a .bin, or text of ids)")
    return [int(w) for w in words]


def _decode(args) -> int:
    from cookmind.terminal import escape_controls
    from cookmind.tokenizer.hf_adapter import load_tokenizer
    from cookmind.tokenizer.tokenizer import tokenizer_files

    if args.input is not None and args.ids:
        raise TokenizerError("give the ids as arguments or --input, not both")
    if args.input is None and not args.ids:
        raise TokenizerError("give the ids to decode as arguments, or --input FILE (what encode --output wrote)")
    if args.output:  # the tokenizer's files and the ids are inputs too
        inputs = ([args.input] if args.input else []) + tokenizer_files(args.tokenizer)
        try:
            check_output_file(args.output, inputs, args.overwrite, "--output")
        except (OSError, ValueError) as exc:
            raise TokenizerError(str(exc)) from None
    tok = load_tokenizer(args.tokenizer)  # as encode reads it: a SentencePiece one through transformers
    ids = _read_ids(args.input) if args.input is not None else args.ids
    data = tok.decode_bytes(ids)  # the bytes themselves: a file cut inside a character comes back as it was
    if args.output:
        with writing(args.output, "wb") as f:
            f.write(data)
        print(json.dumps({"tokens": len(ids), "bytes": len(data)}), file=sys.stderr)
        return 0
    text = data.decode("utf-8", errors="replace")  # Tokenizer.decode
    sys.stdout.write((text if args.raw else escape_controls(text)) + "\n")
    return 0


def _export(args) -> int:
    from cookmind.tokenizer.bytes_unicode import token_to_str
    from cookmind.tokenizer.fast_encode import fast_path_blocker, tiktoken_file_text
    from cookmind.tokenizer.hf_adapter import load_tokenizer
    from cookmind.tokenizer.hf_format import hf_tokenizer_config, hf_tokenizer_json
    from cookmind.tokenizer.tokenizer import Tokenizer, tokenizer_files

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TokenizerError(f"--out {out} is a file; export writes its files into a folder: name a folder")
    refuse_output_in_checkpoints(out, "--out", TokenizerError)  # into a checkpoint: its own tokenizer replaced
    tok = load_tokenizer(args.tokenizer)  # as info, encode and decode read it
    if not isinstance(tok, Tokenizer):
        raise TokenizerError(
            f"{args.tokenizer}: a tokenizer cookmind reads through transformers (not a byte-level BPE), which export "
            f"cannot write as --format {args.format}; its tokenizer.json is already Hugging Face's format: copy its "
            "files as they are"
        )
    if args.format == "hf":
        files = {
            "tokenizer.json": json.dumps(hf_tokenizer_json(tok), ensure_ascii=False),
            "tokenizer_config.json": json.dumps(hf_tokenizer_config(tok), ensure_ascii=False, indent=2),
        }
    elif args.format == "tiktoken":
        if (why := fast_path_blocker(tok)) is not None:  # tiktoken would read the file to other ids
            raise TokenizerError(
                f"--tokenizer {args.tokenizer} cannot be exported for tiktoken, which would encode with other ids "
                f"({why}); export it with --format hf (tokenizer.json) instead"
            )
        files = {
            "tokenizer.tiktoken": tiktoken_file_text(tok),
            "tiktoken_config.json": json.dumps(
                {"pat_str": tok.pattern, "special_tokens": tok.special_tokens}, ensure_ascii=False, indent=2
            ),
        }
    else:
        vocab = {}
        for i in sorted(tok.vocab):
            vocab.setdefault(
                tok.vocab[i].decode("utf-8") if i in tok.special_tokens.values() else token_to_str(tok.vocab[i]), i
            )
        files = {
            "vocab.json": json.dumps(vocab, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "".join(f"{token_to_str(a)} {token_to_str(b)}\n" for a, b in tok.merges),
        }
    read = [p for p in tokenizer_files(args.tokenizer) for name in files if _same_file(out / name, p)]
    if read:  # even with --overwrite: the export would replace the tokenizer it was made from
        raise TokenizerError(
            f"--out {out}: writing {read[0].name} would replace that file of the tokenizer it exports "
            f"(--tokenizer {args.tokenizer}), even with --overwrite; choose another --out"
        )
    taken = [name for name in files if (out / name).exists()]
    if taken and not args.overwrite:
        raise TokenizerError(f"{out} already holds {', '.join(taken)}; pass --overwrite to replace them")
    for name, text in files.items():
        write_text(out / name, text)
    print(json.dumps({"out": str(out), "format": args.format, "files": sorted(files)}))
    return 0


def _same_file(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and os.path.samefile(a, b)


def _import(args) -> int:
    from cookmind.tokenizer.hf_format import load_gpt2_files, load_hf_tokenizer_json

    if args.tokenizer_json:
        # what a tokenizer.json holds itself: a flag for it would be passed over, another tokenizer than asked for
        for flag, given in (
            ("--vocab", args.vocab),
            ("--merges", args.merges),
            ("--special-token", args.special_token),
            ("--pattern", args.pattern),
        ):
            if given is not None:
                raise TokenizerError(
                    f"{flag} is for --vocab/--merges; a --tokenizer-json names its own vocabulary, merges, special "
                    f"tokens and pattern: drop {flag}"
                )
        tok = load_hf_tokenizer_json(args.tokenizer_json)
    elif args.vocab and args.merges:
        tok = load_gpt2_files(args.vocab, args.merges, args.special_token, args.pattern or "gpt2")
    elif args.vocab or args.merges:
        given, missing = ("--vocab", "--merges") if args.vocab else ("--merges", "--vocab")
        raise TokenizerError(f"{given} needs {missing} beside it (GPT-2's vocab.json and merges.txt)")
    else:
        raise TokenizerError("pass --vocab and --merges, or --tokenizer-json")
    check_out(Path(args.out), args.overwrite, (args.vocab, args.merges, args.tokenizer_json))
    _save_new(tok, Path(args.out), args.overwrite)
    print(
        json.dumps(
            {
                "out": args.out,
                "vocab_size": tok.vocab_size,
                "merges": len(tok.merges),
                "special_tokens": tok.special_tokens,
                "fingerprint": tok.fingerprint(),
            }
        )
    )
    return 0


def main(args) -> int:
    """Run one tokenizer action; bad input prints a one-line error and returns 2."""
    from cookmind.tokenizer.tokenizer import Tokenizer

    try:
        if args.action == "train":
            return _train(args)
        if args.action == "encode":
            return _encode(args)
        if args.action == "decode":
            return _decode(args)
        if args.action == "export":
            return _export(args)
        if args.action == "import":
            return _import(args)
        from cookmind.tokenizer.documents import document_framing
        from cookmind.tokenizer.hf_adapter import load_tokenizer

        tok = load_tokenizer(args.tokenizer)  # what pack, generate and eval read: a SentencePiece one too
        # machine output for a terminal, as train's, import's and export's lines are: json's default ensure_ascii
        # writes every non-ASCII character as \uXXXX (JSON escapes only the C0 controls itself), so a special
        # token's bidi override (U+202E) or C1 CSI (U+009B) cannot reorder or drive what the terminal shows; the
        # line parses back to the same strings
        print(
            json.dumps(
                {
                    "vocab_size": tok.vocab_size,
                    "merges": len(tok.merges) if isinstance(tok, Tokenizer) else None,  # transformers': its own
                    "pattern": tok.pattern if isinstance(tok, Tokenizer) else None,
                    "special_tokens": tok.special_tokens,
                    "fingerprint": tok.fingerprint(),
                    **document_framing(tok),
                    "fast_path": isinstance(tok, Tokenizer) and tok.fast_encoding is not None,
                },
            )
        )
        return 0
    except TokenizerError as exc:
        say(f"cookmind tokenizer {args.action}", "error", exc)
        return 2
