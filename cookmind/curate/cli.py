"""`cookmind curate ...`: run the pipeline, train a classifier, make the synthetic crawl, dedup files."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
from pathlib import Path

from cookmind.terminal import show


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Subcommands: run, train-classifier, crawl, dedup, default-config, demo."""
    from cookmind.cli import float_in, int_in

    sub = parser.add_subparsers(dest="curate_command", metavar="<command>", required=True)

    p = sub.add_parser("run", help="run the curation pipeline over input shards")
    p.add_argument("--config", type=Path, help="YAML config (stages, output_format, workers); default: built-in")
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="HTML, WARC/WET, JSON lines or a JSON array (.jsonl, .json, .ndjson), Parquet or .txt files (HTML, "
        "JSON and text gzipped too: .gz), "
        "or folders of them (a folder leaves out, and counts, its other files: .md, .json, images, ...; a file "
        "named on its own is read by its suffix: .json as JSON records, one it does not know as text); a text file "
        "is one document, or, holding <|endoftext|>, the documents between those, as pack reads it",
    )
    p.add_argument("--output", "--out", type=Path, required=True, help="output folder (shards + report.md/json)")
    p.add_argument(
        "--text-field",
        default=None,
        help="JSON/Parquet: the field holding a record's text, as pack's --text-field (default: the config's "
        "text_field, text; a record without it is read by its html field, else removed as no_text); the output "
        "writes it as text, the field pack reads",
    )
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local: a process pool (default); ray: Ray tasks, the same output",
    )
    p.add_argument(
        "--workers",
        type=int_in(1),
        default=None,
        help="local processes (or local Ray CPUs), each curating one shard at a time: a shard is one WARC, JSONL or "
        "Parquet file, or up to 256 HTML/text files (default: the config's workers, 1)",
    )
    p.add_argument("--ray-address", default=None, help="address of a running Ray cluster (default: start a local one)")
    p.add_argument(
        "--format",
        dest="output_format",
        choices=["jsonl.gz", "jsonl", "parquet"],
        default=None,
        help="output shards' format (default: the config's output_format, jsonl.gz)",
    )
    p.add_argument(
        "--removed",
        action="store_true",
        help="also write each shard's removed documents to OUTPUT/removed/: id, stage, reason, source, then the "
        "document's fields as they were when removed (text, lang, lang_score, ...)",
    )
    p.add_argument("--restart", action="store_true", help="discard finished shards in --output and start over")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("train-classifier", help="train a fastText-style classifier from labelled JSONL")
    p.add_argument("--input", nargs="+", required=True, help="JSONL(.gz) with a text (or html) and a label field")
    p.add_argument("--output", "--out", type=Path, required=True, help="model file (.npz)")
    p.add_argument("--overwrite", action="store_true", help="replace a file already at --output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--text-field", default="text", help="the record's text (default text)")
    p.add_argument("--label-field", default="label", help="the record's label, a string (default label)")
    p.add_argument("--html-field", default="html", help="used (through extract) when a record has no text field")
    p.add_argument("--dim", type=int_in(1), default=16, help="embedding width (default 16)")
    p.add_argument("--bucket", type=int_in(1), default=1 << 16, help="hashed feature rows (model size = bucket * dim)")
    p.add_argument("--word-ngrams", type=int_in(1), default=2, help="word n-gram features up to N (default 2)")
    p.add_argument("--epoch", type=int_in(1), default=10, help="passes over the data (default 10)")
    p.add_argument("--lr", type=float_in(0, above=True), default=1.0, help="learning rate (default 1.0, fastText's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the held-out split (default 0)")
    p.add_argument(
        "--valid-fraction",
        type=float_in(0, 1, below=True),
        default=0.1,
        help="share held out to report accuracy (default 0.1)",
    )

    p = sub.add_parser("crawl", help="write the seeded synthetic web crawl (and labelled pages for a classifier)")
    p.add_argument("--output", "--out", type=Path, required=True, help="a new or empty folder for the crawl's shards")
    p.add_argument("--num-pages", type=int_in(1), default=600, help="pages to write (default 600)")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same crawl (default 0)")
    p.add_argument("--shards", type=int_in(1), default=4, help="crawl-NNNNN.jsonl.gz files (default 4)")
    p.add_argument("--labelled", type=Path, default=None, help="also write labelled JSONL (good vs spam) here")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a crawl already in --output, whole (and an existing --labelled); a folder holding other "
        "files is refused",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars (the pages made, then written); the manifest is printed",
    )

    p = sub.add_parser("dedup", help="exact-line dedup of text files, or MinHash dedup of whole files")
    p.add_argument(
        "--method",
        choices=["lines", "minhash"],
        required=True,
        help="lines: drop every line that occurs more than once in the corpus (all its copies), keeping blank and "
        "<|endoftext|> separator lines, but a story whose every line goes takes one separator with it (counted as "
        "documents_emptied); minhash: keep one of each group of near-duplicate files, each file compared whole as "
        "one document (the stories of a file with <|endoftext|> lines are not compared one by one)",
    )
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="text files (gzipped too; distinct file names): a file is one document, or, holding <|endoftext|> "
        "lines, the documents between those (lines keeps the separators between the stories it keeps; minhash "
        "compares the file whole); JSONL, Parquet and WARC records are refused: curate run's dedup stages read them",
    )
    p.add_argument(
        "--output",
        "--out",
        type=Path,
        required=True,
        help="a new or empty folder for the kept files, under their own names",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier curate dedup's --output folder whole")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--num-hashes", type=int_in(1), default=128, help="minhash: hashes a document (default 128)")
    p.add_argument("--num-bands", type=int_in(1), default=16, help="minhash: LSH bands (default 16)")
    p.add_argument("--ngrams", type=int_in(1), default=5, help="minhash: word n-gram shingles (default 5)")
    p.add_argument(
        "--jaccard-threshold",
        type=float_in(0, 1, above=True),
        default=0.8,
        help="minhash: near-duplicates at or above this similarity (default 0.8)",
    )

    sub.add_parser("default-config", help="print the built-in pipeline config as YAML")

    p = sub.add_parser("demo", help="synthetic crawl -> curated text, with the report")
    p.add_argument(
        "--workdir",
        type=Path,
        required=True,
        help="a new or empty folder, or an earlier curate demo's, whose own output a rerun replaces",
    )
    p.add_argument("--num-pages", type=int_in(1), default=600, help="pages of the synthetic crawl (default 600)")
    p.add_argument("--seed", type=int, default=0, help="crawl seed (default 0)")
    p.add_argument("--workers", type=int_in(1), default=1, help="processes for the pipeline (default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (as curate run's)")


def main(args: argparse.Namespace) -> int:
    """Dispatch to the subcommand; errors in input are printed as one clear line."""
    try:
        return _COMMANDS[args.curate_command](args)
    except (ValueError, FileNotFoundError) as exc:
        from cookmind.cli import os_error_line, say

        said = os_error_line(exc) if isinstance(exc, OSError) else exc  # a sentence, not "[Errno 2] ..."
        say(f"cookmind curate {args.curate_command}", "error", said)
        return 2


def _run(args) -> int:
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import run_pipeline

    cfg = CurateConfig.from_yaml(args.config) if args.config else CurateConfig()
    if args.output_format:
        cfg.output_format = args.output_format
    if args.removed:
        cfg.removed = True
    if args.text_field is not None:
        cfg = CurateConfig.from_dict({**dataclasses.asdict(cfg), "text_field": args.text_field}, "--text-field")
    result = run_pipeline(
        cfg,
        args.input,
        args.output,
        executor=args.executor,
        workers=args.workers,
        ray_address=args.ray_address,
        restart=args.restart,
        progress=not args.quiet,
    )
    show(result.report_md.read_text(), one_line=False)  # the file keeps the text as it is; the terminal, escaped
    show(
        f"{len(result.outputs)} shards in {args.output} ({result.tasks_run} tasks run, "
        f"{result.tasks_skipped} already done); report: {result.report_md}"
        + (f"; removed documents: {result.removed}" if result.removed else "")
    )
    return 0


def _train_classifier(args) -> int:
    import numpy as np

    from cookmind.atomic import check_output_file
    from cookmind.curate.classifier import ClassifierConfig, train_classifier
    from cookmind.curate.extract import extract_text
    from cookmind.curate.shards import iter_located, place

    check_output_file(args.output, args.input, args.overwrite, "--output")
    records = []
    for path in args.input:
        for rec, where in iter_located(path):
            if args.text_field not in rec and isinstance(rec.get(args.html_field), str):
                rec = {args.text_field: extract_text(rec[args.html_field]) or "", **rec}
            if args.text_field not in rec or args.label_field not in rec:
                raise ValueError(
                    f"{place(where)}: the record lacks {args.text_field!r} (or {args.html_field!r}) "
                    f"or {args.label_field!r}; its keys are {sorted(rec)}"
                )
            if not isinstance(rec[args.text_field], str):
                raise ValueError(
                    f"{place(where)}: field {args.text_field!r} must be a string, got "
                    f"{type(rec[args.text_field]).__name__}; fix the record or leave it out"
                )
            records.append({"text": rec[args.text_field], "label": str(rec[args.label_field])})
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(records))
    n_valid = int(len(records) * args.valid_fraction)
    valid = [records[i] for i in order[:n_valid]]
    train = [records[i] for i in order[n_valid:]]
    cfg = ClassifierConfig(
        dim=args.dim, bucket=args.bucket, word_ngrams=args.word_ngrams, epoch=args.epoch, lr=args.lr, seed=args.seed
    )
    model = train_classifier(train, cfg=cfg, progress=not args.quiet)
    path = model.save(args.output)
    summary = {"model": str(path), "labels": model.labels, "train": len(train), "valid": len(valid)}
    if valid:
        probs = model.predict_proba([r["text"] for r in valid])
        pred = [model.labels[k] for k in probs.argmax(axis=1)]
        summary["valid_accuracy"] = round(sum(p == r["label"] for p, r in zip(pred, valid)) / len(valid), 4)
    print(json.dumps(summary))
    return 0


