"""A Hugging Face tokenizer that cookmind's byte-level codec cannot read (a SentencePiece-style BPE with byte fallback,
as Llama 2's and Mistral's; a normalizer), read through transformers behind cookmind's Tokenizer API, and the one
loader that picks ours or it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cookmind.tokenizer.documents import document_start_ids
from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.tokenizer import FILE_NAME, Tokenizer


def auto_tokenizer(directory: str | Path):
    """``transformers.AutoTokenizer`` of the tokenizer files in ``directory``, offline, no remote code. AutoTokenizer
    also reads the folder's config.json as a model config: a cookmind model's own (no ``model_type``) is not one,
    and transformers warned of its keys ("`rope_scaling` is deprecated") on every load; it gets an empty config
    instead, which is what transformers falls back to for it."""
    import transformers

    kwargs = {}
    config = Path(directory) / "config.json"
    try:
        own = config.is_file() and not {"model_type", "architectures"} & set(json.loads(config.read_text()))
    except (OSError, ValueError, TypeError):
        own = False  # transformers says what is wrong with it
    if own:
        empty = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig  # 5.x, 4.x
        kwargs["config"] = empty()
    return transformers.AutoTokenizer.from_pretrained(
        str(directory), local_files_only=True, trust_remote_code=False, **kwargs
    )


class HFTokenizerAdapter:
    """A transformers tokenizer (tokenizer.json + tokenizer_config.json) behind cookmind's Tokenizer API."""

    def __init__(self, directory: str | Path):
        self.hf = auto_tokenizer(directory)
        vocab = self.hf.get_vocab()
        self.special_tokens = {t: vocab[t] for t in self.hf.all_special_tokens if t in vocab}
        for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
            if name in vocab:
                self.special_tokens.setdefault(name, vocab[name])
        self.vocab_size = len(self.hf)
        self.eos_id = self.hf.eos_token_id
        self.im_start_id = self.special_tokens.get("<|im_start|>")
        self.im_end_id = self.special_tokens.get("<|im_end|>")
        self.pad_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos_id
        self.bos_ids = tuple(document_start_ids(self.hf))  # what transformers puts before every text (Llama's <s>)
        self._tokenizer_json = Path(directory) / "tokenizer.json"

    def encode(self, text: str) -> list[int]:
        # text that spells a special token stays text, as with cookmind's Tokenizer; cookmind windows long texts itself
        return self.hf.encode(text, add_special_tokens=False, split_special_tokens=True, verbose=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.hf(texts, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]

    def fingerprint(self) -> str:
        """SHA-256 of its tokenizer.json, read as JSON (token stores record it, as they record ours)."""
        doc = json.loads(self._tokenizer_json.read_text(encoding="utf-8"))
        return hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tools=None) -> str:
        return self.hf.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def render(self, messages, add_generation_prompt: bool = False, tools=None):
        # special tokens only from the template: transformers wraps those typed in the messages and encodes them as text
        ids = list(
            self.hf.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                sanitize_control_tokens=True,
                return_dict=False,
            )
        )
        return ids, [0] * len(ids)


def load_tokenizer(path: str | Path):
    """cookmind's tokenizer when its files are there (or a byte-level tokenizer.json), else the Hugging Face
    tokenizer.json read through transformers. A folder holding our file is ours: its error (a damaged file) is
    raised, not passed over for the tokenizer.json saved beside it (another fingerprint, another template)."""
    path = Path(path)
    try:
        return Tokenizer.load(path)
    except TokenizerError as exc:
        if not (path / "tokenizer.json").is_file() or (path / FILE_NAME).is_file():
            raise
        try:
            adapter = HFTokenizerAdapter(path)  # what transformers reads (a SentencePiece-style BPE, a normalizer)
        except Exception:  # noqa: BLE001 - transformers cannot read it either: cookmind's reason names the file
            raise exc from None
        if not adapter.encode("Hello world"):
            raise TokenizerError(
                f"{path / 'tokenizer.json'}: transformers reads a tokenizer of {adapter.vocab_size} tokens that "
                f"encodes text to nothing, and cookmind cannot read it: {exc}"
            ) from None
        return adapter
