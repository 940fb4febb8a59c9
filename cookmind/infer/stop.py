"""Stop strings, in one place: where a response ends, and what text of it may be shown.

Two questions, two classes:
  - ``TokenStops``: which token ends a response? A stop token does (kept or dropped by the caller);
    a stop string does at the token that completes it (that token is kept: it is part of the text).
    Every generation path (``cookmind.infer.generate``, the engine behind it, rollouts) asks this.
  - ``StopStringMatcher``: which text may a stream show now? A stop string can arrive split over
    several tokens ("<|us" + "er|>"), so the matcher holds back the longest tail of the pending text
    that is a prefix of some stop string, and releases it once the next piece shows it is not. The
    stop string itself is never emitted. The server and the chat stream text through it.

And which tokens are control tokens (``control_token_ids``): the tokenizer's special tokens other than a reply's
own syntax (the ``<think>``/``</think>`` and ``<tool_call>``/``</tool_call>`` markers the reasoning and tool-call
parsers read). A control token is never shown as text, and a chat reply ends at the first one
(``chat_stop_ids``): ``<|im_start|>`` opens a turn the model made up, ``<|endoftext|>`` ends the text.
"""

from __future__ import annotations

from cookmind.infer.reasoning import THINK_CLOSE, THINK_OPEN
from cookmind.infer.tool_calls import TOOL_CLOSE, TOOL_OPEN

# special tokens that are part of a reply's own syntax: the reasoning and tool-call parsers need to see them
REPLY_SYNTAX = frozenset({THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE})
# the chat markers: special in a transformers tokenizer's vocabulary whether or not it marks them so
CHATML_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def special_tokens_of(tokenizer) -> dict[int, str]:
    """{id: text} of the tokenizer's special tokens: cookmind's (and the Hugging Face adapter's)
    ``special_tokens``, or a transformers tokenizer's added tokens marked special and the ``CHATML_MARKERS`` in
    its vocabulary (a fine-tune may add them as plain tokens; ``HFTokenizerAdapter`` counts them too)."""
    specials = getattr(tokenizer, "special_tokens", None)
    if isinstance(specials, dict):
        return {int(i): s for s, i in specials.items()}
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if not isinstance(added, dict):
        return {}
    found = {int(i): t.content for i, t in added.items() if getattr(t, "special", False)}
    unknown = getattr(tokenizer, "unk_token_id", None)
    for s in CHATML_MARKERS:
        i = tokenizer.convert_tokens_to_ids(s)
        if isinstance(i, int) and i != unknown:
            found.setdefault(i, s)
    return found


