"""`cookmind eval {gsm8k,mmlu,ppl}`: accuracy on GSM8K / MMLU, perplexity and bits per byte."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cookmind.device import DEVICE_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Subcommands gsm8k, mmlu and ppl, each taking --model (CookMind checkpoint or HF folder) or MODEL."""
    from cookmind.cli import SEED, add_model_argument, float_in, int_in

    sub = parser.add_subparsers(dest="task", required=True, metavar="{gsm8k,mmlu,ppl}")

    def common(p):
        add_model_argument(p)
        p.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model dir)")
        p.add_argument("--device", default=None, help=DEVICE_HELP)
        p.add_argument(
            "--out",
            default=None,
            help="write the per-item JSONL here (ppl: one line per window), the metrics JSON beside it",
        )
        p.add_argument("--overwrite", action="store_true", help="replace an --out (and its metrics JSON) already there")
        p.add_argument("--quiet", action="store_true", help="no progress bar")

    g = sub.add_parser("gsm8k", help="GSM8K accuracy, greedy or sampled, with pass@k")
    common(g)
    g.add_argument(
        "--data",
        required=True,
        help="GSM8K-shaped JSONL, one {question, answer ending in '#### N'} a line (e.g. GSM8K's test.jsonl)",
    )
    g.add_argument("--limit", type=int_in(1), default=None, help="first N problems of --data only")
    g.add_argument(
        "--template",
        default="r1_zero",
        help="r1_zero | compact | plain (graded by <answer> tags or the last number) | chat (the "
        "tokenizer's chat template, for a model SFT'd on chats; graded by '#### N') | a string "
        "with {question}, where \\n is a new line, \\t a tab and \\\\ a backslash (default r1_zero)",
    )
    g.add_argument("--num-samples", type=int_in(1), default=1, help="answers per problem (> 1 needs --temperature > 0)")
    g.add_argument("--k", type=int_in(1), nargs="+", default=[1], help="pass@k values to report")
    g.add_argument("--temperature", type=float_in(0), default=0.0, help="0 = greedy (default)")
    g.add_argument("--max-new-tokens", type=int_in(1), default=256, help="answer length cap (default 256)")
    g.add_argument("--batch-size", type=int_in(1), default=32, help="problems generated together (default 32)")
    g.add_argument(
        "--seed",
        type=SEED,
        default=0,
        help="sampling seed (default 0); each batch of problems draws from its own generator, so the same --seed and "
        "--batch-size give the same samples (another --batch-size, others)",
    )

    m = sub.add_parser("mmlu", help="MMLU accuracy per subject and macro-averaged")
    common(m)
    m.add_argument(
        "--data", required=True, help="MMLU root: its dev/, val/ and test/ folders of SUBJECT_SPLIT.csv files"
    )
    m.add_argument("--split", default="test", choices=["dev", "val", "test"], help="default test")
    m.add_argument("--subjects", nargs="+", default=None, help="subject names (e.g. anatomy); default all found")
    m.add_argument(  # --limit too: what gsm8k calls it, and lm-evaluation-harness's per-task limit (a subject a task)
        "--limit-per-subject",
        "--limit",
        dest="limit_per_subject",
        metavar="N",
        type=int_in(1),
        default=None,
        help="first N questions of each subject (--limit is the same option)",
    )
    m.add_argument(
        "--scoring",
        default="letter",
        choices=["letter", "option", "generate"],
        help="letter: the likeliest of ' A'..' D' after the prompt (default); option: the likeliest option text, "
        "per token; generate: greedy text, the letter read from it. Every question is asked zero-shot (no worked "
        "examples before it; published MMLU figures are mostly 5-shot, from the dev split)",
    )
    m.add_argument("--batch-size", type=int_in(1), default=8, help="questions scored together (default 8)")
    m.add_argument(
        "--max-new-tokens",
        type=int_in(1),
        default=None,
        help="--scoring generate: answer length cap (default 16; raise it for a model that reasons before its letter)",
    )

    p = sub.add_parser("ppl", help="perplexity and bits per byte on text, documents or a token store")
    common(p)
    p.add_argument(
        "--data",
        required=True,
        help="what `cookmind pack --input` reads: a UTF-8 text file (<|endoftext|> separates documents; or "
        "--separator, --one-per-line), JSON lines "
        "(.jsonl) or Parquet documents (their --text-field, each ended as pack ends it: by <|endoftext|>, else the "
        "tokenizer's EOS), optionally .gz, "
        "or a curate output folder (its shard-* files); or a token store made by pack (a folder with meta.json, .h5)",
    )
    p.add_argument(
        "--text-field", default=None, help="JSON lines / Parquet: the field holding a document's text (default text)"
    )
    p.add_argument(
        "--window",
        type=int_in(1),
        default=None,
        help="tokens per window (default: the model's context; more than that is an error)",
    )
    p.add_argument(
        "--stride",
        type=int_in(1),
        default=None,
        help="text and documents: tokens from one window's start to the next (default: the window; less scores each "
        "token with more context, and runs more windows)",
    )
    p.add_argument(
        "--max-bytes",
        type=int_in(1),
        default=None,
        help="text and documents: evaluate only the first N bytes of their text",
    )
    p.add_argument("--max-windows", type=int_in(1), default=None, help="stores: evaluate only the first N windows")
    p.add_argument(
        "--separator",
        default=None,
        help="plain text: the document separator, as pack's (default <|endoftext|>): each document is ended by the "
        "end token pack puts there",
    )
    p.add_argument("--one-per-line", action="store_true", help="plain text: one document a line, as pack's")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="JSON lines / Parquet: leave bad records out and report how many, as `pack --skip-bad` does (default: "
        "the first is an error naming file:line)",
    )


