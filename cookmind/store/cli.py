"""``cookmind pack``: tokenize text, chats, preferences or RL prompts into a token store.

cookmind pack --tokenizer tok/ --train-type seq --input corpus.txt --out data/pretrain
cookmind pack --tokenizer tok/ --train-type grpo --input gsm8k/train.jsonl --out data/gsm8k_rl
cookmind pack --tokenizer tok/ --train-type sft --input gsm8k/train.jsonl --out data/gsm8k_sft --format h5
"""

from __future__ import annotations

import argparse

from cookmind.store.layout import TRAIN_TYPE_KEYS

INPUT_FORMATS = """\
input files: plain text (any other suffix), JSON lines (.jsonl/.json/.ndjson: one object a line; a .json file
may instead hold one JSON array of objects) or Parquet (.parquet: one row an item, columns as the JSON fields);
each may be gzip-compressed (.gz, e.g. the shard-00000.jsonl.gz files of `cookmind curate run`).
A folder stands for its shard-* files (curate's output).

what each --train-type reads (one example line each):
  seq   plain text: documents separated by --separator (default <|endoftext|>), or one a line (--one-per-line)
          Once upon a time there was a cat.<|endoftext|>The next story starts here.
        JSON lines / Parquet: the --text-field (default "text", the field curate writes)
          {"text": "Once upon a time there was a cat."}
        each document is stored as the tokenizer's BOS if it opens every text with one (Llama's <s>), its tokens,
        then <|endoftext|> (a tokenizer without it: its EOS, e.g. </s>)
  sft   a chat as "messages" (or "conversations"), roles system/user/assistant/tool; optional "tools" (a "prompt"
        or "question" beside the chat, as UltraChat's rows carry, must restate a user message: its text, or within it)
          {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
        or question/answer (GSM8K), or prompt/response (or prompt/completion): one user and one assistant turn
          {"question": "What is 2+3?", "answer": "2+3=5\\n#### 5"}
          {"prompt": "Say hi", "response": "Hi!"}
  dpo   a prompt and two answers (strings), or chosen/rejected as whole chats ending with the assistant (a
        "prompt" beside them must be theirs: their first messages, or a user message's text, or within it)
          {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."}
        or TRL's conversational rows: the prompt as messages, each answer as the assistant's messages
          {"prompt": [{"role": "user", "content": "Say hi"}],
           "chosen": [{"role": "assistant", "content": "Hi!"}],
           "rejected": [{"role": "assistant", "content": "Go away."}]}
  grpo  a question (or prompt) and its reference answer (or reference_answer/ground_truth; GSM8K's "#### N" is read)
          {"question": "What is 2+3?", "answer": "#### 5"}
        or an offline rollout with its reward
          {"prompt": "What is 2+3?", "response": "5", "reward": 1.0}
        (a store holds one kind; with --skip-bad an input's less common kind is skipped and counted)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``cookmind pack``; the help's epilog shows every accepted input format."""
    from cookmind.cli import float_in, int_in

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = INPUT_FORMATS
    parser.add_argument(
        "--tokenizer",
        required=True,
        help="tokenizer directory (from `cookmind tokenizer train`, or a Hugging Face model's tokenizer.json: "
        "one that is no byte-level BPE, as Mistral's, is read through transformers)",
    )
    parser.add_argument(
        "--train-type",
        required=True,
        choices=sorted(TRAIN_TYPE_KEYS),
        help="seq: text windows; sft: chats; dpo: preference pairs; grpo: RL prompts",
    )
    parser.add_argument(
        "--input",
        required=True,
        nargs="+",
        metavar="FILE",
        help="text, JSON lines (.jsonl) or Parquet (.parquet) files, optionally .gz; or a curate "
        "output folder (formats below)",
    )
    parser.add_argument("--out", required=True, help="store directory to create")
    parser.add_argument("--format", default="bin", choices=["bin", "h5"], help="store backend (default bin)")
    parser.add_argument(
        "--text-field",
        default=None,
        help="seq: JSON/Parquet field holding a document's text (default text, as curate writes)",
    )
    parser.add_argument(
        "--separator", default=None, help="document separator in plain text files (default <|endoftext|>)"
    )
    parser.add_argument("--one-per-line", action="store_true", help="plain text: one document per line")
    parser.add_argument(
        "--prompt-template",
        default=None,
        help="grpo prompts: 'chat' (the chat template + generation prompt; the default), r1_zero | compact | plain "
        "(grpo.template's named prompts), or a string with {question}, where \\n is a new line, \\t a tab and \\\\ a "
        "backslash",
    )
    parser.add_argument(
        "--add-system-ratio",
        type=float_in(0, 1),
        default=0.0,
        help="sft: probability of adding a system prompt to a chat without one (default 0: none added)",
    )
    parser.add_argument(
        "--drop-empty-think-ratio",
        type=float_in(0, 1),
        default=0.0,
        help="sft: probability of dropping an empty <think></think> block (default 0: kept)",
    )
    parser.add_argument(
        "--split-turns",
        action="store_true",
        help="sft: each assistant turn of a chat its own record, the chat before it rendered as the prompt it "
        "answers at inference (add_generation_prompt), so each turn trains in the context it is generated in; for "
        "chat templates that render earlier turns otherwise once more follow (Qwen3's drops past reasoning)",
    )
    parser.add_argument(
        "--val-fraction",
        type=float_in(0, 1),
        default=None,
        help="hold this share of the records out (e.g. 0.01; round(share x records), at least 1, never all), chosen "
        "with --seed, into a validation store at --val-out (seq, sft, dpo; refused for grpo, which validates on "
        "held-out problems instead: train's grpo.eval_problems=FILE, a JSON lines file)",
    )
    parser.add_argument("--val-out", default=None, help="the validation store's directory (with --val-fraction)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sft augmentation and of --val-fraction")
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip bad lines and count them in meta.json (with --val-fraction: each store those in its places)",
    )
    parser.add_argument(
        "--utf8-errors",
        choices=["strict", "replace"],
        default="strict",
        help="non-UTF-8 bytes: strict = error naming file:line (default; a JSON line's is a bad line); replace = "
        "read as U+FFFD, as `tokenizer train --utf8-errors replace` does",
    )
    parser.add_argument("--workers", type=int_in(0), default=1, help="tokenizer processes (default 1)")
    parser.add_argument("--shard-tokens", type=int_in(1), default=100_000_000, help="tokens per shard (default 1e8)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """Pack, then print a one-line summary; a bad line prints file:line and the reason and returns 1."""
    from cookmind.prompt_templates import template_escapes
    from cookmind.store.layout import StoreError
    from cookmind.store.packer import PackError, pack
    from cookmind.store.records import SkippedRecords
    from cookmind.store.sources import expand_inputs

    skips = SkippedRecords()  # both stores' bad lines: each store's meta.json counts only its own
    try:
        meta = pack(
            expand_inputs(args.input),
            args.out,
            args.tokenizer,
            args.train_type,
            storage_type=args.format,
            text_field=args.text_field,
            skip_bad=args.skip_bad,
            workers=args.workers,
            shard_tokens=args.shard_tokens,
            overwrite=args.overwrite,
            separator=args.separator,
            one_per_line=args.one_per_line,
            prompt_template=None if args.prompt_template is None else template_escapes(args.prompt_template),
            add_system_ratio=args.add_system_ratio,
            drop_empty_think_ratio=args.drop_empty_think_ratio,
            seed=args.seed,
            progress=not args.quiet,
            val_fraction=args.val_fraction,
            val_out=args.val_out,
            utf8_errors=args.utf8_errors,
            skipped=skips,
            split_turns=args.split_turns,
        )
    except (PackError, StoreError, ValueError, OSError) as exc:  # ValueError covers TokenizerError
        from cookmind.cli import os_error_line, say

        say("cookmind pack", "error", os_error_line(exc) if isinstance(exc, OSError) else exc)
        return 2  # bad input, as every stage answers it
    from cookmind.terminal import show

    split = meta.get("split")
    turns = meta["pack"].get("split_turns")
    empty = meta.get("empty_records", 0) + (_meta(args.val_out).get("empty_records", 0) if split else 0)
    show(  # a line for a person (the store's meta.json is the record): it quotes paths and the first bad line's file
        f"packed {meta['num_records']:,} {args.train_type} records, {meta['num_tokens']:,} tokens, "
        f"{len(meta['shards'])} shard(s) -> {args.out} ({meta['format']})"
        + (f" ({turns['chats']:,} chats became {turns['records']:,} records, one an assistant turn)" if turns else "")
        + (
            f"; {split['val_records']:,} held out{_asked(split)} ({_num_tokens(args.val_out):,} tokens) -> "
            f"{args.val_out}"
            if split
            else ""
        )
        + (f"; {skips.summary()}" if skips.count else "")
        + (f"; left out {empty:,} record(s) with empty text (nothing to learn)" if empty else "")
    )
    return 0


def _asked(split: dict) -> str:
    """ ", not the N asked (...)" where bad lines (--skip-bad) or empty documents drew places in the split; else
    nothing."""
    what = "chats" if "val_chats" in split else "records"  # --split-turns: a chat's turns are held out together
    asked = split.get(f"val_{what}_asked", split[f"val_{what}"])
    if asked == split[f"val_{what}"]:
        return ""
    kept = split[f"val_{what}"] + split[f"train_{what}"]
    why = "bad or empty lines drew places"
    return f", not the {asked:,} asked (round({split['val_fraction']} x {kept:,} {what}); {why})"


def _meta(store) -> dict:
    """The meta.json of the store at ``store``."""
    from cookmind.store.layout import META_NAME, read_meta

    return read_meta(f"{store}/{META_NAME}")


def _num_tokens(store) -> int:
    """The tokens of the store at ``store`` (its meta.json's count)."""
    return int(_meta(store)["num_tokens"])
