"""Encoding: reference encoder vs a naive one, tiktoken fast path vs reference, GPT-2 vs tiktoken, round trips."""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_fixtures import MULTILINGUAL_WORDS

from cookmind.tokenizer import (
    DEFAULT_SPECIAL_TOKENS,
    GPT2_PATTERN,
    Tokenizer,
    TokenizerError,
    load_gpt2_files,
    train_bpe,
)

WORDS = [
    *MULTILINGUAL_WORDS,
    "<|",
    "|>",
    "endoftext",
    "<think",
    "\n\n",
    "\r\n",
]


def random_text(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    return "".join(
        rng.choice(WORDS) + rng.choice([" ", "", "\n", "  ", ".", "<|endoftext|>", "<think>"]) for _ in range(n_words)
    )


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    from tests.conftest import SHARED_DATA

    text = random_text(0, 4000)
    if SHARED_DATA.is_dir():
        text += (SHARED_DATA / "text/corpus.en").read_text()[:40000]
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text(text, encoding="utf-8")
    vocab, merges = train_bpe(path, 1200, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    return Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)


def naive_encode(text: str, tok: Tokenizer, specials: bool = True) -> list[int]:
    """The definition: split on specials (longest first) if allowed, pre-tokenize, then apply every merge in order."""
    specials = sorted(tok.special_tokens, key=len, reverse=True) if specials else ["(?!)"]
    inv = {b: i for i, b in sorted(tok.vocab.items(), reverse=True) if i not in tok.special_tokens.values()}
    out: list[int] = []
    cache: dict[str, list[int]] = {}
    for part in regex.split("(" + "|".join(s if s == "(?!)" else regex.escape(s) for s in specials) + ")", text):
        if part in tok.special_tokens:
            out.append(tok.special_tokens[part])
            continue
        for piece in regex.findall(GPT2_PATTERN, part):
            if piece not in cache:
                toks = [bytes([b]) for b in piece.encode("utf-8")]
                for a, b in tok.merges:
                    i, nt = 0, []
                    while i < len(toks):
                        if i + 1 < len(toks) and toks[i] == a and toks[i + 1] == b:
                            nt.append(a + b)
                            i += 2
                        else:
                            nt.append(toks[i])
                            i += 1
                    toks = nt
                cache[piece] = [inv[t] for t in toks]
            out.extend(cache[piece])
    return out


def test_reference_encoder_equals_naive_definition(tok):
    text = random_text(1, 600)
    assert tok.encode_reference(text, allowed_special="all") == naive_encode(text, tok)
    assert tok.encode_reference(text) == naive_encode(text, tok, specials=False)


def test_fast_path_equals_reference_on_random_and_real_text(tok, shared_data):
    assert tok.fast_encoding is not None
    texts = [random_text(s, 800) for s in range(2, 6)]
    texts.append((shared_data / "text/corpus.en").read_text()[40000:90000])
    texts.append((shared_data / "text/tinystories_sample.txt").read_text())
    texts.append((shared_data / "gsm8k/test.jsonl").read_text()[:30000])
    rng = random.Random(7)
    texts.append("".join(chr(rng.randint(32, 0x2FFF)) for _ in range(5000)))
    for t in texts:
        assert tok.encode(t) == tok.encode_reference(t)
        assert tok.encode(t, allowed_special="all") == tok.encode_reference(t, allowed_special="all")


def test_lone_surrogates_encode_as_u_fffd_in_both_encoders(tok):
    """A lone surrogate (JSON's "\\ud800", which json.loads reads) is no character UTF-8 can hold: the fast path
    (tiktoken) read each as U+FFFD, the reference encoder, the definition, ended in UnicodeEncodeError, so the two
    were not the same encoder. Both now give the ids of the text with U+FFFD written in its place."""
    for text, written in (
        ("a \ud800 b", "a \ufffd b"),
        ("x\udfffy\ud83d", "x\ufffdy\ufffd"),
        ("lone \udc00 then <|endoftext|> and \ud800\ud800", "lone \ufffd then <|endoftext|> and \ufffd\ufffd"),
    ):
        expected = tok.encode_reference(written)
        assert tok.encode_reference(text) == expected == tok.encode(text)
        assert tok.encode_reference(text, allowed_special="all") == tok.encode_reference(written, allowed_special="all")


def test_special_tokens_become_single_ids_only_when_allowed(tok):
    text = "a<|im_start|>user\nhi<|im_end|><|endoftext|>"
    ids = tok.encode(text, allowed_special="all")
    assert ids.count(tok.im_start_id) == 1 and ids.count(tok.im_end_id) == 1 and ids[-1] == tok.eos_id
    assert tok.eos_id == 256 and tok.pad_id == tok.eos_id
    only_eos = tok.encode(text, allowed_special={"<|endoftext|>"})
    assert only_eos[-1] == tok.eos_id and tok.im_start_id not in only_eos and tok.im_end_id not in only_eos
    plain = tok.encode(text)  # the default: text that spells a special token is text
    assert not set(plain) & set(tok.special_tokens.values()) and tok.decode(plain) == text
    assert plain == naive_encode(text, tok, specials=False)


def test_allowed_special_errors_are_clear(tok):
    with pytest.raises(TokenizerError, match="not special tokens of this tokenizer"):
        tok.encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(TokenizerError, match="wrap one token in a set"):
        tok.encode("x", allowed_special="<|endoftext|>")


def test_overlapping_specials_longest_wins():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = Tokenizer(vocab, [], ["<s>", "<s><s>", "s>x"])
    ids = tok.encode("<s><s><s>x", allowed_special="all")
    assert ids == [tok.special_tokens["<s><s>"], tok.special_tokens["<s>"], ord("x")]
    assert tok.fast_encoding is None  # tiktoken does not promise longest-first; the reference path is used
    assert tok.decode(ids) == "<s><s><s>x"


def test_decode_replaces_invalid_utf8(tok):
    assert tok.decode([0xFF, ord("a")]) == "\ufffda"
    assert tok.decode_bytes([0xE2, 0x82]) == b"\xe2\x82"
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.decode([10**9])


def test_encode_iterable_equals_encode_and_streams(tok):
    text = random_text(9, 1500)
    rng = random.Random(3)
    cuts = sorted(rng.sample(range(len(text)), 300))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]  # cuts land inside specials too
    assert list(tok.encode_iterable(chunks)) == tok.encode(text)
    assert list(tok.encode_iterable(text.splitlines(keepends=True))) == tok.encode(text)
    assert list(tok.encode_iterable(chunks, allowed_special="all")) == tok.encode(text, allowed_special="all")

    consumed = 0

    def endless():
        nonlocal consumed
        for line in itertools.cycle(["the cat sat.\n", "on the mat <|endoftext|>\n"]):
            consumed += 1
            yield line

    first = list(itertools.islice(tok.encode_iterable(endless()), 200))
    assert len(first) == 200 and consumed < 200  # ids come out before the input ends


