"""BPE training: exact against a naive reference trainer, parallel == serial, and clear errors."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
import regex
from tokenizer_fixtures import MULTILINGUAL_WORDS

from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, GPT2_PATTERN, GPT4_PATTERN, TokenizerError, train_bpe


def naive_train(text: str | list[str], vocab_size: int, specials: list[str], pattern: str = GPT2_PATTERN):
    """The textbook trainer: recount every pair each step, merge the max (count, (bytes_a, bytes_b)). ``text``: a
    plain text file's text, its documents split at <|endoftext|> and stripped as pack reads them (another special
    token spelled there is text, as pack encodes it); or a list of records' texts, each a document whole."""
    docs = [d.strip() for d in text.split("<|endoftext|>")] if isinstance(text, str) else text
    words = Counter()
    for d in docs:
        for t in regex.findall(pattern, d):
            words[tuple(bytes([b]) for b in t.encode("utf-8"))] += 1
    vocab = [bytes([i]) for i in range(256)] + [s.encode() for s in specials]
    known = set(vocab[:256])
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        new = best[0] + best[1]
        if new not in known:  # an existing byte string keeps its id (no new vocab entry)
            known.add(new)
            vocab.append(new)
        out = Counter()
        for w, n in words.items():
            nw, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    nw.append(new)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            out[tuple(nw)] += n
        words = out
    return dict(enumerate(vocab)), merges


def multilingual(seed: int, n: int) -> str:
    rng = random.Random(seed)
    words = MULTILINGUAL_WORDS
    lines = []
    for _ in range(n):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) + rng.choice([".", "", " ", "!?"]))
    return "\n".join(lines) + "\n"


def corpora(shared):
    out = {
        "multilingual": (multilingual(0, 300), 420),
        "specials": ("hello<|endoftext|>world <|im_start|>user\nhi<|im_end|>\n" * 30 + multilingual(1, 60), 330),
        "aaaa": ("aaaa aaa aa a aaaaaa b" * 3 + "\n", 270),
        # whitespace round a separator and at the file's ends is no document's: pack strips each
        "stripped": ("\n\n  A cat sat.\n\n<|endoftext|>\n\n" * 30 + multilingual(4, 40) + " \n\n\n", 330),
    }
    if shared is not None:
        out["corpus.en"] = ((shared / "text/corpus.en").read_text()[:12000], 600)
        out["tinystories"] = ((shared / "text/tinystories_sample.txt").read_text(), 500)
    return out


@pytest.fixture(scope="module")
def shared_or_none(request):
    from tests.conftest import SHARED_DATA

    return SHARED_DATA if SHARED_DATA.is_dir() else None


@pytest.mark.parametrize("name", ["multilingual", "specials", "aaaa", "stripped", "corpus.en", "tinystories"])
def test_merges_equal_naive_reference(tmp_path, shared_or_none, name):
    table = corpora(shared_or_none)
    if name not in table:
        pytest.skip("../shared/data is absent: set COOKMIND_SHARED_DATA=/path/to/data to run this case")
    text, vocab_size = table[name]
    path = tmp_path / "in.txt"
    path.write_text(text, encoding="utf-8")
    specials = DEFAULT_SPECIAL_TOKENS
    vocab, merges = train_bpe(path, vocab_size, specials, workers=1, progress=False)
    ref_vocab, ref_merges = naive_train(text, vocab_size, specials)
    assert merges == ref_merges
    assert vocab == ref_vocab
    assert len(vocab) <= vocab_size


