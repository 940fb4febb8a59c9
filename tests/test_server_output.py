"""The per-choice output chain (detokenize -> stop strings -> reasoning); tool calls: tests/test_tool_calls.py."""

from __future__ import annotations

from cookmind.infer.engine import FinishEvent, TokenEvent
from cookmind.infer.output import OutputProcessor


class ByteTok:
    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def run(text, stops=(), finish="length"):
    tok = ByteTok()
    proc = OutputProcessor(tok, stops)
    deltas = [proc.feed(TokenEvent(t)) for t in tok.encode(text)]
    deltas.append(proc.feed(FinishEvent(finish)))
    return proc, deltas


def test_reasoning_and_content_through_tokens():
    proc, deltas = run("<think>\nsalt it</think>\n\nAdd salt. ☕")
    assert "".join(d.reasoning for d in deltas).strip("\n") == "salt it" == proc.reasoning_content
    assert "".join(d.content for d in deltas) == "Add salt. ☕" == proc.content
    assert proc.completion_tokens == len("<think>\nsalt it</think>\n\nAdd salt. ☕".encode())
    assert deltas[-1].finish_reason == "length"


def test_stop_string_ends_choice_and_is_hidden():
    proc, deltas = run("one two STOP three", stops=["STOP"])
    assert proc.content == "one two " and proc.finish_reason == "stop" and proc.stopped_by_string
    assert sum(d.finish_reason is not None for d in deltas) == 1


class PieceTok:
    """Tokens that are whole strings (several characters each), as a BPE's are."""

    def __init__(self, pieces):
        self.pieces = list(pieces)

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_logprobs_end_with_the_token_the_stop_string_cuts():
    # "suma" + "z3r" (the stop) + "y": the text ends at "a"; 'az' holds the cut, '3' and 'ry' lie past it
    pieces = [" s", "um", "az", "3", "ry", " more"]
    tok = PieceTok(pieces)
    proc = OutputProcessor(tok, ["z3r"])
    deltas = [proc.feed(TokenEvent(i, logprob=-0.5 - i)) for i in range(len(pieces))]
    deltas.append(proc.feed(FinishEvent("length")))
    assert proc.content == " suma" and proc.finish_reason == "stop"
    sent = [e["token"] for d in deltas for e in d.logprobs]
    assert [e["token"] for e in proc.logprob_entries] == [" s", "um", "az"] == sent
    # the tokens generated still count as generated (usage), whatever the text keeps
    assert proc.completion_tokens == 5


def test_logprobs_keep_every_token_of_text_before_a_stop_at_a_token_boundary():
    pieces = [" a", " b", "STOP", " c"]
    proc = OutputProcessor(PieceTok(pieces), ["STOP"])
    deltas = [proc.feed(TokenEvent(i, logprob=-1.0)) for i in range(len(pieces))]
    assert proc.content == " a b"
    assert [e["token"] for d in deltas for e in d.logprobs] == [" a", " b"]
    assert [e["token"] for e in proc.logprob_entries] == [" a", " b"]


class ByteTokWithBytes(ByteTok):
    def decode_bytes(self, ids):
        return bytes(ids)


def _logprob_tokens(text_bytes: bytes, stops):
    proc = OutputProcessor(ByteTokWithBytes(), stops)
    deltas = [proc.feed(TokenEvent(t, logprob=-1.0)) for t in text_bytes]
    deltas.append(proc.feed(FinishEvent("length")))
    return proc, [bytes([e["id"]]) for e in proc.logprob_entries]


def test_logprobs_end_before_a_stop_string_that_follows_a_held_bad_byte():
    """A token's text was placed where the output stood when it was fed; after a byte the detokenizer held (0xC3,
    the start of a character that never came), the next token's text came out one character early, and the stop
    string's own token kept its logprobs ("x\\ufffd" with logprob tokens x, \\xc3, T). Reference: the bytes before the
    stop string, token by token."""
    proc, kept = _logprob_tokens(b"x\xc3Ty", ["T"])
    assert proc.content == "x\ufffd" and kept == [b"x", b"\xc3"]
    # a whole character before the stop: its two tokens stay, the stop's goes
    proc, kept = _logprob_tokens("xéTy".encode(), ["T"])
    assert proc.content == "xé" and kept == [b"x", b"\xc3", b"\xa9"]
    # the stop string begins with a character split over tokens: both of its tokens go
    proc, kept = _logprob_tokens("abébcd".encode(), ["éb"])
    assert proc.content == "ab" and kept == [b"a", b"b"]
    # two held bad bytes, then the stop
    proc, kept = _logprob_tokens(b"a\xe2\x82##k", ["##"])
    assert proc.content == "a\ufffd" and kept == [b"a", b"\xe2", b"\x82"]


def test_char_starts_place_each_tokens_bytes_in_the_decoded_text():
    """Hand-worked: where each piece's text begins in the UTF-8 text of the joined bytes (bad bytes one U+FFFD per
    maximal sequence, as bytes.decode(errors="replace") gives)."""
    from cookmind.infer.detokenize import char_starts

    e, smile = "é".encode(), "🙂".encode()
    assert char_starts([b"x", b"\xc3", b"T", b"y"]) == [0, 1, 2, 3]  # "x\ufffdTy": the bad byte's U+FFFD at 1
    assert char_starts([e[:1], e[1:], b"!"]) == [0, 0, 1]  # "é!": é's second byte continues the character at 0
    assert char_starts([b"a", b"\xe2", b"\x82", b"#"]) == [0, 1, 1, 2]  # "a\ufffd#": one U+FFFD for both bytes
    assert char_starts([b"", b"ab", smile[:2], smile[2:], b"k"]) == [0, 0, 2, 2, 3]  # "ab🙂k"
    assert (b"a\xe2\x82#").decode("utf-8", "replace") == "a\ufffd#"  # the reference's own reading
