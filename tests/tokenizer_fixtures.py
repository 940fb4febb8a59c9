"""Shared pieces of the tokenizer tests: `cookmind tokenizer` run in this process, a tokenizer saved to a folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from cookmind.tokenizer import Tokenizer
from cookmind.tokenizer.cli import add_arguments, main

# Words in several scripts, digits, contractions, an emoji and whitespace runs: random texts for the codec tests.
MULTILINGUAL_WORDS = [
    "the",
    "cat",
    "naïve",
    "café",
    "Straße",
    "日本語",
    "テキスト",
    "русский",
    "язык",
    "مرحبا",
    "123",
    "4567",
    "it's",
    "we'll",
    "I'M",
    "😀",
    "ok!",
    "--",
    "\t",
    "  ",
]


def run_cli(argv: list[str]) -> int:
    """`cookmind tokenizer ARGV` in this process (its parser and main); the exit code."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return main(parser.parse_args(argv))


def save_tokenizer(tok: Tokenizer, folder: Path) -> Path:
    """``tok`` saved in ``folder``; the folder, for a ``--tokenizer`` argument."""
    tok.save(folder)
    return folder