def _crawl(args) -> int:
    from cookmind.atomic import check_output_file
    from cookmind.synthetic.crawl import labelled_pages, write_crawl

    if args.labelled:  # checked before the crawl is written
        check_output_file(args.labelled, [], args.overwrite, "--labelled")
    manifest = write_crawl(
        args.output, args.num_pages, args.seed, args.shards, replace=args.overwrite, progress=not args.quiet
    )
    if args.labelled:
        from cookmind.curate.shards import write_shard

        write_shard(labelled_pages(args.num_pages, seed=args.seed + 1000), args.labelled)
    print(json.dumps(manifest))
    return 0


def _dedup(args) -> int:
    from collections import Counter

    from cookmind.curate.dedup_output import dedup_record

    # each input is written to --output under its own file name: two inputs of one name would overwrite each other
    clashes = sorted(name for name, n in Counter(Path(p).name for p in args.input).items() if n > 1)
    if clashes:
        raise ValueError(
            f"inputs share the file name(s) {', '.join(clashes)}, and each is written to --output under its name; "
            "give files of distinct names"
        )
    from cookmind.curate.shards import kind_of

    for p in args.input:  # before the progress bar and any work, as the error handler words it
        if not Path(p).exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(p))
        if (kind := kind_of(Path(p))) in ("jsonl", "parquet", "warc"):  # records: their lines are no text's lines
            raise ValueError(
                f"--input {p}: {kind.upper()} records, which curate dedup would read as plain text (a JSON line as a "
                "line of text); to deduplicate records as documents, run `cookmind curate run --input FILES --config "
                "CFG` with the minhash or exact_lines stage (`cookmind curate default-config` lists them)"
            )
    if args.method == "lines":
        from cookmind.curate.exact_lines import exact_line_dedup

        written = exact_line_dedup(args.input, args.output, overwrite=args.overwrite, progress=not args.quiet)
    else:
        from cookmind.curate.minhash import minhash_dedup

        written = minhash_dedup(
            args.input,
            args.num_hashes,
            args.num_bands,
            args.ngrams,
            args.jaccard_threshold,
            args.output,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
    counts = {k: v for k, v in dedup_record(args.output).items() if k not in ("method", "files")}
    print(json.dumps({"input_files": len(args.input), "written": len(written), **counts, "output": str(args.output)}))
    return 0


def _default_config(args) -> int:
    import yaml

    from cookmind.curate.config import CurateConfig

    cfg = CurateConfig()
    print(
        yaml.safe_dump(
            {"stages": cfg.stages, "output_format": cfg.output_format, "workers": cfg.workers}, sort_keys=False
        ),
        end="",
    )
    print(DECONTAMINATE_HELP, end="")
    return 0


# Printed under the default config: the optional stages a user adds by hand, with their options.
DECONTAMINATE_HELP = """\
# Optional stages (add them to `stages:` above):
# - decontaminate:        # drop documents sharing a word 13-gram with an eval set (GSM8K, MMLU, any JSONL/CSV)
#     eval_sets: {gsm8k: data/gsm8k/test.jsonl, mmlu: data/mmlu/test}
#     ngram: 13           # n-gram length in lower-case words (punctuation and spacing ignored)
#     min_matches: 1      # distinct shared n-grams that make a document contaminated
# - quality: {model: quality.npz, threshold: 0.5}   # from `cookmind curate train-classifier`
# gopher takes each rule's bound as an option (the paper's by default); the rules measure prose and remove many
# code-heavy docs pages (the report notes it); to keep those, e.g.:
# - gopher: {max_dup_line_ratio: 0.6, max_dup_line_char_ratio: 0.5, min_alpha_words_ratio: 0.6,
#            max_dup_ngram_char_ratio: {5: 0.4, 6: 0.4, 7: 0.4, 8: 0.4, 9: 0.4, 10: 0.4}}
# JSON/Parquet records whose text is in another field than text (as pack's --text-field; or curate run --text-field):
# text_field: body
"""


def _demo(args) -> int:
    from cookmind.demo.curate import demo_stage
    from cookmind.demo.workdir import DemoWorkdir

    workdir = DemoWorkdir(args.workdir, "curate demo")
    workdir.claim()  # a folder holding anything the demo did not write is refused before any work
    workdir.record(running="curate")
    out = demo_stage(
        args.workdir, seed=args.seed, num_pages=args.num_pages, workers=args.workers, progress=not args.quiet
    )
    workdir.record()
    show(Path(out["report_md"]).read_text(), one_line=False)
    show(
        f"clean text: {out['text_path']} ({out['docs_out']} documents, {out['bytes_out'] / 1e3:.0f} kB, "
        f"{out['seconds']} s)"
    )
    return 0


_COMMANDS = {
    "run": _run,
    "train-classifier": _train_classifier,
    "crawl": _crawl,
    "dedup": _dedup,
    "default-config": _default_config,
    "demo": _demo,
}
