"""Where a document starts and ends in ids: one rule for pack, eval ppl, training and prompts, for our tokenizer and a
Hugging Face one.

A document opens with the ids the tokenizer's Hugging Face post_processor puts before every text (Llama's and
Mistral's BOS ``<s>``, as transformers' ``encode`` adds it; none for ours). It ends with ``<|endoftext|>`` when the
tokenizer has it (GPT-2's and Qwen's pretraining separator, even where the chat EOS is ``<|im_end|>``), else with the
tokenizer's EOS (Llama's and Mistral's ``</s>``).

A plain-text prompt (generate, /v1/completions, eval gsm8k and mmlu, GRPO's prompts) is the start of a document, so
it opens the same way (``prompt_ids``): the ids a model pretrained on pack's documents, or by transformers, saw
first. A chat opens as its template writes it (Llama's templates write ``<s>`` themselves; ChatML has none).
"""

from __future__ import annotations

from collections.abc import Mapping

from cookmind.tokenizer.chat_template import ENDOFTEXT

PROBE = "Hello world"  # a text to see what a post_processor adds around one


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


def added_around(with_specials: list[int], plain: list[int]) -> tuple[list[int], list[int]]:
    """(ids before, ids after) a text's own ids ``plain`` in ``with_specials``, its encoding with what a post_processor
    adds around it."""
    k = next((k for k in range(len(with_specials)) if with_specials[k : k + len(plain)] == plain), 0)
    return with_specials[:k], with_specials[k + len(plain) :]


def document_start_ids(tokenizer) -> list[int]:
    """The ids that open each document: what a transformers tokenizer's ``encode`` puts before a text, else the
    tokenizer's ``bos_ids`` (ours: read from a Hugging Face folder's post_processor)."""
    if is_hf_tokenizer(tokenizer):
        return added_around(tokenizer.encode(PROBE), tokenizer.encode(PROBE, add_special_tokens=False))[0]
    return list(getattr(tokenizer, "bos_ids", ()))


def encode_text(tokenizer, text: str) -> list[int]:
    """Ids for ``text`` with no special tokens added, of ours or a transformers tokenizer."""
    if is_hf_tokenizer(tokenizer):
        # verbose=False: cookmind windows or refuses a text longer than the model's context itself; transformers'
        # "would cause indexing errors" (past an export's model_max_length) is no news
        # split_special_tokens: a special token typed in the text is that text, as ours (and pack's adapter) encode
        # it; transformers' default reads it as the token
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True, verbose=False))
    return list(tokenizer.encode(text))


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The ids of a plain-text prompt: a document's start (``document_start_ids``), then the text's own ids; what
    transformers' ``encode(text)`` gives a Llama-style tokenizer (``<s>`` first), the text alone for ours."""
    return [*document_start_ids(tokenizer), *encode_text(tokenizer, text)]


def continuation_ids(
    tokenizer, prompt: str, continuation: str, context: list[int] | None = None
) -> tuple[list[int], list[int]]:
    """(``prompt_ids(prompt)``, the ids of ``continuation`` after them): what the tokenizer gives the two written as
    one text, past the prompt's own (lm-evaluation-harness's rule). A SentencePiece-style tokenizer (Llama 2's,
    Mistral's) puts a dummy "▁" before each encode: " A" alone is "▁▁A", but "Answer: A" is "Answer:" then "▁A".
    Where the two encodings part before the prompt's end (a token across the seam), the continuation is encoded
    alone. ``context``: the prompt's ids, where the caller has them. cookmind's own byte-level BPE adds nothing
    before a text, and where its joined encoding keeps the prompt's ids the rest is the continuation's own: it is
    encoded alone, once."""
    from cookmind.tokenizer.tokenizer import Tokenizer  # it imports this module

    context = prompt_ids(tokenizer, prompt) if context is None else list(context)
    if isinstance(tokenizer, Tokenizer):
        return context, encode_text(tokenizer, continuation)
    whole = prompt_ids(tokenizer, prompt + continuation)
    if len(whole) > len(context) and whole[: len(context)] == context:
        return context, whole[len(context) :]
    return context, encode_text(tokenizer, continuation)


def document_framing(tokenizer) -> dict:
    """How the tokenizer frames a document, as pack records it in a store's meta.json (``eos_id``, ``bos_ids``): a
    store whose documents were framed otherwise is refused for training (``TokenStore.check_tokenizer``)."""
    return {"eos_id": document_end_id(tokenizer), "bos_ids": document_start_ids(tokenizer)}


def tokenizer_identity(tokenizer) -> tuple[str | None, dict | None]:
    """(fingerprint, ``document_framing``) of a tokenizer, what a token store read with it must have been packed with
    (``TokenStore.check_tokenizer``); (None, None) for no tokenizer."""
    if tokenizer is None:
        return None, None
    if hasattr(tokenizer, "fingerprint"):
        return tokenizer.fingerprint(), document_framing(tokenizer)
    return _folder_fingerprint(tokenizer), document_framing(tokenizer)


def _folder_fingerprint(tokenizer) -> str | None:
    """The fingerprint pack records for a transformers tokenizer's folder (``name_or_path``): its tokenizer read as
    pack reads it (ours, or through transformers), so a store packed with another tokenizer is refused, not scored
    as the model's tokens. None when it names no folder cookmind can read."""
    from pathlib import Path

    from cookmind.tokenizer.errors import TokenizerError
    from cookmind.tokenizer.hf_adapter import load_tokenizer

    folder = getattr(tokenizer, "name_or_path", None)
    if not folder or not Path(folder).is_dir():
        return None
    try:
        return load_tokenizer(folder).fingerprint()
    except (TokenizerError, OSError, ValueError):
        return None


def document_ids(tokenizer, text_ids) -> list[int]:
    """One document as pack stores it and eval ppl scores it: its start, its text's ids, its end."""
    return [*document_start_ids(tokenizer), *text_ids, document_end_id(tokenizer)]