def main(args) -> int:
    """Run the chosen evaluation, print its metrics as one JSON object, optionally save them."""
    from cookmind.atomic import check_output_file, write_json, write_jsonl
    from cookmind.cli import say
    from cookmind.device import resolve_device
    from cookmind.infer.loading import load_for_inference
    from cookmind.run_layout import refuse_output_in_checkpoints

    if args.out:  # before the model loads: an --out that names the data (or a file of yours) is refused
        out = Path(args.out)
        read = _folders_read(args)
        _refuse_out_in(out, read, args.task)
        refuse_output_in_checkpoints(out, "--out")  # an older checkpoint's folder: pruned with it
        inputs = [args.data] + ([args.tokenizer] if args.tokenizer else [])  # a tokenizer.json given as a file
        check_output_file(out, inputs, args.overwrite)  # first the file the user named, then the one beside it
        metrics_file = out.with_suffix(".metrics.json")
        try:
            _refuse_out_in(metrics_file, read, args.task)
            check_output_file(metrics_file, inputs, args.overwrite)
        except (FileExistsError, IsADirectoryError, ValueError) as exc:  # named as the file beside --out
            if isinstance(exc, FileExistsError):
                why = "already exists; choose another --out or pass --overwrite"
            elif isinstance(exc, IsADirectoryError):
                why = "is a directory; choose another --out"
            else:
                why = str(exc).removeprefix(f"--out {metrics_file} ")
            raise type(exc)(f"--out {out}: the metrics file beside it, {metrics_file}, {why}") from None
    device = str(resolve_device(args.device))  # the checkpoint's dtype: scores as trained, on either device
    # the flags and the data before the model: a wrong one is said at once, not after a model has loaded
    questions_read: list[dict] = []
    if args.task == "gsm8k":
        from cookmind.evals.gsm8k import check_options, load_gsm8k
        from cookmind.prompt_templates import template_escapes

        args.template = template_escapes(args.template)
        check_options(args.template, args.num_samples, args.k, args.temperature)
        problems = load_gsm8k(args.data, args.limit)
    elif args.task == "mmlu":
        from cookmind.evals.mmlu import load_mmlu

        if args.max_new_tokens is not None and args.scoring != "generate":  # letter/option generate nothing
            raise ValueError("--max-new-tokens is used only with --scoring generate; add that or drop --max-new-tokens")
        rows = load_mmlu(args.data, args.split, args.subjects, args.limit_per_subject)
        questions_read = rows
    else:
        from cookmind.evals.perplexity import require_data

        _check_window(args.window, args.stride, _context_in_config(args.model, not args.quiet))
        require_data(
            args.data,
            args.max_bytes,
            args.max_windows,
            args.stride,
            args.text_field,
            args.skip_bad,
            args.separator,
            args.one_per_line,
        )
    progress = not args.quiet
    model, tokenizer = load_for_inference(
        args.model, device, tokenizer_path=args.tokenizer, hf_native=True, progress=progress
    )
    if args.task == "gsm8k":
        from cookmind.evals.gsm8k import evaluate_gsm8k

        metrics = evaluate_gsm8k(
            model,
            tokenizer,
            problems,
            args.out,
            args.template,
            args.num_samples,
            tuple(args.k),
            args.temperature,
            args.max_new_tokens,
            args.seed,
            args.batch_size,
            progress=progress,
        )
    elif args.task == "mmlu":
        from cookmind.evals.mmlu import evaluate_mmlu

        new_tokens = {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}
        metrics = evaluate_mmlu(
            model, tokenizer, rows, args.scoring, args.out, args.batch_size, progress=progress, **new_tokens
        )
    else:
        from cookmind.evals.gsm8k import context_length
        from cookmind.evals.perplexity import evaluate_data
        from cookmind.store.records import SkippedRecords

        given_window = args.window
        args.window = args.window or context_length(model) or 256
        _check_window(given_window, args.stride, context_length(model), args.window)  # a context config.json hid
        rows = []
        metrics = evaluate_data(
            model,
            tokenizer,
            args.data,
            args.window,
            args.stride,
            args.max_bytes,
            args.max_windows,
            args.text_field or "text",
            progress,
            rows,
            SkippedRecords() if args.skip_bad else None,
            args.separator,
            args.one_per_line,
        )
        # the window it scored with: train's validation reads data.window_size, this the model's context by default
        metrics.update(window_size=args.window, stride=args.stride or args.window)
        _say_what_was_left_out(args, metrics)
        if args.out:
            write_jsonl(args.out, rows)
    # "data" names the evaluated data in every eval's metrics: perplexity's own report calls it "path"
    metrics = {**_what_was_measured(args, questions_read), **{k: v for k, v in metrics.items() if k != "path"}}
    _say_what_limit_left_out(args, metrics)
    skipped = metrics.get("num_skipped_too_long", 0)
    if skipped:
        total = skipped + metrics.get("num_problems", metrics.get("num_questions", 0))
        print(
            f"cookmind eval {args.task}: skipped {skipped} of {total} items whose prompt does not fit the model's "
            f"context of {metrics['context']} tokens (num_skipped_too_long; not in the accuracy)",
            file=sys.stderr,
        )
    by_context = metrics.get("num_cut_by_context", 0)
    by_limit = metrics.get("num_cut_short", 0) - by_context
    if by_limit:
        print(
            f"cookmind eval {args.task}: {by_limit} answer(s) ran into --max-new-tokens {args.max_new_tokens} before "
            "they ended (num_cut_short) and were graded as cut; raise --max-new-tokens to let them end",
            file=sys.stderr,
        )
    if by_context:  # a larger --max-new-tokens changes nothing for these: the context is the model's
        print(
            f"cookmind eval {args.task}: {by_context} answer(s) ran into the end of the model's context of "
            f"{metrics['context']} tokens (num_cut_by_context) and were graded as cut; no --max-new-tokens lets them "
            "end: use a model with a longer context, or a shorter --template (compact, plain)",
            file=sys.stderr,
        )
    answers = metrics.get("num_problems", 0) * metrics.get("num_samples", 1)
    # every answer cut short: the lines above say why none ended in the format
    if args.task == "gsm8k" and metrics["format_rate"] == 0 and metrics["num_cut_short"] < answers:
        _say_no_answer_in_format(args, answers)
    if metrics.get("num_no_letter"):
        print(
            f"cookmind eval {args.task}: {metrics['num_no_letter']} of {metrics['num_questions']} answers named no "
            "letter A-D that could be read (num_no_letter) and were graded wrong (an --out record's no_letter says "
            "which); --scoring letter scores each question by its likeliest letter instead",
            file=sys.stderr,
        )
    if metrics.get("subjects_empty"):
        empty = metrics["subjects_empty"]
        say(  # the subjects are named by the user's CSV files
            f"cookmind eval {args.task}",
            None,
            f"{len(empty)} subject file(s) held no question ({', '.join(empty[:5])}{', ...' if len(empty) > 5 else ''}"
            f"): not in per_subject nor macro_accuracy (subjects_empty)",
        )
    if metrics.get("subjects_not_scored"):
        lost = metrics["subjects_not_scored"]
        say(  # the subjects are named by the user's CSV files
            f"cookmind eval {args.task}",
            None,
            f"{len(lost)} subjects had no question that fits ({', '.join(lost[:5])}"
            f"{', ...' if len(lost) > 5 else ''}): macro_accuracy is over the other {metrics['num_subjects']}",
        )
    print(json.dumps(metrics))
    if args.out:
        write_json(Path(args.out).with_suffix(".metrics.json"), metrics)
    return 0


