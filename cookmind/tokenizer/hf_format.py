"""Hugging Face formats: export tokenizer.json + tokenizer_config.json, import GPT-2 vocab.json + merges.txt.

The export is a byte-level BPE: Split(pattern, isolated) then ByteLevel (no regex) pre-tokenizers,
the BPE model with our merges, specials as added tokens (never split, never normalized) and
the ChatML Jinja template, so `transformers.AutoTokenizer.from_pretrained(dir)` encodes and
renders chats exactly as we do: `encode(text, split_special_tokens=True)` is our `encode(text)`, and
`apply_chat_template(messages, sanitize_control_tokens=True)` is our `render` (transformers' default reads
special tokens typed in the messages as tokens; only dict keys stay unsanitized there, see docs/GUIDE.md).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cookmind import text_input
from cookmind.tokenizer.bytes_unicode import str_to_token, token_to_str
from cookmind.tokenizer.chat_template import jinja_template
from cookmind.tokenizer.documents import PROBE, added_around, document_end_id
from cookmind.tokenizer.errors import TokenizerError

if TYPE_CHECKING:
    from cookmind.tokenizer.tokenizer import Tokenizer


def _added(tok: Tokenizer) -> list[dict]:
    return [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s, i in sorted(tok.special_tokens.items(), key=lambda x: x[1])
    ]


def hf_tokenizer_json(tok: Tokenizer) -> dict:
    """The tokenizer.json document for `tokenizers` / transformers."""
    vocab: dict[str, int] = {}
    for i in sorted(tok.vocab):
        vocab.setdefault(token_to_str(tok.vocab[i]), i)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added(tok),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": _bos_processor(tok),
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[token_to_str(a), token_to_str(b)] for a, b in tok.merges],
        },
    }


def _bos_processor(tok: Tokenizer) -> dict | None:
    """The post_processor that puts ``tok.bos_ids`` before every text, as the Hugging Face folder it came from did."""
    if not tok.bos_ids:
        return None
    inv = {i: s for s, i in tok.special_tokens.items()}
    bos = [{"SpecialToken": {"id": inv[i], "type_id": 0}} for i in tok.bos_ids]
    return {
        "type": "TemplateProcessing",
        "single": [*bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [*bos, {"Sequence": {"id": "A", "type_id": 0}}, *bos, {"Sequence": {"id": "B", "type_id": 0}}],
        "special_tokens": {inv[i]: {"id": inv[i], "ids": [i], "tokens": [inv[i]]} for i in tok.bos_ids},
    }


def hf_tokenizer_config(tok: Tokenizer) -> dict:
    """tokenizer_config.json: the tokenizer class, special-token roles and the Jinja chat_template."""
    inv = {i: s for s, i in tok.special_tokens.items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "clean_up_tokenization_spaces": False,
        "bos_token": inv[tok.bos_ids[0]] if tok.bos_ids else None,
        "eos_token": inv.get(tok.eos_id) if tok.eos_id is not None else None,
        "pad_token": inv.get(tok.pad_id) if tok.pad_id is not None else None,
        "unk_token": None,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in _added(tok)},
        "chat_template": jinja_template(),
    }


def load_gpt2_files(
    vocab_path: str | os.PathLike,
    merges_path: str | os.PathLike,
    special_tokens: Sequence[str] | None = None,
    pattern: str = "gpt2",
) -> Tokenizer:
    """Import a GPT-2 style vocab.json (printable token -> id) and merges.txt ("a b" per line).

    special_tokens defaults to every vocab.json entry that is neither one byte nor made by a merge, in id order:
    BPE can never produce such a token, so it is a special one (GPT-2's <|endoftext|>; the five of a cookmind
    tokenizer exported with ``--format gpt2``, which then imports back as the same tokenizer).
    """
    from cookmind.tokenizer.tokenizer import Tokenizer

    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    for p in (vocab_path, merges_path):
        if not text_input.readable_as_file(p):  # a pipe is read like a file
            what = "is a folder" if p.is_dir() else "does not exist"
            raise TokenizerError(f"{p} {what}; pass a GPT-2 style vocab.json and merges.txt")
    try:
        table = json.loads(vocab_path.read_text(encoding="utf-8-sig"))  # -sig: a leading byte-order mark is no text
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{vocab_path}: not a JSON object of token -> id ({exc})") from None
    if not isinstance(table, dict):
        raise TokenizerError(f"{vocab_path}: not a JSON object of token -> id (got a {type(table).__name__})")
    _check_ids(table, vocab_path)
    merges = _read_merges(merges_path)
    if special_tokens is None:
        made = {a + b for a, b in merges}
        special_tokens = [t for t, _ in sorted(table.items(), key=lambda kv: int(kv[1])) if _unmade(t, made)]
    vocab: dict[int, bytes] = {}
    for t, i in table.items():
        try:
            vocab[int(i)] = t.encode("utf-8") if t in special_tokens else str_to_token(t)
        except KeyError:
            raise TokenizerError(f"{vocab_path}: token {t!r} (id {i}) is not in GPT-2's byte-to-unicode form") from None
    return Tokenizer(vocab, merges, list(special_tokens), pattern)


def _check_ids(table: dict, where) -> None:
    """TokenizerError naming the token whose id in a token -> id ``table`` is not a whole number 0 or more, or is
    another token's too (one of the two would be lost: a byte's, and the vocabulary 'lacks' it)."""
    owner: dict[int, str] = {}
    for t, i in table.items():
        if type(i) is not int or i < 0:
            raise TokenizerError(f"{where}: token {t!r} has id {i!r}, which is not a whole number 0 or more")
        if i in owner:
            raise TokenizerError(
                f"{where}: token {t!r} has id {i}, also the id of {owner[i]!r}; each token needs an id of its own"
            )
        owner[i] = t


def _unmade(token: str, made: set[bytes]) -> bool:
    """Whether vocab.json's ``token`` is more than one byte and no merge makes it (so only a special token)."""
    try:
        raw = str_to_token(token)
    except KeyError:
        return False  # not byte-level text: the loop that fills the vocabulary names it
    return len(raw) > 1 and raw not in made


