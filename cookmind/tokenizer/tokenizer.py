"""The byte-level BPE codec: encode/decode, special tokens, chat rendering, persistence.

Two encoders give the same ids: the reference (pure Python greedy merge replay, the
definition) and a fast path through tiktoken built from the same ranks, pattern and special
tokens (tests prove them equal). `encode` uses the fast path whenever the vocabulary allows it.

Special tokens are control syntax, so text never turns into them by default: `encode(text)` reads
`<|im_end|>` as the ten characters it is, and `render` takes special tokens only from the chat
template, never from message content. A caller that trusts its text opts in with
`encode(text, allowed_special="all")` (or a set of token strings) or
`render(..., allow_special_in_content=True)`.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path

import regex

from cookmind.atomic import write_text
from cookmind.tokenizer.bpe_encode import Ranks, bpe_merge
from cookmind.tokenizer.bytes_unicode import str_to_token, token_to_str, without_lone_surrogates
from cookmind.tokenizer.chat_template import IM_END, IM_START, chat_segments, render_text
from cookmind.tokenizer.documents import end_of_document
from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.patterns import is_safe_end, resolve_pattern, safe_cut_kind
from cookmind.tokenizer.pretokenize import special_split_regex

FILE_NAME = "cookmind_tokenizer.json"
FORMAT = "cookmind-bpe"
PAD = "<|pad|>"
_CACHE_MAX = 200_000


class Tokenizer:
    """Byte-level BPE tokenizer: vocab (id -> bytes), merges in learned order, special tokens, split pattern."""

    def __init__(
        self,
        vocab: dict[int, bytes],
        merges: Sequence[tuple[bytes, bytes]],
        special_tokens: Sequence[str] | dict[str, int] | None = None,
        pattern: str = "gpt2",
        *,
        eos_token: str | None = None,
        bos_ids: Sequence[int] = (),
    ):
        # a Hugging Face folder's roles: its EOS (tokenizer_config.json; ours end with <|endoftext|>) and the ids its
        # post_processor puts before every text (Llama's <s>), which pack puts before each document
        self.eos_token, self.bos_ids = eos_token, tuple(int(i) for i in bos_ids)
        self.vocab: dict[int, bytes] = {int(i): bytes(b) for i, b in vocab.items()}
        self.merges: list[tuple[bytes, bytes]] = [(bytes(a), bytes(b)) for a, b in merges]
        self.pattern = resolve_pattern(pattern)
        self._pat = regex.compile(self.pattern)
        self.special_tokens = self._resolve_specials(special_tokens)
        special_ids = set(self.special_tokens.values())
        by_bytes: dict[bytes, int] = {}
        for i in sorted(self.vocab):
            if i not in special_ids:
                by_bytes.setdefault(self.vocab[i], i)  # a repeated byte string: the lowest id is the token
        self._by_bytes = by_bytes
        missing = [b for b in range(256) if bytes([b]) not in by_bytes]
        if missing:
            raise TokenizerError(
                f"the vocabulary lacks single-byte tokens {missing[:8]}...; a byte-level BPE needs all 256"
            )
        self._byte_ids = [by_bytes[bytes([b])] for b in range(256)]
        ranks: Ranks = {}
        for r, (a, b) in enumerate(self.merges):
            try:
                ids = (by_bytes[a], by_bytes[b], by_bytes[a + b])
            except KeyError:
                raise TokenizerError(
                    f"merge #{r} {a!r} + {b!r} uses or makes a token missing from the vocabulary"
                ) from None
            ranks.setdefault(ids[:2], (r, ids[2]))
        self._ranks = ranks
        self._special_re = special_split_regex(self.special_tokens)
        self._special_res: dict[frozenset[str], regex.Pattern | None] = {}
        self._max_special = max((len(s) for s in self.special_tokens), default=0)
        self._cache: dict[str, list[int]] = {}
        self._fast = None
        self._fast_checked = False

    def __getstate__(self) -> dict:
        # the tiktoken encoding and the pre-token cache are rebuilt on demand in the receiving process
        state = dict(self.__dict__)
        state.update(_fast=None, _fast_checked=False, _cache={}, _special_res={})
        return state

    def _resolve_specials(self, specials) -> dict[str, int]:
        if specials is None:
            return {}
        if isinstance(specials, dict):
            out = {}
            for s, i in specials.items():
                if self.vocab.get(i) != s.encode("utf-8"):
                    raise TokenizerError(
                        f"special token {s!r} has id {i}, but the vocabulary holds {self.vocab.get(i)!r} there"
                    )
                out[s] = int(i)
            return out
        out = {}
        for s in specials:
            if not isinstance(s, str) or not s:
                raise TokenizerError(f"special token {s!r} must be a non-empty string")
            sb = s.encode("utf-8")
            # a special already in the vocabulary (e.g. GPT-2's <|endoftext|>) keeps its id; a one-byte
            # special never takes over a byte token
            found = [i for i, b in self.vocab.items() if b == sb and len(b) > 1]
            if found:
                out[s] = max(found)
            else:
                out[s] = max(self.vocab, default=-1) + 1
                self.vocab[out[s]] = sb
        return out

    # ---- properties other packages rely on -------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids an embedding table needs: the largest id + 1."""
        return max(self.vocab) + 1

    @property
    def eos_id(self) -> int | None:
        """The id that ends a document and a reply: <|endoftext|>, else the EOS its Hugging Face folder names."""
        return end_of_document(self.special_tokens, self.special_tokens.get(self.eos_token))

    @property
    def pad_id(self) -> int | None:
        """`<|pad|>` when the tokenizer has one, else the end-of-text id."""
        return self.special_tokens.get(PAD, self.eos_id)

    @property
    def im_start_id(self) -> int | None:
        return self.special_tokens.get(IM_START)

    @property
    def im_end_id(self) -> int | None:
        return self.special_tokens.get(IM_END)

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab={len(self.vocab)}, merges={len(self.merges)}, specials={list(self.special_tokens)})"

    # ---- reference encoder ------------------------------------------------------------------
    def _encode_pretoken(self, piece: str) -> list[int]:
        ids = self._cache.get(piece)
        if ids is None:
            ids = bpe_merge([self._byte_ids[b] for b in piece.encode("utf-8")], self._ranks)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[piece] = ids
        return ids

    def _allowed_re(self, allowed_special: str | Collection[str]) -> regex.Pattern | None:
        """The regex of the special tokens a caller lets the text contain (None: no special tokens)."""
        if allowed_special == "all":
            return self._special_re
        if isinstance(allowed_special, str):
            raise TokenizerError(
                f"allowed_special must be 'all' or a collection of special-token strings, "
                f"got the string {allowed_special!r}; wrap one token in a set: {{{allowed_special!r}}}"
            )
        key = frozenset(allowed_special)
        if key not in self._special_res:
            unknown = sorted(key - set(self.special_tokens))
            if unknown:
                raise TokenizerError(
                    f"allowed_special names {unknown}, which are not special tokens of this tokenizer "
                    f"(it has {list(self.special_tokens)})"
                )
            self._special_res[key] = special_split_regex(key)
        return self._special_res[key]

    @staticmethod
    def _segments(
        text: str, special_re: regex.Pattern | None, start: int = 0, end: int | None = None
    ) -> Iterator[tuple[int, int, bool]]:
        """(start, end, is_special) spans covering text[start:end]; specials found leftmost, longest first."""
        pos, end = start, len(text) if end is None else end
        if special_re is not None:
            for m in special_re.finditer(text, start, end):
                if m.start() > pos:
                    yield pos, m.start(), False
                yield m.start(), m.end(), True
                pos = m.end()
        if pos < end:
            yield pos, end, False

    def encode_reference(self, text: str, *, allowed_special: str | Collection[str] = ()) -> list[int]:
        """Encode with the pure-Python reference: split on allowed specials, pre-tokenize, replay merges. A lone
        surrogate, which UTF-8 cannot hold, is read as U+FFFD, as the fast path (tiktoken) reads it."""
        try:
            return self._encode_reference(text, allowed_special)
        except UnicodeEncodeError:
            return self._encode_reference(without_lone_surrogates(text), allowed_special)

    def _encode_reference(self, text: str, allowed_special: str | Collection[str]) -> list[int]:
        ids: list[int] = []
        for s, e, special in self._segments(text, self._allowed_re(allowed_special)):
            if special:
                ids.append(self.special_tokens[text[s:e]])
            else:
                for piece in self._pat.findall(text, s, e):
                    ids.extend(self._encode_pretoken(piece))
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids with no special tokens at all."""
        fast = self.fast_encoding
        return fast.encode_ordinary(text) if fast is not None else self.encode_reference(text)

    # ---- fast path --------------------------------------------------------------------------
    @property
    def fast_encoding(self):
        """The tiktoken.Encoding equal to this tokenizer, or None when the ids are not in merge order."""
        if not self._fast_checked:
            from cookmind.tokenizer.fast_encode import build_tiktoken

            self._fast = build_tiktoken(self)
            self._fast_checked = True
        return self._fast

    def encode(self, text: str, *, allowed_special: str | Collection[str] = ()) -> list[int]:
        """Text -> byte-level BPE ids. Text that spells a special token (`<|im_end|>`) is encoded as that text.

        allowed_special: "all" or the special-token strings that may become their ids; use it only for
        text you wrote yourself, never for text from a user or a file.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        special_re = self._allowed_re(allowed_special)
        fast = self.fast_encoding
        if fast is None:
            return self.encode_reference(text, allowed_special=allowed_special)
        if special_re is None:
            return fast.encode_ordinary(text)
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        return fast.encode(text, allowed_special=allowed, disallowed_special=())

    def encode_batch(
        self, texts: Sequence[str], num_threads: int | None = None, *, allowed_special: str | Collection[str] = ()
    ) -> list[list[int]]:
        """Encode many texts in parallel like `encode` (tiktoken threads release the GIL; else a process pool)."""
        texts = list(texts)
        self._allowed_re(allowed_special)  # a bad allowed_special fails here, not in a worker
        fast = self.fast_encoding
        if fast is not None:
            # one task per thread over a contiguous slice: per-text futures cost more than short texts do
            from concurrent.futures import ThreadPoolExecutor

            n = max(1, min(num_threads or os.cpu_count() or 1, len(texts)))
            step = -(-len(texts) // n) if texts else 1
            groups = [texts[i : i + step] for i in range(0, len(texts), step)]
            with ThreadPoolExecutor(n) as ex:
                parts = ex.map(lambda g: [self.encode(t, allowed_special=allowed_special) for t in g], groups)
            return [ids for part in parts for ids in part]
        if sum(len(t) for t in texts) < (1 << 20):
            return [self.encode_reference(t, allowed_special=allowed_special) for t in texts]
        from functools import partial

        from cookmind.pools import worker_pool

        with worker_pool(num_threads or os.cpu_count() or 1) as pool:
            return pool.map(
                partial(self.encode_reference, allowed_special=allowed_special),
                texts,
                chunksize=max(1, len(texts) // 64),
            )

    def _last_safe_cut(self, buf: str, special_re: regex.Pattern | None) -> int:
        """Largest p such that encode(buf[:p]) + encode(buf[p:] + more) == encode(buf + more); 0 if none.

        special_re: the special tokens the text may contain (a cut right after one of them is safe).
        """
        limit = len(buf) - max(0, self._max_special - 1)
        best = 0
        kind = safe_cut_kind(self.pattern)
        if kind is not None:
            p = max(buf.rfind("\n", 0, limit), buf.rfind(" ", 0, limit))
            tries = 0
            while p > 0 and tries < 64:
                if is_safe_end(buf[p - 1], kind) and not any(
                    buf.find(s, max(0, p - len(s) + 1), p + len(s) - 1) != -1 for s in self.special_tokens
                ):
                    best = p
                    break
                p = max(buf.rfind("\n", 0, p), buf.rfind(" ", 0, p))
                tries += 1
        if special_re is not None and best < limit:
            for m in special_re.finditer(buf, best):
                if m.start() + self._max_special <= len(buf):  # no longer special could still start here
                    best = max(best, m.end())
        return best

    def encode_iterable(self, iterable: Iterable[str], *, allowed_special: str | Collection[str] = ()) -> Iterator[int]:
        """Yield `encode`'s ids for a stream of strings (e.g. a file's lines) with memory independent of its length.

        Text is held back only up to the last cut that cannot change the ids (see patterns.py).
        """
        special_re = self._allowed_re(allowed_special)
        buf = ""
        for chunk in iterable:
            buf += chunk
            cut = self._last_safe_cut(buf, special_re)
            if cut:
                yield from self.encode(buf[:cut], allowed_special=allowed_special)
                buf = buf[cut:]
        if buf:
            yield from self.encode(buf, allowed_special=allowed_special)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; byte sequences that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Ids -> the raw bytes they stand for."""
        try:
            return b"".join(self.vocab[int(i)] for i in ids)
        except KeyError as exc:
            raise TokenizerError(
                f"id {exc.args[0]} is not in the vocabulary (ids run 0..{self.vocab_size - 1})"
            ) from None

    # ---- chat -------------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: Sequence[dict], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        """The ChatML prompt string (identical to the Jinja chat_template in tokenizer_config.json).

        For display and logs: encoding it cannot tell special tokens typed in the messages from the template's;
        `render` gives the ids.
        """
        return render_text(messages, add_generation_prompt, tools)

    def render(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = False,
        tools: Sequence[dict] | None = None,
        *,
        allow_special_in_content: bool = False,
    ) -> tuple[list[int], list[int]]:
        """(ids, assistant_mask) for a conversation.

        Special tokens come only from the template. Text in the messages and tools that spells one
        (`<|im_start|>`) is encoded as text, on its own, the way transformers' `apply_chat_template(...,
        sanitize_control_tokens=True)` does; for chats without such text, ids == encode(apply_chat_template(...),
        allowed_special="all"). allow_special_in_content=True reads them as special tokens (trusted text only).

        mask[i] = 1 for tokens of assistant content (reasoning, text, tool calls) and its <|im_end|>;
        a pre-token that straddles the start of assistant content (content that begins with
        whitespace) counts as assistant.
        """
        if self.im_start_id is None or self.im_end_id is None:
            raise TokenizerError(
                f"this tokenizer has no {IM_START}/{IM_END} special tokens, and cookmind renders chats in ChatML "
                "only: train a tokenizer with --special-token for both, or give such a model (a Hugging Face model "
                "with another chat template) plain text: generate without --chat, pack --train-type seq"
            )
        segs = chat_segments(messages, add_generation_prompt, tools)
        text = "".join(t for t, _, _ in segs)
        charmask = bytearray()
        changes: list[int] = []  # char positions where the target flag flips
        typed: list[tuple[int, int]] = []  # spans of special-token text inside data, encoded as text
        for t, target, data in segs:
            if charmask and charmask[-1] != target:
                changes.append(len(charmask))
            if data and not allow_special_in_content and self._special_re is not None:
                typed += [(len(charmask) + m.start(), len(charmask) + m.end()) for m in self._special_re.finditer(t)]
            charmask += (b"\x01" if target else b"\x00") * len(t)
        ids: list[int] = []
        mask: list[int] = []
        pos = 0
        for a, b in [*typed, (len(text), len(text))]:
            self._render_span(text, pos, a, charmask, changes, ids, mask)
            if a < b:
                piece_ids = self._encode_ordinary(text[a:b])
                ids.extend(piece_ids)
                mask.extend([charmask[a]] * len(piece_ids))
            pos = b
        return ids, mask

    def render_last_turn(
        self, messages: Sequence[dict], tools: Sequence[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """``render``'s (ids, mask) of a chat that ends with an assistant turn, the mask on that turn alone: its
        tokens past the render of the messages before it with the generation prompt (a pre-token across that seam
        counts as the turn's, as ``render`` counts it)."""
        if not messages or messages[-1].get("role") != "assistant":
            raise TokenizerError("the chat's last message is not the assistant's: there is no last turn to mark")
        ids, mask = self.render(messages, False, tools)
        prompt = self.render_prompt(messages[:-1], tools)
        start = next((k for k, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))
        return ids, [0] * start + mask[start:]

    def render_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
        """The prompt ids for the assistant's next turn (``render``'s with the generation prompt): what inference
        asks for, as of ``HFTokenizerAdapter.render_prompt``."""
        return self.render(messages, True, tools)[0]

    def _render_span(
        self, text: str, start: int, end: int, charmask: bytearray, changes: list[int], ids: list[int], mask: list[int]
    ) -> None:
        """Append ids and mask for text[start:end], reading special tokens in it as their ids."""
        fast = self.fast_encoding if safe_cut_kind(self.pattern) is not None else None
        for s, e, special in self._segments(text, self._special_re, start, end):
            if special:
                ids.append(self.special_tokens[text[s:e]])
                mask.append(charmask[s])
                continue
            cuts = changes[bisect.bisect_right(changes, s) : bisect.bisect_left(changes, e)]
            if fast is not None and all(self._header_cut_is_safe(text, s, q) for q in cuts):
                for a, b in zip([s, *cuts], [*cuts, e]):
                    piece_ids = fast.encode_ordinary(text[a:b])
                    ids.extend(piece_ids)
                    mask.extend([charmask[a]] * len(piece_ids))
                continue
            for m in self._pat.finditer(text, s, e):
                piece_ids = self._encode_pretoken(m.group())
                ids.extend(piece_ids)
                mask.extend([1 if any(charmask[m.start() : m.end()]) else 0] * len(piece_ids))

    @staticmethod
    def _header_cut_is_safe(text: str, start: int, q: int) -> bool:
        """Is q (just after a role header's single newline, before non-space content) a pre-token boundary?

        For the GPT-2 and GPT-4 patterns a lone "\n" after a non-space (or a special token) and before a
        non-space is its own pre-token, so both sides split the same alone as together.
        """
        return text[q - 1] == "\n" and not text[q].isspace() and (q - 2 < start or not text[q - 2].isspace())

    # ---- identity and persistence ------------------------------------------------------------
    def to_dict(self) -> dict:
        """Our JSON format: printable tokens (GPT-2 byte map), merges, specials, pattern; a Hugging Face folder's
        roles (``eos_token``, ``bos_ids``) when it came from one."""
        roles = {"eos_token": self.eos_token, "bos_ids": list(self.bos_ids)}
        return {
            "format": FORMAT,
            "version": 1,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            "vocab": [[i, token_to_str(self.vocab[i])] for i in sorted(self.vocab)],
            "merges": [[token_to_str(a), token_to_str(b)] for a, b in self.merges],
            **{k: v for k, v in roles.items() if v},
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = "<dict>") -> Tokenizer:
        """Rebuild a tokenizer from to_dict()'s output."""
        if not isinstance(d, dict):
            raise TokenizerError(f"{where}: not a JSON object but a {type(d).__name__}; re-save the tokenizer")
        if d.get("format") != FORMAT:
            raise TokenizerError(f"{where}: not a cookmind tokenizer (format={d.get('format')!r}, expected {FORMAT!r})")
        try:
            vocab = {int(i): str_to_token(t) for i, t in d["vocab"]}
            merges = [(str_to_token(a), str_to_token(b)) for a, b in d["merges"]]
        except (KeyError, ValueError, TypeError) as exc:
            raise TokenizerError(f"{where}: malformed vocab or merges ({exc!r}); re-save the tokenizer") from None
        specials = d.get("special_tokens")
        if not isinstance(specials, dict) or not all(type(i) is int for i in specials.values()):
            raise TokenizerError(f"{where}: special_tokens is not an object of token -> id; re-save the tokenizer")
        if not isinstance(d.get("pattern"), str):
            raise TokenizerError(f"{where}: no pattern (the pre-tokenization regex); re-save the tokenizer")
        return cls(vocab, merges, specials, d["pattern"], eos_token=d.get("eos_token"), bos_ids=d.get("bos_ids", ()))

    def fingerprint(self) -> str:
        """Stable SHA-256 of vocab + merges + specials + pattern (token stores record it)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is not None:
            return cached
        d = self.to_dict()
        blob = json.dumps(
            [d["pattern"], sorted(d["special_tokens"].items()), d["vocab"], d["merges"]],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        self._fingerprint = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        return self._fingerprint

    def save(self, directory: str | os.PathLike) -> None:
        """Write cookmind_tokenizer.json plus Hugging Face tokenizer.json and tokenizer_config.json into directory.

        Each file is written to a temporary name and renamed; all contents are built before any is written.
        """
        from cookmind.tokenizer.hf_format import hf_tokenizer_config, hf_tokenizer_json

        directory = Path(directory)
        files = {
            FILE_NAME: json.dumps(self.to_dict(), ensure_ascii=False),
            "tokenizer.json": json.dumps(hf_tokenizer_json(self), ensure_ascii=False),
            "tokenizer_config.json": json.dumps(hf_tokenizer_config(self), ensure_ascii=False, indent=2),
        }
        for name, text in files.items():
            write_text(directory / name, text)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """Load our format from a directory, else a byte-level tokenizer.json, else a GPT-2 style vocab.json +
        merges.txt."""
        directory = Path(directory)
        path = directory / FILE_NAME
        if path.is_file():
            try:
                d = json.loads(path.read_text(encoding="utf-8-sig"))  # -sig: as a Windows editor saves it
            except json.JSONDecodeError as exc:
                raise TokenizerError(
                    f"{path}:{exc.lineno}: not valid JSON ({exc.msg.removesuffix(' at')}"
                    f" at column {exc.colno}); re-save the tokenizer"
                ) from None
            return cls.from_dict(d, str(path))
        if (directory / "tokenizer.json").is_file():
            # before a vocab.json + merges.txt pair beside it, as transformers: the pair has no pattern, no added tokens
            from cookmind.tokenizer.hf_format import load_hf_tokenizer_json

            return load_hf_tokenizer_json(directory / "tokenizer.json")
        if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
            from cookmind.tokenizer.hf_format import load_gpt2_files

            return load_gpt2_files(directory / "vocab.json", directory / "merges.txt")
        saved = sorted(p.parent for p in directory.glob(f"checkpoints/step_*/{FILE_NAME}"))
        if saved:  # a training run (as --model takes one): each checkpoint holds the run's tokenizer
            raise TokenizerError(
                f"no tokenizer in {directory}, a training run: its checkpoints hold its tokenizer; pass the newest "
                f"checkpoint's, {saved[-1]}"
            )
        if directory.is_file():  # the tokenizer's file named where its folder belongs
            known = directory.name in (FILE_NAME, "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
            raise TokenizerError(
                f"{directory} is a file; a tokenizer is named by its folder"
                + (f": pass {directory.parent}" if known else f" (holding {FILE_NAME} or tokenizer.json)")
            )
        ranks = sorted(directory.glob("*.tiktoken")) if directory.is_dir() else []
        if ranks:  # `tokenizer export --format tiktoken`'s: a file for tiktoken, which holds no merges to read back
            raise TokenizerError(
                f"{directory} holds a tiktoken ranks file ({ranks[0].name}), which `cookmind tokenizer export --format "
                "tiktoken` writes for tiktoken and cookmind does not read back: pass the tokenizer it was exported "
                "from, or export that one with --format hf (tokenizer.json), which cookmind reads"
            )
        raise TokenizerError(
            f"no tokenizer in {directory}: expected {FILE_NAME} (or tokenizer.json, or vocab.json + merges.txt); "
            "train one with `cookmind tokenizer train`"
        )