def _what_was_measured(args, questions_read: list[dict]) -> dict:
    """What the metrics are of: the task, the model and data as given (``data`` for every task), and the settings that
    chose and graded the items; with a --limit that left some out, how many the data holds; MMLU's subjects whose CSV
    held no question (``questions_read``: the rows load_mmlu read). A metrics file read later says what it is."""
    measured = {"task": args.task, "model": args.model}
    checkpoint = _checkpoint_of(args.model, progress=not args.quiet)
    if checkpoint is not None:  # a run scored its newest checkpoint: which one, once the run trains on
        measured["checkpoint"] = checkpoint
    if args.tokenizer:
        measured["tokenizer"] = args.tokenizer
    if args.task == "gsm8k":
        measured.update(
            data=args.data,
            template=args.template,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            batch_size=args.batch_size,  # with the seed, what decides sampled answers
            limit=args.limit,
        )
        if args.limit is not None:
            from cookmind.evals.gsm8k import count_records

            measured["num_problems_in_data"] = count_records(args.data)
    elif args.task == "mmlu":
        from cookmind.evals.mmlu import count_questions, subjects_in

        subjects = subjects_in(args.data, args.split, args.subjects)
        measured.update(data=args.data, split=args.split, subjects=subjects, limit_per_subject=args.limit_per_subject)
        if args.limit_per_subject is not None:
            measured["num_questions_in_data"] = count_questions(args.data, args.split, subjects)
        read = {row["subject"] for row in questions_read}
        empty = [s for s in subjects if s not in read]  # a CSV with no rows: in no score, not even as skipped
        if empty:
            measured["subjects_empty"] = empty
    else:  # ppl: the window and stride it scored with follow, from the run
        measured.update(
            data=args.data,
            text_field=args.text_field,
            max_bytes=args.max_bytes,
            max_windows=args.max_windows,
            skip_bad=args.skip_bad,
            separator=args.separator,
            one_per_line=args.one_per_line,
        )
    return measured