def control_token_ids(tokenizer) -> frozenset[int]:
    """Ids of the special tokens that are not reply syntax (``REPLY_SYNTAX``), with the end-of-text and end-of-turn
    ids: left out of the text users see, and the tokens that end a chat reply."""
    ids = {i for i, s in special_tokens_of(tokenizer).items() if s not in REPLY_SYNTAX}
    for name in ("eos_id", "im_end_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            ids.add(value)
    return frozenset(ids)


def spelled_stop_ids(tokenizer, stop_strings) -> tuple[int, ...]:
    """The control tokens that a stop string spells whole (``stop=["<|im_start|>"]``): callers make them stop tokens,
    since a control token's text is never shown for a stop string to match."""
    wanted = set(stop_strings)
    return tuple(sorted(i for i, s in special_tokens_of(tokenizer).items() if s in wanted and s not in REPLY_SYNTAX))


def chat_stop_ids(tokenizer) -> tuple[int, ...]:
    """The tokens that end a chat reply: every control token (the one rule of the chat CLI, the server's chat
    completions and the web page). The reply's text is what came before; finish_reason "stop". Eval answers and
    GRPO rollouts end there too, whatever their template (``cookmind.align.prompts.stop_ids_of``)."""
    return tuple(sorted(control_token_ids(tokenizer)))


def model_eos_ids(config) -> tuple[int, ...]:
    """The model's own end-of-text ids: its config's ``eos_token_id`` (an int, a list or None)."""
    from cookmind.model.hf import eos_ids

    eos = getattr(config, "eos_token_id", None)
    return () if eos is None else tuple(eos_ids(eos))


def text_stop_ids(tokenizer, config=None) -> tuple[int, ...]:
    """The tokens that end a plain completion: end of text, end of turn and the model's own eos (``config``'s
    ``eos_token_id``, where transformers' generate stops: an imported Llama's ``</s>``)."""
    ids = {getattr(tokenizer, "eos_id", None), getattr(tokenizer, "im_end_id", None), *model_eos_ids(config)}
    return tuple(sorted(i for i in ids if i is not None))


def check_stop_strings(stop_strings) -> tuple[str, ...]:
    """The stop strings as a tuple; ValueError unless each is a non-empty string."""
    if isinstance(stop_strings, str):
        raise ValueError(f"stop strings must be a list of strings, got the string {stop_strings!r}")
    bad = [s for s in stop_strings if not isinstance(s, str) or s == ""]
    if bad:
        raise ValueError(f"stop strings must be non-empty strings, got {bad!r}")
    return tuple(stop_strings)


class TokenStops:
    """Per response: ``feed(token) -> True`` when this token ends it (a stop token, or the token that
    completes a stop string). Stop strings need ``tokenizer`` (anything with ``decode(ids) -> str``).

    Only the newest tokens can complete a new match: the text of the last ``longest stop string + 4``
    tokens is checked (a token decodes to at least one character, so that tail holds any new match).
    """

    def __init__(self, stop_token_ids=(), stop_strings=(), tokenizer=None, max_tokens: int | None = None):
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.stop_strings = check_stop_strings(stop_strings)
        if self.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode the output; pass tokenizer=")
        self.tokenizer = tokenizer
        self._tail = max((len(s) for s in self.stop_strings), default=0) + 4
        self.max_tokens = max_tokens  # the response's length limit, if any: its max_new_tokens or room in the context
        self.ids: list[int] = []
        self.stopped = False

    def feed(self, token: int) -> bool:
        """Add the response's next token; True when it ends the response (and from then on): it is a stop token,
        completes a stop string, or is the ``max_tokens``-th."""
        if self.stopped:
            return True
        self.ids.append(int(token))
        if token in self.stop_token_ids:
            self.stopped = True
        elif self.stop_strings:
            text = _decode(self.tokenizer, self.ids[-self._tail :])
            self.stopped = any(s in text for s in self.stop_strings)
        if self.max_tokens is not None and len(self.ids) >= self.max_tokens:
            self.stopped = True
        return self.stopped


def _decode(tokenizer, ids: list[int]) -> str:
    """Text of ids with special tokens kept (a stop string may be one): our tokenizer or a transformers one."""
    if hasattr(tokenizer, "convert_tokens_to_ids"):
        return tokenizer.decode(ids, skip_special_tokens=False)
    return tokenizer.decode(ids)


class StopStringMatcher:
    """Feed decoded text pieces; get back the part safe to show and whether a stop string hit."""

    def __init__(self, stop_strings: list[str] | tuple[str, ...] = ()):
        self.stop_strings = check_stop_strings(stop_strings)
        self._pending = ""  # text received but not yet released
        self.stopped = False

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add a piece of text; return (text to emit now, stopped)."""
        if self.stopped:
            return "", True
        text = self._pending + piece
        if not self.stop_strings:
            self._pending = ""
            return text, False
        # earliest stop string occurrence wins; everything before it is emitted
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)], True
        hold = self._partial_suffix_len(text)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    @property
    def held(self) -> str:
        """The text held back (it may begin a stop string)."""
        return self._pending

    def flush(self) -> str:
        """At the end of generation nothing can complete a stop string: release what was held."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _partial_suffix_len(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