def _read_merges(merges_path: Path) -> list[tuple[bytes, bytes]]:
    """The merges of a GPT-2 style merges.txt ("a b" per line, an optional "#version" first line)."""
    merges = []
    try:
        lines = text_input.read_utf8(merges_path).split("\n")
    except ValueError as exc:  # bad UTF-8, named by file:line
        raise TokenizerError(str(exc)) from None
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{merges_path}:{lineno}: expected two tokens separated by one space, got {line!r}")
        try:
            merges.append((str_to_token(parts[0]), str_to_token(parts[1])))
        except KeyError:
            raise TokenizerError(f"{merges_path}:{lineno}: {line!r} is not in GPT-2's byte-to-unicode form") from None
    return merges


def _pattern_from_pre_tokenizer(pre: dict | None, where: str) -> str:
    """The split regex of a byte-level pre-tokenizer: Split(regex) + ByteLevel, or ByteLevel(use_regex)."""
    from cookmind.tokenizer.patterns import GPT2_PATTERN

    if pre is None:
        raise TokenizerError(f"{where}: no pre_tokenizer; only byte-level BPE tokenizers can be imported")
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    pattern = None
    for step in steps:
        if (
            step.get("type") == "Split"
            and "Regex" in step.get("pattern", {})
            and step.get("behavior") == "Isolated"
            and not step.get("invert")
        ):
            pattern = step["pattern"]["Regex"]
        elif step.get("type") == "ByteLevel":
            if step.get("add_prefix_space"):
                raise TokenizerError(f"{where}: ByteLevel add_prefix_space=true is not supported")
            if step.get("use_regex", True):
                pattern = pattern or GPT2_PATTERN
        else:
            raise TokenizerError(
                f"{where}: pre-tokenizer step {step.get('type')!r} is not supported "
                "(expected Split(regex, isolated) and ByteLevel)"
            )
    if pattern is None:
        raise TokenizerError(f"{where}: found no split regex in the pre_tokenizer")
    return pattern