def test_encode_batch_equals_encode(tok):
    texts = [random_text(s, 50) for s in range(20)]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, allowed_special="all") == [tok.encode(t, allowed_special="all") for t in texts]


special_pieces = st.sampled_from(
    [
        "<|endoftext|>",
        "<|im_start|>",
        "<|",
        "|>",
        "endoftext",
        "<think>",
        "</think",
        "<",
        "\n",
        " ",
        "\r\n",
        "'s",
        "  \t",
    ]
)


# The pre-tokenizer regex runs on two engines (Python's `regex` for the reference, Rust's for tiktoken) that carry
# different Unicode versions: a code point assigned only recently (U+18D09 is unassigned in Python 3.11's Unicode
# 14 tables, a letter to `regex`, not to tiktoken) splits differently. Draw from code points Unicode 14 assigns.
assigned_text = st.text(st.characters(exclude_categories=("Cn", "Cs")), max_size=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(assigned_text, special_pieces), max_size=12).map("".join))
def test_roundtrip_property(tok, s):
    for allowed in ((), "all"):
        ids = tok.encode(s, allowed_special=allowed)
        assert tok.decode(ids) == s
        assert tok.encode_reference(s, allowed_special=allowed) == ids


def _tiktoken_gpt2(shared_data, cache_dir, monkeypatch):
    """tiktoken's own `gpt2` encoding, built offline from the shared files through tiktoken's cache."""
    import tiktoken
    import tiktoken.registry

    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    files = {
        "vocab.bpe": b"#version: 0.2\n" + (shared_data / "gpt2/merges.txt").read_bytes(),
        "encoder.json": (shared_data / "gpt2/vocab.json").read_bytes(),
    }
    for name, data in files.items():
        (cache_dir / hashlib.sha1((base + name).encode()).hexdigest()).write_bytes(data)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache_dir))
    tiktoken.registry.ENCODINGS.pop("gpt2", None)
    try:
        return tiktoken.get_encoding("gpt2")
    finally:
        tiktoken.registry.ENCODINGS.pop("gpt2", None)


def test_gpt2_import_equals_tiktoken_gpt2(shared_data, tmp_path, monkeypatch):
    ref = _tiktoken_gpt2(shared_data, tmp_path, monkeypatch)
    gpt2 = load_gpt2_files(shared_data / "gpt2/vocab.json", shared_data / "gpt2/merges.txt")
    assert gpt2.vocab_size == ref.n_vocab == 50257 and gpt2.eos_id == ref.eot_token
    text = (
        (shared_data / "text/tinystories_sample.txt").read_text()
        + random_text(11, 400)
        + (shared_data / "text/corpus.en").read_text()[:20000]
    )
    expected = ref.encode(text, allowed_special="all")
    assert gpt2.encode_reference(text, allowed_special="all") == expected
    assert gpt2.encode(text, allowed_special="all") == expected
    assert gpt2.decode(expected) == text
    assert gpt2.encode(text) == gpt2.encode_reference(text) == ref.encode_ordinary(text)


def test_custom_pattern_streams_at_special_tokens():
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"abc"}
    tok = Tokenizer(vocab, [(b"a", b"b"), (b"ab", b"c")], ["<|endoftext|>"], pattern=r"\S+|\s+")
    text = "abc abcc <|endoftext|>xabc\n" * 20
    chunks = [text[i : i + 7] for i in range(0, len(text), 7)]
    assert list(tok.encode_iterable(chunks)) == tok.encode(text) == tok.encode_reference(text)
    every = tok.encode(text, allowed_special="all")
    assert (
        list(tok.encode_iterable(chunks, allowed_special="all"))
        == every
        == tok.encode_reference(text, allowed_special="all")
    )
    assert tok.encode("abc") == [257] and tok.eos_id == 258


def test_tokenizer_pickles_for_worker_processes(tok):
    import pickle

    text = random_text(12, 200)
    tok.encode(text)  # builds the tiktoken encoding, which stays behind
    back = pickle.loads(pickle.dumps(tok))
    assert back.encode(text) == tok.encode(text) and back.fingerprint() == tok.fingerprint()