def tokenizer_files(directory: str | os.PathLike) -> list[Path]:
    """The tokenizer files in ``directory``: ours and the Hugging Face / GPT-2 / SentencePiece files beside it
    (``files.TOKENIZER_FILES``: its chat_template.jinja, tokenizer.model, generation settings too). An output written
    over one of them destroys the tokenizer."""
    from cookmind.tokenizer.files import TOKENIZER_FILES

    directory = Path(directory)
    return [directory / n for n in TOKENIZER_FILES if (directory / n).is_file()]


def _carried_tokenizer(model_dir: Path):
    """The tokenizer a model folder carries: a checkpoint's cookmind_tokenizer.json, or a Hugging Face model's own
    tokenizer.json, ours where it reads as a byte-level BPE, else read through transformers (a SentencePiece-style
    BPE, compared by its fingerprint as ours); None when neither reads it (it cannot be compared)."""
    if (model_dir / FILE_NAME).is_file():
        return Tokenizer.load(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        from cookmind.tokenizer.hf_adapter import load_tokenizer

        try:
            return load_tokenizer(model_dir)
        except (TokenizerError, ValueError, KeyError, OSError):
            return None
    return None


def check_carried_tokenizer(model_dir: str | os.PathLike, tokenizer, *, model: str, given: str, hint: str) -> None:
    """Refuse ``tokenizer`` when the checkpoint in ``model_dir`` carries another one (its cookmind_tokenizer.json, or a
    Hugging Face model folder's tokenizer.json).

    ``model`` and ``given`` name the two sides in the error (e.g. ``train.init_from=runs/a`` and
    ``data.tokenizer=tok``), ``hint`` says what to do. Another tokenizer is one with another fingerprint, or one
    that opens or ends a document with other ids (``documents.document_framing``, which the fingerprint does not
    cover: the model learned one framing and would be prompted with the other). Nothing is checked when the
    checkpoint carries no tokenizer (or one neither cookmind nor transformers reads) or ``tokenizer`` has no
    fingerprint (a Hugging Face tokenizer object).
    """
    from cookmind.tokenizer.documents import tokenizer_identity

    model_dir = Path(model_dir)
    carried = _carried_tokenizer(model_dir)
    if tokenizer is None or not hasattr(tokenizer, "fingerprint") or carried is None:
        return
    theirs, their_framing = tokenizer_identity(carried)
    ours, our_framing = tokenizer_identity(tokenizer)
    if theirs != ours:
        raise TokenizerError(
            f"{model} was trained with the tokenizer in {model_dir} (fingerprint {theirs[:16]}), "
            f"not {given} (fingerprint {ours[:16]}); {hint}"
        )
    if their_framing != our_framing:
        raise TokenizerError(
            f"{model} was trained with the tokenizer in {model_dir}, whose documents open with ids "
            f"{their_framing['bos_ids']} and end with id {their_framing['eos_id']}; {given} has the same vocabulary "
            f"but opens them with {our_framing['bos_ids']} and ends them with {our_framing['eos_id']}; {hint}"
        )