def load_hf_tokenizer_json(path: str | os.PathLike) -> Tokenizer:
    """Import a byte-level BPE tokenizer.json (GPT-2, Qwen-style, or our own export).

    Added tokens become special tokens with their ids. Normalizers, byte fallback, dropout and
    ignore_merges change what the merges mean, so such files are refused with a clear error.
    """
    from cookmind.tokenizer.tokenizer import Tokenizer

    path = Path(path)
    if not text_input.readable_as_file(path):  # a pipe is read like a file
        raise TokenizerError(f"{path} {'is a folder' if path.is_dir() else 'does not exist'}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise TokenizerError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})"
        ) from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict):  # another JSON file: GPT-2's vocab.json (its token "model" has an id), a config
        vocab_like = isinstance(doc, dict) and bool(doc) and all(isinstance(v, int) for v in doc.values())
        raise TokenizerError(
            f'{path}: no "model" object: not a Hugging Face tokenizer.json'
            + ("; it looks like a GPT-2 vocab.json, which is read with its merges.txt" if vocab_like else "")
        )
    if model.get("type") != "BPE":
        raise TokenizerError(f"{path}: model type {model.get('type')!r} is not BPE")
    for key in ("byte_fallback", "ignore_merges", "dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise TokenizerError(f"{path}: model.{key}={model[key]!r} is not supported by cookmind's byte-level BPE")
    if doc.get("normalizer"):
        raise TokenizerError(f"{path}: a normalizer ({doc['normalizer'].get('type')}) is not supported")
    pattern = _pattern_from_pre_tokenizer(doc.get("pre_tokenizer"), str(path))
    if not isinstance(model.get("vocab"), dict):
        raise TokenizerError(f"{path}: model.vocab is not an object of token -> id; re-save the tokenizer")
    _check_ids(model["vocab"], path)
    if not isinstance(model.get("merges"), list):
        raise TokenizerError(f"{path}: model.merges is not a list of merges; re-save the tokenizer")
    specials = {}
    for a in doc.get("added_tokens") or []:
        if not (isinstance(a, dict) and isinstance(a.get("content"), str) and type(a.get("id")) is int):
            raise TokenizerError(f'{path}: added_tokens entry {a!r} needs a "content" text and an "id" number')
        specials[a["content"]] = a["id"]
    vocab: dict[int, bytes] = {i: s.encode("utf-8") for s, i in specials.items()}
    for t, i in model["vocab"].items():
        if i in vocab:
            continue
        try:
            vocab[i] = str_to_token(t)
        except KeyError:
            raise TokenizerError(f"{path}: token {t!r} is not in GPT-2's byte-to-unicode form") from None
    merges = []
    for r, m in enumerate(model["merges"]):
        try:
            a, b = m if isinstance(m, list) else m.split(" ")
            merges.append((str_to_token(a), str_to_token(b)))
        except (AttributeError, TypeError, ValueError, KeyError):
            raise TokenizerError(
                f"{path}: merge #{r} {m!r} is not two tokens in GPT-2's byte-to-unicode form; re-save the tokenizer"
            ) from None
    bos_ids = _added_before(doc, path)
    if not set(bos_ids) <= set(specials.values()):
        raise TokenizerError(
            f"{path}: its post_processor puts ids {bos_ids} before every text, not all of them added tokens; "
            "list them in its added_tokens"
        )
    return Tokenizer(vocab, merges, specials, pattern, eos_token=_eos_token(path.parent), bos_ids=bos_ids)


def _added_before(doc: dict, path: Path) -> list[int]:
    """The ids the post_processor of ``path``'s tokenizer.json document puts before every text (Llama's <s>), as the
    ``tokenizers`` library (transformers' backend) runs it."""
    if not doc.get("post_processor"):
        return []
    from tokenizers import Tokenizer as RustTokenizer

    try:
        raw = RustTokenizer.from_str(json.dumps(doc))
    except Exception as exc:  # noqa: BLE001 - the library says only what it could not parse
        raise TokenizerError(f"{path}: the tokenizers library cannot read it ({exc}); re-save the tokenizer") from None
    return added_around(raw.encode(PROBE).ids, raw.encode(PROBE, add_special_tokens=False).ids)[0]


def _eos_token(directory: Path) -> str | None:
    """The EOS token a Hugging Face folder names: tokenizer_config.json's eos_token, else special_tokens_map.json's."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            eos = json.loads(path.read_text(encoding="utf-8-sig")).get("eos_token")  # -sig: as tokenizer.json
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            raise TokenizerError(f"{path}: not a JSON object ({exc}); re-save the tokenizer") from None
        if eos is not None:
            return eos.get("content") if isinstance(eos, dict) else eos
    return None


def transformers_differences(directory: str | os.PathLike, tok, *, packing: bool = False) -> list[str]:
    """What transformers does with the tokenizer files in ``directory`` that ``tok`` (loaded from them) does not:
    tokens its post_processor adds around every text that cookmind does not put there (the ``bos_ids`` before
    each of pack's documents and each plain prompt, Llama's ``<s>``, are; with ``packing`` the end of a document
    too), a chat template that renders otherwise than ours. One sentence each; [] when they agree or there are no
    such files (cookmind's own folders)."""
    directory = Path(directory)
    if (directory / "cookmind_tokenizer.json").is_file() or not (directory / "tokenizer.json").is_file():
        return []
    from cookmind.tokenizer.hf_adapter import auto_tokenizer

    try:
        with warnings.catch_warnings():  # what transformers says of the files is said where they are loaded for use
            warnings.simplefilter("ignore")
            hf = auto_tokenizer(directory)
    except (OSError, ValueError, TypeError):
        return []  # loading it is not what this checks; cookmind's own load has succeeded
    found = []
    before, after = added_around(hf.encode(PROBE), hf.encode(PROBE, add_special_tokens=False))
    # pack opens each document, and generate/serve/evals each plain prompt, with the tokenizer's bos_ids
    # (tokenizer/documents.py); pack ends each document with its end id, a prompt has no end
    before = [] if before == list(tok.bos_ids) else before
    if packing:
        after = [] if after == [document_end_id(tok)] else after
    if before or after:
        added = " and ".join(
            f"{', '.join(map(repr, hf.convert_ids_to_tokens(ids)))} {side}"
            for side, ids in (("before", before), ("after", after))
            if ids
        )
        does_not = (
            "cookmind's pack does not put it around each document"
            if packing
            else "cookmind's plain prompts do not get it (generate, serve, eval gsm8k and mmlu)"
        )
        found.append(
            f"{directory / 'tokenizer.json'}: its post_processor adds {added} every text in transformers; {does_not}"
        )
    template = getattr(hf, "chat_template", None)
    if template and hasattr(tok, "render") and getattr(tok, "im_start_id", None) is not None:
        chat = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ]
        try:
            theirs_text = hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that fails on a plain chat differs from ours too
            theirs_text = None
        ours_text = tok.apply_chat_template(chat, add_generation_prompt=True)
        if theirs_text != ours_text:
            at = next((i for i, (a, b) in enumerate(zip(theirs_text or "", ours_text)) if a != b), None)
            at = min(len(theirs_text or ""), len(ours_text)) if at is None else at
            found.append(
                f"{directory}: its chat template renders chats otherwise than cookmind's ChatML (from character {at}: "
                f"{(theirs_text or '')[at : at + 30]!r} vs {ours_text[at : at + 30]!r}); "
                "cookmind's chat, serve and SFT packing render its own"
            )
    return found
