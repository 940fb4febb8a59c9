"""The one error type the tokenizer raises for bad input, so callers can catch it precisely."""

from __future__ import annotations


class TokenizerError(ValueError):
    """Bad tokenizer input: the message says what is wrong, where, and what to do."""