def _say_no_answer_in_format(args, answers: int) -> None:
    """One line on stderr when no GSM8K answer was in the template's format: each was graded wrong, and a 0 read as
    the model's skill is most often a model taught another format (a chat model under the default r1_zero)."""
    from cookmind.align.prompts import PROMPTS, uses_think_tags

    template = args.template
    if uses_think_tags(template):
        shape = "<answer>...</answer> tags"
    else:
        shape = "a '#### N' line" if template == "chat" else "a number"
    which = f"--template {template}'s" if template in ("chat", *PROMPTS) else "the --template's"
    print(
        f"cookmind eval gsm8k: none of the {answers} answers was in {which} format (format_rate 0): "
        f"{shape}; each was graded wrong. A model SFT'd on chats (the demo's runs) answers --template chat with "
        "'#### N'; one trained on r1_zero prompts, <answer> tags; a base model, plain",
        file=sys.stderr,
    )


def _checkpoint_of(model, progress: bool = False) -> str | None:
    """The checkpoint folder a training run given as the model resolved to (its newest complete one), or None when
    the model was named as a folder of its own. ``progress``: a bar of the check of its SHA-256s (none when loading
    the model checked them already: a file is hashed once a process)."""
    import warnings

    from cookmind.model import resolve_model_dir

    with warnings.catch_warnings():  # a checkpoint passed over was named when the model loaded
        warnings.simplefilter("ignore")
        found = resolve_model_dir(model, progress=progress)
    return None if os.path.abspath(found) == os.path.abspath(model) else str(found)