@pytest.mark.parametrize("min_sites", [0, 3])
@pytest.mark.parametrize("name", ["multilingual", "specials", "aaaa", "stripped", "corpus.en"])
def test_array_merges_equal_naive_reference(tmp_path, shared_or_none, monkeypatch, name, min_sites):
    # the first merges run in numpy (_merge_arrays) while they touch many places: here all of them (0), or until
    # the places fall under 3 and the str loop takes over, on corpora small enough that neither would by default
    from cookmind.tokenizer import bpe_train

    table = corpora(shared_or_none)
    if name not in table:
        pytest.skip("../shared/data is absent: set COOKMIND_SHARED_DATA=/path/to/data to run this case")
    monkeypatch.setattr(bpe_train, "_MIN_SITES", min_sites)
    text, vocab_size = table[name]
    text += "aaaaaaa abababa aa aaa ababab bbbb\n" * 3  # runs of one pair, and of a pair's repeats
    path = tmp_path / "in.txt"
    path.write_text(text, encoding="utf-8")
    vocab, merges = train_bpe(path, vocab_size, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    assert (vocab, merges) == naive_train(text, vocab_size, DEFAULT_SPECIAL_TOKENS)


def test_gpt4_pattern_equals_naive(tmp_path):
    text = multilingual(2, 150) + "x = 12345678; y=foo.bar()\r\n" * 4
    path = tmp_path / "in.txt"
    path.write_text(text, encoding="utf-8")
    _, merges = train_bpe(path, 350, ["<|endoftext|>"], pattern="gpt4", workers=1, progress=False)
    assert merges == naive_train(text, 350, ["<|endoftext|>"], GPT4_PATTERN)[1]


def test_parallel_chunks_equal_one_chunk(tmp_path, shared_or_none):
    # tiny chunks force many cuts (at safe newlines) across two worker processes and two files
    text = multilingual(3, 400)
    if shared_or_none is not None:
        text += (shared_or_none / "text/corpus.en").read_text()[:20000]
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(text[: len(text) // 2] + "<|endoftext|>", encoding="utf-8")
    b.write_text(text[len(text) // 2 :], encoding="utf-8")
    one = train_bpe([a, b], 500, DEFAULT_SPECIAL_TOKENS, workers=1, chunk_bytes=1 << 30, progress=False)
    many = train_bpe([a, b], 500, DEFAULT_SPECIAL_TOKENS, workers=2, chunk_bytes=2000, progress=False)
    assert one == many


def test_special_token_text_in_a_record_is_learned_as_the_text_pack_encodes(tmp_path):
    # pack encodes <|endoftext|> typed in a JSON record's text as its 13 characters (text a user typed never becomes
    # a control token), and training split the text there: its merges were learned over other pre-tokens than pack's
    import json

    texts = ["ab<|endoftext|>ab <|im_start|>cd|>", "<|endoftext|>", "x <|im_end|><|endoftext|>y"] * 3
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    vocab, merges = train_bpe(path, 300, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    assert (vocab, merges) == naive_train(texts, 300, DEFAULT_SPECIAL_TOKENS)
    assert (b"<", b"|") in merges  # only the marker's bytes hold that pair
    # a record that is nothing but the marker is text to learn, not an empty corpus
    path.write_text(json.dumps({"text": "<|endoftext|>"}) + "\n", encoding="utf-8")
    assert train_bpe(path, 300, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)[1][0] in {(b"<", b"|"), (b"|", b">")}


def test_special_tokens_are_never_merged_across(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("ab<|endoftext|>" * 20 + "ab", encoding="utf-8")
    vocab, merges = train_bpe(path, 300, ["<|endoftext|>"], workers=1, progress=False)
    assert vocab[256] == b"<|endoftext|>"
    assert merges == [(b"a", b"b")]  # the only pair inside the text between specials
    assert all(b"<|" not in a + b for a, b in merges)


def test_vocab_ids_are_bytes_then_specials_then_merges(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("low lower lowest " * 10, encoding="utf-8")
    vocab, merges = train_bpe(path, 270, ["<|endoftext|>", "<|im_start|>"], workers=1, progress=False)
    assert [vocab[i] for i in (0, 65, 255)] == [b"\x00", b"A", b"\xff"]
    assert (vocab[256], vocab[257]) == (b"<|endoftext|>", b"<|im_start|>")
    assert [vocab[258 + k] for k in range(len(vocab) - 258)] == [a + b for a, b in merges]


@pytest.mark.parametrize("specials", [["a"], ["<|endoftext|>", "a", "a"], ["\n"]])
def test_a_one_byte_special_token_is_refused(tmp_path, specials, capsys):
    # it was given an id past the vocabulary: --vocab-size 500 gave 501 ids, specials {"a": 500}, and id 256 unused
    from cookmind.cli import main

    path = tmp_path / "in.txt"
    path.write_text("low lower lowest " * 10, encoding="utf-8")
    one = next(s for s in specials if len(s) == 1)
    with pytest.raises(
        TokenizerError, match=re.escape(f"special token {one!r} is one byte, which is already the byte token")
    ):
        train_bpe(path, 270, specials, workers=1, progress=False)
    argv = ["tokenizer", "train", "--input", str(path), "--vocab-size", "270", "--out", str(tmp_path / "t"), "--quiet"]
    assert main([*argv, "--special-token", *specials]) == 2
    assert "a special token needs two bytes or more" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        train_bpe(tmp_path / "nope.txt", 300, [])


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(TokenizerError, match="no text"):
        train_bpe(tmp_path / "e.txt", 300, [])
    (tmp_path / "s.txt").write_text("<|endoftext|><|endoftext|>")
    with pytest.raises(TokenizerError, match="no text"):
        train_bpe(tmp_path / "s.txt", 300, ["<|endoftext|>"])


def test_vocab_size_too_small(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(TokenizerError, match=r"too small.*>= 261"):
        train_bpe(tmp_path / "a.txt", 260, DEFAULT_SPECIAL_TOKENS)


def test_non_utf8_strict_names_line_and_replace_policy(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line\nsecond \xff\xfe line\n")
    with pytest.raises(TokenizerError, match=r"bad.txt:2: byte offset 17"):
        train_bpe(path, 300, [], workers=1)
    vocab, merges = train_bpe(path, 300, [], workers=1, utf8_errors="replace", progress=False)
    assert naive_train("good line\nsecond \ufffd\ufffd line\n", 300, [])[1] == merges


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("x", "leaves 92 of 93 characters unmatched"),  # encode("hello x world") gave only the x
        (r"\w+", "leaves 40 of 93 characters unmatched"),
        (r"(\w+)|\s+|.", "has capturing groups"),  # findall would return only the group's text
    ],
)
def test_a_pattern_that_does_not_cover_all_text_is_refused(tmp_path, pattern, message):
    src = tmp_path / "c.txt"
    src.write_text("hello x world, again and again\n" * 20)
    with pytest.raises(ValueError, match=message):
        train_bpe(src, 300, DEFAULT_SPECIAL_TOKENS, pattern=pattern, workers=1, progress=False)
    # one that ends with a catch-all covers the text, and the encoder keeps every character
    from cookmind.tokenizer import Tokenizer

    vocab, merges = train_bpe(src, 300, DEFAULT_SPECIAL_TOKENS, pattern=r"\w+|\s+|.", workers=1, progress=False)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS, pattern=r"\w+|\s+|.")
    assert tok.decode(tok.encode("hello x world, 漢字!")) == "hello x world, 漢字!"


def test_ascii_patterns_split_ascii_text_as_their_pattern():
    # count_text pre-tokenizes ASCII text with re and an ASCII spelling of the pattern: it must split alike
    from cookmind.tokenizer.pretokenize import ASCII_PATTERNS, ascii_findall

    rng = random.Random(0)
    alphabet = [chr(c) for c in range(128)]
    texts = ["".join(alphabet), "it's  we'll\t\n\n  x  \x1c\x1f y '\n 12ab  ?? \r\n", ""]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(3000)]
    texts += [" ".join(rng.choice(["a", "'s", "  ", "\n", "1", "!?", "\x0b", "'ll", "Z9", "\x1d"]) for _ in range(30))]
    for pattern in ASCII_PATTERNS:
        full, fast = regex.compile(pattern).findall, ascii_findall(pattern)
        for text in texts:
            assert fast(text) == full(text), repr(text)


def test_a_corpus_too_small_for_the_vocabulary_asked_is_a_warning_line_of_the_stage(tmp_path, capsys):
    # "aaaa" is one pre-token: its merges are (a, a) then (aa, aa), and then no pair is left: 256 bytes + 5 specials
    # + 2 merges. It printed "note: the corpus ran out of pairs ...", without the stage nor what to do.
    import json

    from cookmind.cli import main as cli_main

    (tmp_path / "a.txt").write_text("aaaa")
    argv = ["tokenizer", "train", "--input", str(tmp_path / "a.txt"), "--vocab-size", "1000"]
    assert cli_main([*argv, "--out", str(tmp_path / "tok"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["vocab_size"] == 256 + len(DEFAULT_SPECIAL_TOKENS) + 2 == 263
    assert err == (
        "cookmind tokenizer train: warning: the corpus ran out of pairs to merge at 263 tokens, short of --vocab-size "
        "1000: the tokenizer written has 263; train on more text for a larger one\n"
    )


def test_special_tokens_without_endoftext_get_it_and_the_user_is_told(tmp_path, capsys):
    # --special-token without <|endoftext|> wrote a tokenizer that `cookmind pack` then refused ("has neither
    # <|endoftext|> nor an EOS token"): pack ends every document with it, so training adds it after the user's
    # specials (their ids stay as asked) and says so
    from cookmind.cli import main
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    path = tmp_path / "in.txt"
    path.write_text("low lower lowest " * 10, encoding="utf-8")
    argv = ["tokenizer", "train", "--input", str(path), "--vocab-size", "262", "--out", str(tmp_path / "t"), "--quiet"]
    assert main([*argv, "--special-token", "<|im_start|>", "<|im_end|>"]) == 0
    tok = Tokenizer.load(tmp_path / "t")
    assert tok.special_tokens == {"<|im_start|>": 256, "<|im_end|>": 257, "<|endoftext|>": 258}
    err = capsys.readouterr().err
    assert (
        "cookmind tokenizer train: added <|endoftext|> (id 258) to the --special-token set: cookmind pack ends "
        "every document with it" in err
    )
    assert err.count("\n") == 1
    meta = pack([path], tmp_path / "s", tmp_path / "t", "seq", progress=False)  # refused before
    assert meta["tokenizer"]["eos_id"] == 258
    # the default set and a set holding it: no note
    assert main([*argv, "--overwrite", "--special-token", "<|endoftext|>", "<|im_start|>"]) == 0
    assert Tokenizer.load(tmp_path / "t").special_tokens == {"<|endoftext|>": 256, "<|im_start|>": 257}
    assert "added <|endoftext|>" not in capsys.readouterr().err
