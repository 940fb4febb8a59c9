"""The files that make a tokenizer folder: ours, Hugging Face's and GPT-2's, plus the generation settings that
name its stop tokens. A model folder often holds its tokenizer too; only these files travel with a tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "generation_config.json",
    "cookmind_tokenizer.json",
)


def copy_tokenizer_files(src: str | Path, dst: str | Path, *, replace: bool = True) -> list[str]:
    """Copy the tokenizer files in ``src`` into ``dst`` (never its weights, optimizer or adapter); their names.
    ``replace=False`` keeps a file ``dst`` already has."""
    src, dst = Path(src), Path(dst)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and (replace or not (dst / name).exists()):
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def has_tokenizer(directory: str | Path) -> bool:
    """Whether ``directory`` holds a tokenizer (a generation_config.json alone is none)."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES if name != "generation_config.json")