def _say_what_limit_left_out(args, metrics: dict) -> None:
    """One line on stderr when --limit left items of the data out (the metrics record how many it holds); of those it
    took, only those the model read count as evaluated (a prompt too long for its context is skipped)."""
    evaluated, skipped = (metrics.get(k, 0) for k in ("num_problems", "num_skipped_too_long"))
    read = f" ({evaluated:,} evaluated, {skipped:,} too long for the context)" if skipped else ""
    if metrics.get("num_problems_in_data") is not None:
        given = evaluated + skipped
        of = metrics["num_problems_in_data"]
        if of > given:
            print(
                f"cookmind eval gsm8k: --limit {args.limit}: took the first {given:,} of {of:,} problems in "
                f"--data{read}; {of - given:,} left out (num_problems_in_data)",
                file=sys.stderr,
            )
    if metrics.get("num_questions_in_data") is not None:
        evaluated = metrics.get("num_questions", 0)
        read = f" ({evaluated:,} evaluated, {skipped:,} too long for the context)" if skipped else ""
        given = evaluated + skipped
        of = metrics["num_questions_in_data"]
        if of > given:
            print(
                f"cookmind eval mmlu: --limit-per-subject {args.limit_per_subject}: took {given:,} of the {of:,} "
                f"questions of the {args.split} split's {len(metrics['subjects'])} subject(s){read}; {of - given:,} "
                "left out (num_questions_in_data)",
                file=sys.stderr,
            )


