"""A Hugging Face tokenizer that cookmind's byte-level codec cannot read (a SentencePiece-style BPE with byte fallback,
as Llama 2's and Mistral's; a normalizer), read through transformers behind cookmind's Tokenizer API, and the one
loader that picks ours or it."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from cookmind.tokenizer.documents import document_start_ids
from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.tokenizer import FILE_NAME, Tokenizer

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")  # transformers' assistant-mask markup in a template


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
        self._checked_templates: set[str] = set()  # chat templates _check_generation_prompt passed

    @functools.cached_property
    def renders_reasoning(self) -> bool:
        """Whether its chat template writes an assistant message's reasoning_content (Qwen3's does, Llama 2's reads
        no such field): pack moves a reply's leading <think>...</think> there only when it does."""
        probe = "cookmind reasoning probe"
        chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": probe}]
        try:
            return probe in self.hf.apply_chat_template(chat, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that cannot render a chat says why when pack renders one
            return False

    def left_out(self, messages, tools=None, *, prompt: bool = False) -> str | None:
        """What of a chat its template leaves out of its render (a system or tool message of a template that renders
        only user and assistant turns, a reasoning_content it reads no such field for, tool calls, tool schemas), the
        first said as a record's error with what to do; None when it renders every part. pack refuses such a record:
        the part would be missing from the training text without a word. ``prompt``: a prompt for a reply, where
        only a system or tool message and the tool schemas are asked after (a template may drop past reasoning)."""
        asked_after = [m for m in messages if isinstance(m, dict) and m.get("role") in ("system", "tool")]
        if prompt and not tools and not asked_after:
            return None  # nothing a prompt's check reads: no second render on every chat request
        text = self.hf.apply_chat_template(messages, tools=tools, add_generation_prompt=prompt, tokenize=False)
        missing = "is not in the chat template's render (the template does not render it, and it would be left out "
        missing += "of the prompt: the model would answer as if it had read it)" if prompt else "of the training text)"
        for k, m in enumerate(messages, 1):
            if not isinstance(m, dict) or (prompt and m.get("role") not in ("system", "tool")):
                continue
            role = m.get("role")
            for key in ("content",) if prompt else ("content", "reasoning_content"):
                value = m.get(key)
                if isinstance(value, str) and value.strip() and value.strip() not in text:
                    fix = (
                        "put it in content as '<think>...</think>answer', or use a tokenizer whose template reads "
                        "reasoning_content"
                        if key == "reasoning_content"
                        else f"use a tokenizer whose template renders {role} messages, or leave them out"
                    )
                    return f"message {k} ({role}): its {key} {missing}: {fix}"
            for call in m.get("tool_calls") or []:
                name = _function_name(call)
                if name and name not in text:
                    return (
                        f"message {k} ({role}): its tool call {name!r} {missing}: use a tokenizer whose template "
                        "renders tool_calls"
                    )
        for tool in tools or []:
            name = _function_name(tool)
            if name and name not in text:
                fix = "use a tokenizer whose template renders tools, or leave tools out"
                return f"the tool schema {name!r} {missing}: {fix}"
        return None

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

    def decode_bytes(self, ids) -> bytes:
        """The UTF-8 of ``decode``, as ``Tokenizer.decode_bytes`` for `tokenizer decode --output`: transformers decodes
        to text, so a character cut between byte-fallback ids comes back as U+FFFD. An id outside the vocabulary is
        refused: transformers' decode drops it without a word."""
        ids = [int(i) for i in ids]
        if (bad := next((i for i in ids if not 0 <= i < self.vocab_size), None)) is not None:
            raise TokenizerError(f"id {bad} is not in the vocabulary (ids run 0..{self.vocab_size - 1})")
        return self.decode(ids).encode("utf-8")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tools=None) -> str:
        return self.hf.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def render(self, messages, add_generation_prompt: bool = False, tools=None):
        """(ids, assistant_mask) as ``Tokenizer.render``: mask[i] = 1 for the tokens of each assistant message's
        content and its end-of-turn token (not its role header, nor the template's text after that token)."""
        ids = self._ids(messages, add_generation_prompt, tools)
        turns = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
        if not turns:
            return ids, [0] * len(ids)
        if GENERATION_BLOCK.search(self.hf.get_chat_template(None, tools) or ""):
            # the template marks its assistant text itself; transformers cannot sanitize and mask in one call, so its
            # mask holds where no message spells a control token (the two renders are the same ids)
            out = self.hf.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            if list(out["input_ids"]) == ids:
                return ids, list(out["assistant_masks"])
        if not add_generation_prompt:  # a prompt for a reply (its mask is not trained on) is rendered all the same
            self._check_generation_prompt(messages, turns[0], tools)
        return ids, self._turn_diff_mask(messages, turns, ids, tools, add_generation_prompt)

    def render_last_turn(self, messages, tools=None):
        """(ids, mask) of a chat that ends with an assistant turn, the mask on that turn alone: its tokens past the
        render of the messages before it with the generation prompt (the prompt it answers at inference) through its
        end-of-turn token, as ``render`` marks each turn. Only that one prefix is rendered, so a template that
        rewrites earlier turns once more follow (Qwen3's drops past reasoning) is read as it is at inference: pack's
        --split-turns and a preference pair's answer."""
        if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "assistant":
            raise TokenizerError("the chat's last message is not the assistant's: there is no last turn to mark")
        ids, last = self._ids(messages, False, tools), len(messages) - 1
        if GENERATION_BLOCK.search(self.hf.get_chat_template(None, tools) or ""):
            out = self.hf.apply_chat_template(
                messages, tools=tools, return_dict=True, return_assistant_tokens_mask=True
            )
            prompt = self._ids(messages[:last], True, tools)
            if list(out["input_ids"]) == ids and ids[: len(prompt)] == prompt:
                return ids, [0] * len(prompt) + list(out["assistant_masks"])[len(prompt) :]
        self._check_generation_prompt(messages, last, tools)
        return ids, self._turn_diff_mask(messages, [last], ids, tools, False)

    def render_prompt(self, messages, tools=None) -> list[int]:
        """The prompt ids for the assistant's next turn, as transformers' ``apply_chat_template(...,
        add_generation_prompt=True)``: one render, no training mask (``render``'s prefix renders per assistant turn
        made a reply's prompt quadratic in the conversation, and refused a template that rewrites earlier turns). A
        system or tool message, or a tool schema, the template leaves out is refused (``left_out``), not answered as
        if read."""
        if why := self.left_out(messages, tools, prompt=True):
            raise TokenizerError(why)
        return self._ids(messages, True, tools)

    def _ids(self, messages, add_generation_prompt: bool = False, tools=None) -> list[int]:
        # special tokens only from the template: transformers wraps those typed in the messages and encodes them as text
        return list(
            self.hf.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                sanitize_control_tokens=True,
                return_dict=False,
            )
        )

    def _check_generation_prompt(self, messages, i: int, tools) -> None:
        """Refuse a template that ignores add_generation_prompt and renders the assistant's header only with its
        answer: the prefix diff would train the header as the answer's first tokens. Told apart from one whose answer
        follows the prompt with no header (Llama 2's, after [/INST]) by a probe answer after the first ``i`` messages,
        once a template."""
        template = self.hf.get_chat_template(None, tools) or ""
        if template in self._checked_templates:
            return
        probe = "cookmind probes the template"
        plain = self.hf.apply_chat_template(messages[:i], tools=tools, tokenize=False)
        asked = self.hf.apply_chat_template(messages[:i], tools=tools, add_generation_prompt=True, tokenize=False)
        said = self.hf.apply_chat_template(
            [*messages[:i], {"role": "assistant", "content": probe}], tools=tools, tokenize=False
        )
        at = said.find(probe, len(plain))
        header = said[len(plain) : at] if asked == plain and said.startswith(plain) and at >= 0 else ""
        if header.strip():  # whitespace alone is the answer's lead (Llama 2's " "), the model's to write
            raise TokenizerError(
                f"{self._tokenizer_json.parent}: its chat template ignores add_generation_prompt and renders the "
                f"assistant's header {header!r} only with the answer, so the header would be trained as the answer "
                "(and a prompt for a reply lacks it): add {% if add_generation_prompt %}{{ "
                f"{header!r} }}}}{{% endif %}} at the template's end, or put "
                "{% generation %}...{% endgeneration %} around each assistant answer"
            )
        self._checked_templates.add(template)

    def _turn_diff_mask(self, messages, turns: list[int], ids: list[int], tools, add_generation_prompt) -> list[int]:
        """The assistant mask of a template with no generation blocks, from renders of the conversation's prefixes:
        message i's tokens are those of messages[:i+1] past those of messages[:i] with the generation prompt (a token
        across that seam counts as the assistant's, as ours), through the last special token of the turn (its
        end-of-turn: <|im_end|>, </s>, <|eot_id|>), or the whole turn when it has none. Each prefix ending at an
        assistant turn is rendered once (the whole conversation's renders serve a last one). A template whose render
        of a conversation's first turns is not the start of its render of all of them (one that drops past
        reasoning) is refused: which tokens are whose cannot be told."""
        specials = {i for i, t in self.hf.added_tokens_decoder.items() if t.special}
        text = self.hf.apply_chat_template(messages, tools=tools, tokenize=False)
        mask = [0] * len(ids)
        for i in turns:
            asked = self.hf.apply_chat_template(messages[:i], tools=tools, add_generation_prompt=True, tokenize=False)
            before = self._ids(messages[:i], True, tools)
            if i + 1 == len(messages) and not add_generation_prompt:
                said, turn = text, ids
            else:
                said, turn = (
                    self.hf.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False),
                    self._ids(messages[: i + 1], False, tools),
                )
            start = next((k for k, (a, b) in enumerate(zip(before, turn)) if a != b), min(len(before), len(turn)))
            ends = [k for k in range(start, len(turn)) if turn[k] in specials]
            end = ends[-1] + 1 if ends else len(turn)
            if not (said.startswith(asked) and text.startswith(said)) or ids[:end] != turn[:end]:
                raise TokenizerError(
                    f"{self._tokenizer_json.parent}: its chat template renders a conversation's first {i + 1} "
                    f"message(s) (or the first {i} with the generation prompt) as text that is not the start of its "
                    "render of the whole (it rewrites earlier turns, as templates that drop past reasoning do), so "
                    "cookmind cannot tell which tokens are the assistant's: put {% generation %}...{% endgeneration %} "
                    "around each assistant answer in the template (transformers' assistant mask), or pack with "
                    "--split-turns (each assistant turn its own record, after the chat before it as the model sees it "
                    "at inference), or use a template that renders each turn the same whatever follows"
                )
            mask[start:end] = [1] * (end - start)
        return mask


def _function_name(value) -> str | None:
    """The function name of a tool call or tool schema, OpenAI's nested form ({"function": {"name"}}) or flat."""
    if not isinstance(value, dict):
        return None
    name = (value.get("function") if isinstance(value.get("function"), dict) else value).get("name")
    return name if isinstance(name, str) and name else None


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
