"""Shared pieces of the tokenizer tests: `cookmind tokenizer` run in this process, a tokenizer saved to a folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from cookmind.tokenizer import Tokenizer
from cookmind.tokenizer.cli import add_arguments, main


def run_cli(argv: list[str]) -> int:
    """`cookmind tokenizer ARGV` in this process (its parser and main); the exit code."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return main(parser.parse_args(argv))


def save_tokenizer(tok: Tokenizer, folder: Path) -> Path:
    """``tok`` saved in ``folder``; the folder, for a ``--tokenizer`` argument."""
    tok.save(folder)
    return folder