def _context_in_config(model, progress: bool = False) -> int | None:
    """The model's context (max_position_embeddings) as its config.json says, read before the model loads; None
    when it does not say (the check after loading catches what this misses)."""
    import warnings

    from cookmind.model import resolve_model_dir

    try:
        with warnings.catch_warnings():  # a checkpoint passed over is named when the model loads, not twice
            warnings.simplefilter("ignore")
            found = resolve_model_dir(model, progress=progress)  # its bar: the checkpoint's SHA-256s are checked
            n = json.loads((found / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _check_window(window: int | None, stride: int | None, context: int | None, default: int | None = None) -> None:
    """ValueError naming --window/--stride when the window exceeds the model's context or the stride the window
    (tokens between windows would go unscored). ``window`` is --window as given; without it the window is the
    context (``default`` once the model has loaded)."""
    if window is not None and context is not None and window > context:
        raise ValueError(
            f"--window {window} exceeds the model's context of {context} tokens (positions past it are meaningless); "
            f"use --window {context} or less, or leave --window out (the context)"
        )
    size = window or context or default
    if stride is None or size is None or stride <= size:
        return
    if window is not None:
        longer = f", or --window {stride} or more" if context is None or stride <= context else ""
        raise ValueError(
            f"--stride {stride} is longer than --window {window}: the tokens between windows would go unscored; "
            f"give --stride {window} or less{longer}"
        )
    raise ValueError(
        f"--stride {stride} is longer than the window, {size} tokens (--window's default: the model's context): the "
        f"tokens between windows would go unscored; give --stride {size} or less"
    )


def _folders_read(args) -> list[tuple[Path, str, Path]]:
    """(folder, what it is, where to suggest writing instead) of each folder the command reads files from: the
    model's (a run's newest checkpoint, as the loader takes it), --tokenizer's, and --data when it is a folder."""
    import warnings

    from cookmind.model import resolve_model_dir

    read = []
    with warnings.catch_warnings():  # a checkpoint passed over is named when the model loads, not twice
        warnings.simplefilter("ignore")
        model = resolve_model_dir(args.model, progress=not args.quiet) if args.model else None
    if model is not None and (model / "config.json").is_file():
        beside = model.parent.parent if model.parent.name == "checkpoints" else model.parent  # the run, if any
        read.append((model, "the model folder", beside))
        base = _lora_base(model, progress=not args.quiet)
        if base is not None:  # a sharded LoRA checkpoint's adapter is merged onto its base: read too
            beside = base.parent.parent if base.parent.name == "checkpoints" else base.parent
            read.append((base, "the base model folder of its LoRA adapter (train.init_from)", beside))
    for flag, given in (("--tokenizer", args.tokenizer), ("--data", args.data)):
        if given and Path(given).is_dir():
            read.append((Path(given), f"the {flag} folder", Path(given).parent))
    return read


def _lora_base(model: Path, progress: bool = False) -> Path | None:
    """The base model folder a sharded LoRA checkpoint (its dcp/ holds the adapter only) is merged onto when it
    loads: its meta.json's train.init_from, as the loader resolves it; None for any other model. ``progress``: a bar
    of the check of a base run's newest checkpoint's SHA-256s."""
    import warnings

    from cookmind.model import ModelLoadError, resolve_model_dir
    from cookmind.model.model_io import recorded_lora_base
    from cookmind.model.sharded_layout import is_sharded_checkpoint

    if not is_sharded_checkpoint(model):
        return None
    try:
        _, lora, base = recorded_lora_base(model)
    except ModelLoadError:  # the loader says what is wrong with it
        return None
    if not (lora.get("enabled") and base):
        return None
    with warnings.catch_warnings():  # a checkpoint passed over is named when the model loads, not twice
        warnings.simplefilter("ignore")
        found = resolve_model_dir(base, progress=progress)
    return found if found.is_dir() else None


def _refuse_out_in(out: Path, read: list[tuple[Path, str, Path]], task: str) -> None:
    """ValueError when ``out`` is or lies in a folder the command reads: writing there replaces a file it reads
    (the weights, the tokenizer, a CSV of the data) or adds one it would read next time."""
    where = Path(os.path.abspath(out))
    name = out.name if out.suffix == ".jsonl" else f"{task}.jsonl"  # not model.safetensors, where it points
    for folder, what, beside in read:
        if where.is_relative_to(os.path.abspath(folder)):
            raise ValueError(
                f"--out {out} is in {folder}, {what} this command reads; writing there would replace or add to its "
                f"files; choose an --out outside it, e.g. {beside / name}"
            )


def _share(part: int, whole: int) -> str:
    """part / whole as a percentage that reads 100% (or 0%) only when it is: 132,527 of 133,027 said "(100%)"."""
    share = part / whole
    whole_number = f"{share:.0%}"
    if whole_number not in ("0%", "100%") or part in (0, whole):
        return whole_number
    one_place = f"{share:.1%}"
    return {"0.0%": "<0.1%", "100.0%": ">99.9%"}.get(one_place, one_place)


def _say_what_was_left_out(args, metrics: dict) -> None:
    """--max-bytes / --max-windows, empty documents: print how much of the data the perplexity leaves out (the
    metrics say it too), and how many bad records --skip-bad left out."""
    from collections import Counter

    from cookmind.cli import say
    from cookmind.store.records import SkippedRecords

    if metrics.get("skipped", {}).get("count"):  # names the first bad record's file
        skipped = metrics["skipped"]
        say("cookmind eval ppl", None, SkippedRecords(Counter(skipped["by_reason"]), skipped["examples"]).summary())
    if metrics.get("lone_surrogates"):
        print(
            f"cookmind eval ppl: read {metrics['lone_surrogates']:,} lone surrogate(s) in the records' text (JSON "
            "escapes such as \\ud800, no character) as U+FFFD, as pack stores them (lone_surrogates)",
            file=sys.stderr,
        )
    if metrics.get("empty_documents"):
        print(
            f"cookmind eval ppl: left out {metrics['empty_documents']:,} empty document(s), with no text to score, as "
            "pack leaves them out (empty_documents)",
            file=sys.stderr,
        )
    if metrics.get("bytes_not_evaluated"):
        left, of = metrics["bytes_not_evaluated"], metrics.get("file_bytes", metrics.get("text_bytes"))
        print(
            f"cookmind eval ppl: --max-bytes {args.max_bytes}: evaluated the first {of - left:,} of {of:,} bytes; "
            f"{left:,} bytes ({_share(left, of)}) left out (bytes_not_evaluated)",
            file=sys.stderr,
        )
    if metrics.get("windows_total", 0) > metrics.get("windows", 0):
        done, of = metrics["windows"], metrics["windows_total"]
        print(
            f"cookmind eval ppl: --max-windows {args.max_windows}: evaluated {done:,} of {of:,} windows; "
            f"{of - done:,} windows ({metrics['tokens_not_evaluated']:,} of {metrics['store_tokens']:,} tokens) "
            f"left out (tokens_not_evaluated)",
            file=sys.stderr,
        )
