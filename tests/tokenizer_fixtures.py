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


def hf_byte_tokenizer(path: Path, specials: list[str], eos: str, *, bos: str | None = None, template=None) -> Path:
    """A byte-level BPE (one token a byte, no merges, then ``specials``) saved by transformers in ``path``: ``eos`` its
    EOS; with ``bos`` its post_processor puts that token before every text (Llama's and Mistral's <s>); ``template``
    its chat template. The folder, for a ``--tokenizer`` argument."""
    import transformers
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, processors

    vocab = {ch: i for i, ch in enumerate(sorted(set(pre_tokenizers.ByteLevel.alphabet())))}
    raw = HFTok(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(specials)
    if bos:
        raw.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, raw.token_to_id(bos))]
        )
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos, bos_token=bos)
    if template:
        tok.chat_template = template
    tok.save_pretrained(path)
    return path


def llama_style_tokenizer(path: Path, *, bos: bool = True) -> Path:
    """``hf_byte_tokenizer`` as Llama's and Mistral's: <s> and </s>, no <|endoftext|>; </s> ends a text, <s> opens
    every one (``bos``)."""
    return hf_byte_tokenizer(path, ["<s>", "</s>"], "</s>", bos="<s>" if bos else None)


def sentencepiece_style_tokenizer(path: Path) -> Path:
    """A Llama 2 / Mistral-style tokenizer saved by transformers in ``path``: SentencePiece's BPE (a "▁" for each
    space, a leading one, bytes <0x00>..<0xFF> for what the vocabulary lacks), <unk>, <s> before every text, </s> its
    EOS; no merges. Neither byte-level nor readable by cookmind's own codec. The folder."""
    import transformers
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, normalizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for ch in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,!?'":
        vocab.setdefault(ch, len(vocab))
    raw = HFTok(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    raw.add_special_tokens(["<unk>", "<s>", "</s>"])
    raw.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", raw.token_to_id("<s>"))]
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.save_pretrained(path)
    return path
