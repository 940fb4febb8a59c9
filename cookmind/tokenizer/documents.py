"""Where a document ends in ids: one rule for pack, eval ppl and training, for our tokenizer and a Hugging Face one.

A document ends with ``<|endoftext|>`` when the tokenizer has it (GPT-2's and Qwen's pretraining separator, even
where the chat EOS is ``<|im_end|>``), else with the tokenizer's EOS (Llama's and Mistral's ``</s>``).
"""

from __future__ import annotations

from collections.abc import Mapping

from cookmind.tokenizer.chat_template import ENDOFTEXT


def end_of_document(specials: Mapping[str, int], eos_id: int | None) -> int | None:
    """The rule on a tokenizer's special tokens (a vocabulary will do) and its EOS id; None when it has neither."""
    return specials.get(ENDOFTEXT, eos_id)


def is_hf_tokenizer(tokenizer) -> bool:
    """True for a transformers tokenizer (it has ``add_special_tokens`` semantics)."""
    return hasattr(tokenizer, "convert_tokens_to_ids") and hasattr(tokenizer, "pad_token_id")


def document_end_id(tokenizer) -> int | None:
    """The id that ends each document (``end_of_document``) of ours, a transformers tokenizer or one adapted."""
    if is_hf_tokenizer(tokenizer):
        return end_of_document(tokenizer.get_vocab(), tokenizer.eos_token_id)
    return end_of_document(getattr(tokenizer, "special_tokens", {}), getattr(tokenizer, "eos_id", None))
