"""The byte-level BPE codec: encode/decode, special tokens, chat rendering, persistence.

Two encoders give the same ids: the reference (pure Python greedy merge replay, the
definition) and a fast path through tiktoken built from the same ranks, pattern and special
tokens (tests prove them equal). `encode` uses the fast path whenever the vocabulary allows it.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import regex

from cookmind.atomic import write_text
from cookmind.tokenizer.bpe_encode import Ranks, bpe_merge
from cookmind.tokenizer.bytes_unicode import str_to_token, token_to_str
from cookmind.tokenizer.chat_template import (ENDOFTEXT, IM_END, IM_START, chat_segments, jinja_template,
                                              render_text)
from cookmind.tokenizer.errors import TokenizerError
from cookmind.tokenizer.patterns import is_safe_end, resolve_pattern, safe_cut_kind
from cookmind.tokenizer.pretokenize import special_split_regex

FILE_NAME = "cookmind_tokenizer.json"
FORMAT = "cookmind-bpe"
PAD = "<|pad|>"
_CACHE_MAX = 200_000


class Tokenizer:
    """Byte-level BPE tokenizer: vocab (id -> bytes), merges in learned order, special tokens, split pattern."""

    def __init__(self, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                 special_tokens: Sequence[str] | dict[str, int] | None = None, pattern: str = "gpt2"):
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
            raise TokenizerError(f"the vocabulary lacks single-byte tokens {missing[:8]}...; a byte-level BPE needs all 256")
        self._byte_ids = [by_bytes[bytes([b])] for b in range(256)]
        ranks: Ranks = {}
        for r, (a, b) in enumerate(self.merges):
            try:
                ids = (by_bytes[a], by_bytes[b], by_bytes[a + b])
            except KeyError:
                raise TokenizerError(f"merge #{r} {a!r} + {b!r} uses or makes a token missing from the vocabulary") from None
            ranks.setdefault(ids[:2], (r, ids[2]))
        self._ranks = ranks
        self._special_re = special_split_regex(self.special_tokens)
        self._max_special = max((len(s) for s in self.special_tokens), default=0)
        self._cache: dict[str, list[int]] = {}
        self._fast = None
        self._fast_checked = False

    def __getstate__(self) -> dict:
        # the tiktoken encoding and the pre-token cache are rebuilt on demand in the receiving process
        state = dict(self.__dict__)
        state.update(_fast=None, _fast_checked=False, _cache={})
        return state

    def _resolve_specials(self, specials) -> dict[str, int]:
        if specials is None:
            return {}
        if isinstance(specials, dict):
            out = {}
            for s, i in specials.items():
                if self.vocab.get(i) != s.encode("utf-8"):
                    raise TokenizerError(f"special token {s!r} has id {i}, but the vocabulary holds {self.vocab.get(i)!r} there")
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
        return self.special_tokens.get(ENDOFTEXT)

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

    def _segments(self, text: str) -> Iterator[tuple[int, int, bool]]:
        """(start, end, is_special) spans covering text; specials found leftmost, longest first."""
        pos = 0
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                if m.start() > pos:
                    yield pos, m.start(), False
                yield m.start(), m.end(), True
                pos = m.end()
        if pos < len(text):
            yield pos, len(text), False

    def encode_reference(self, text: str) -> list[int]:
        """Encode with the pure-Python reference: split on specials, pre-tokenize, replay merges."""
        ids: list[int] = []
        for s, e, special in self._segments(text):
            if special:
                ids.append(self.special_tokens[text[s:e]])
            else:
                for piece in self._pat.findall(text, s, e):
                    ids.extend(self._encode_pretoken(piece))
        return ids

    # ---- fast path --------------------------------------------------------------------------
    @property
    def fast_encoding(self):
        """The tiktoken.Encoding equal to this tokenizer, or None when the ids are not in merge order."""
        if not self._fast_checked:
            from cookmind.tokenizer.fast_encode import build_tiktoken

            self._fast = build_tiktoken(self)
            self._fast_checked = True
        return self._fast

    def encode(self, text: str) -> list[int]:
        """Text -> ids. Special tokens in the text become their ids; everything else is byte-level BPE."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        fast = self.fast_encoding
        if fast is None:
            return self.encode_reference(text)
        return fast.encode(text, allowed_special="all")

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Encode many texts in parallel (tiktoken threads release the GIL; otherwise a process pool)."""
        texts = list(texts)
        fast = self.fast_encoding
        if fast is not None:
            # one task per thread over a contiguous slice: per-text futures cost more than short texts do
            from concurrent.futures import ThreadPoolExecutor

            n = max(1, min(num_threads or os.cpu_count() or 1, len(texts)))
            step = -(-len(texts) // n) if texts else 1
            groups = [texts[i:i + step] for i in range(0, len(texts), step)]
            with ThreadPoolExecutor(n) as ex:
                parts = ex.map(lambda g: [fast.encode(t, allowed_special="all") for t in g], groups)
            return [ids for part in parts for ids in part]
        if sum(len(t) for t in texts) < (1 << 20):
            return [self.encode_reference(t) for t in texts]
        from cookmind.tokenizer.pretokenize import _mp_context

        with _mp_context().Pool(num_threads or os.cpu_count() or 1) as pool:
            return pool.map(self.encode_reference, texts, chunksize=max(1, len(texts) // 64))

    def _last_safe_cut(self, buf: str) -> int:
        """Largest p such that encode(buf[:p]) + encode(buf[p:] + more) == encode(buf + more); 0 if none."""
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
        if self._special_re is not None and best < limit:
            for m in self._special_re.finditer(buf, best):
                if m.start() + self._max_special <= len(buf):  # no longer special could still start here
                    best = max(best, m.end())
        return best

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Yield ids for a stream of strings (e.g. a file's lines) with memory independent of its length.

        Text is held back only up to the last cut that cannot change the ids (see patterns.py).
        """
        buf = ""
        for chunk in iterable:
            buf += chunk
            cut = self._last_safe_cut(buf)
            if cut:
                yield from self.encode(buf[:cut])
                buf = buf[cut:]
        if buf:
            yield from self.encode(buf)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; byte sequences that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Ids -> the raw bytes they stand for."""
        try:
            return b"".join(self.vocab[int(i)] for i in ids)
        except KeyError as exc:
            raise TokenizerError(f"id {exc.args[0]} is not in the vocabulary (ids run 0..{self.vocab_size - 1})") from None

    # ---- chat -------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tools: Sequence[dict] | None = None) -> str:
        """The ChatML prompt string (identical to the Jinja chat_template in tokenizer_config.json)."""
        return render_text(messages, add_generation_prompt, tools)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False,
               tools: Sequence[dict] | None = None) -> tuple[list[int], list[int]]:
        """(ids, assistant_mask) for a conversation; ids == encode(apply_chat_template(...)).

        mask[i] = 1 for tokens of assistant content (reasoning, text, tool calls) and its <|im_end|>;
        a pre-token that straddles the start of assistant content (content that begins with
        whitespace) counts as assistant.
        """
        if self.im_start_id is None or self.im_end_id is None:
            raise TokenizerError(f"this tokenizer has no {IM_START}/{IM_END} special tokens; "
                                 "train it with --special-token for both to render chats")
        segs = chat_segments(messages, add_generation_prompt, tools)
        text = "".join(t for t, _ in segs)
        charmask = bytearray()
        changes: list[int] = []  # char positions where the target flag flips
        for t, target in segs:
            if charmask and charmask[-1] != target:
                changes.append(len(charmask))
            charmask += (b"\x01" if target else b"\x00") * len(t)
        fast = self.fast_encoding if safe_cut_kind(self.pattern) is not None else None
        ids: list[int] = []
        mask: list[int] = []
        for s, e, special in self._segments(text):
            if special:
                ids.append(self.special_tokens[text[s:e]])
                mask.append(charmask[s])
                continue
            cuts = changes[bisect.bisect_right(changes, s):bisect.bisect_left(changes, e)]
            if fast is not None and all(self._header_cut_is_safe(text, s, q) for q in cuts):
                for a, b in zip([s, *cuts], [*cuts, e]):
                    piece_ids = fast.encode_ordinary(text[a:b])
                    ids.extend(piece_ids)
                    mask.extend([charmask[a]] * len(piece_ids))
                continue
            for m in self._pat.finditer(text, s, e):
                piece_ids = self._encode_pretoken(m.group())
                ids.extend(piece_ids)
                mask.extend([1 if any(charmask[m.start():m.end()]) else 0] * len(piece_ids))
        return ids, mask

    @staticmethod
    def _header_cut_is_safe(text: str, start: int, q: int) -> bool:
        """Is q (just after a role header's single newline, before non-space content) a pre-token boundary?

        For the GPT-2 and GPT-4 patterns a lone "\n" after a non-space (or a special token) and before a
        non-space is its own pre-token, so both sides split the same alone as together.
        """
        return (text[q - 1] == "\n" and not text[q].isspace()
                and (q - 2 < start or not text[q - 2].isspace()))

    # ---- identity and persistence ------------------------------------------------------------
    def to_dict(self) -> dict:
        """Our JSON format: printable tokens (GPT-2 byte map), merges, specials, pattern."""
        return {
            "format": FORMAT,
            "version": 1,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            "vocab": [[i, token_to_str(self.vocab[i])] for i in sorted(self.vocab)],
            "merges": [[token_to_str(a), token_to_str(b)] for a, b in self.merges],
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = "<dict>") -> Tokenizer:
        """Rebuild a tokenizer from to_dict()'s output."""
        if d.get("format") != FORMAT:
            raise TokenizerError(f"{where}: not a cookmind tokenizer (format={d.get('format')!r}, expected {FORMAT!r})")
        try:
            vocab = {int(i): str_to_token(t) for i, t in d["vocab"]}
            merges = [(str_to_token(a), str_to_token(b)) for a, b in d["merges"]]
        except (KeyError, ValueError, TypeError) as exc:
            raise TokenizerError(f"{where}: malformed vocab or merges ({exc!r}); re-save the tokenizer") from None
        return cls(vocab, merges, {s: int(i) for s, i in d["special_tokens"].items()}, d["pattern"])

    def fingerprint(self) -> str:
        """Stable SHA-256 of vocab + merges + specials + pattern (token stores record it)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is not None:
            return cached
        d = self.to_dict()
        blob = json.dumps([d["pattern"], sorted(d["special_tokens"].items()), d["vocab"], d["merges"]],
                          ensure_ascii=False, separators=(",", ":"))
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
        """Load our format from a directory, else a GPT-2 style vocab.json + merges.txt, else a byte-level tokenizer.json."""
        directory = Path(directory)
        path = directory / FILE_NAME
        if path.is_file():
            try:
                d = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise TokenizerError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); re-save the tokenizer") from None
            return cls.from_dict(d, str(path))
        if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
            from cookmind.tokenizer.hf_format import load_gpt2_files

            return load_gpt2_files(directory / "vocab.json", directory / "merges.txt")
        if (directory / "tokenizer.json").is_file():
            from cookmind.tokenizer.hf_format import load_hf_tokenizer_json

            return load_hf_tokenizer_json(directory / "tokenizer.json")
        raise TokenizerError(f"no tokenizer in {directory}: expected {FILE_NAME} (or tokenizer.json, or vocab.json + merges.txt); "
                             "train one with `cookmind tokenizer train`")
