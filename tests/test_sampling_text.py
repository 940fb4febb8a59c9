"""Text-side steps of streaming: stop strings with hold-back, UTF-8 safe detokenizing, <think> split."""

from __future__ import annotations

import random

import pytest

from cookmind.infer.detokenize import IncrementalDetokenizer
from cookmind.infer.reasoning import ReasoningSplitter, split_reasoning
from cookmind.infer.stop import StopStringMatcher


def run_matcher(pieces, stops):
    m = StopStringMatcher(stops)
    out, stopped = [], False
    for p in pieces:
        text, stopped = m.feed(p)
        out.append(text)
        if stopped:
            break
    out.append(m.flush())
    return "".join(out), stopped, out


def reference_cut(text, stops):
    """Cut at the earliest occurrence of any stop string (independent of the piece split)."""
    hits = [text.find(s) for s in stops if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def test_stop_string_split_over_pieces_is_held_back_and_not_emitted():
    text, stopped, pieces = run_matcher(["Hello <|u", "ser", "|> more"], ["<|user|>"])
    assert (text, stopped) == ("Hello ", True)
    assert pieces[0] == "Hello "  # the partial "<|u" was held back, never shown


def test_false_alarm_is_released():
    text, stopped, pieces = run_matcher(["ab<", "x", "yz"], ["<|end|>"])
    assert (text, stopped) == ("ab<xyz", False)
    assert pieces[:2] == ["ab", "<x"]


@pytest.mark.parametrize("seed", range(30))
def test_random_splits_match_reference(seed):
    rng = random.Random(seed)
    alphabet = "ab<|>\n"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    got, stopped, _ = run_matcher(pieces, stops)
    assert (got, stopped) == reference_cut(text, stops)


def test_empty_stop_string_is_an_error():
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher([""])


class ByteTokenizer:
    """One token per UTF-8 byte: the hardest case for incremental decoding."""

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_detokenizer_waits_for_complete_characters():
    tok = ByteTokenizer()
    text = "héllo 世界 🍳 done"
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(i) for i in tok.encode(text)]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_reasoning_split_whole_and_streamed():
    text = "<think>\nlet me see: 2+2</think>\n\nIt is 4."
    assert split_reasoning(text) == ("let me see: 2+2", "It is 4.")
    for step in (1, 2, 3, 5):
        s = ReasoningSplitter()
        r, c = [], []
        for i in range(0, len(text), step):
            a, b = s.feed(text[i : i + step])
            r.append(a)
            c.append(b)
        a, b = s.flush()
        assert ("".join(r + [a]).strip("\n"), "".join(c + [b])) == ("let me see: 2+2", "It is 4.")


def test_reasoning_only_at_start_and_open_in_prompt():
    assert split_reasoning("The tag <think> here is text") == ("", "The tag <think> here is text")
    assert split_reasoning("already thinking</think>answer", start_in_reasoning=True) == ("already thinking", "answer")
    assert split_reasoning("no tags at all") == ("", "no tags at all")


def test_a_stray_closing_tag_before_the_answer_closes_an_empty_think_block():
    # "</think>ide" (no <think> opened) showed "</think>" as the reply's text. A think tag counts only before any
    # answer text: <think> there opens the reasoning, a </think> there closes one the model never opened (it is
    # dropped, with the template's newlines after it); after answer text either is text, whole or streamed
    cases = [
        ("</think>ide", ("", "ide")),
        ("\n</think>\n\nIt is 4.", ("", "It is 4.")),
        ("</think><think>hm</think>ok", ("hm", "ok")),
        ("It is </think> here", ("", "It is </think> here")),
        ("The tag <think> here is text</think>", ("", "The tag <think> here is text</think>")),
    ]
    for text, want in cases:
        assert split_reasoning(text) == want, text
        for step in (1, 2, 3, 5):
            s = ReasoningSplitter()
            parts = [s.feed(text[i : i + step]) for i in range(0, len(text), step)] + [s.flush()]
            assert ("".join(r for r, _ in parts).strip("\n"), "".join(c for _, c in parts)) == want, (text, step)
