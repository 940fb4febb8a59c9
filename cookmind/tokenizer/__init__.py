"""Byte-level BPE: our trainer and reference codec, a tiktoken fast path, ChatML, HF/GPT-2 formats.

from cookmind.tokenizer import Tokenizer, train_bpe
vocab, merges = train_bpe("corpus.txt", 8000, DEFAULT_SPECIAL_TOKENS)
tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS); tok.save("tok/")
"""

from cookmind.tokenizer.bpe_train import train_bpe
from cookmind.tokenizer.chat_template import DEFAULT_SPECIAL_TOKENS
from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.hf_format import load_gpt2_files, load_hf_tokenizer_json
from cookmind.tokenizer.patterns import GPT2_PATTERN, GPT4_PATTERN, PATTERNS
from cookmind.tokenizer.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_SPECIAL_TOKENS",
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "Tokenizer",
    "TokenizerError",
    "load_gpt2_files",
    "load_hf_tokenizer_json",
    "train_bpe",
]
