"""Structured outputs: a request's grammar enforced token by token while it decodes.

llguidance (the `llguidance` package) parses: given a grammar and the tokens so far, it says which token ids may
come next, as a bitmask of one bit per id. A grammar is what ``llguidance.LLMatcher`` takes: Lark text
(``start: "yes" | "no"``; JSON schemas inline as ``%json {...}``) or the JSON grammar that
``grammar_for_response_format`` builds from an OpenAI ``response_format``. The engine keeps one ``GrammarMatcher``
per constrained request: before each sampling step it fills that request's bitmask row on the host,
``constrain_logits`` sets the forbidden logits to -inf on the device (free rows of the batch keep all theirs),
and after the step the matcher consumes the token drawn. The end of the response (the request's stop tokens)
is allowed only where the grammar may end; once the grammar can take nothing more, the request stops.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable

import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer, TokenizerWrapper

# JSON as json.dumps writes it (", " and ": ", no other whitespace): a model cannot pad an answer with blanks
# until max_tokens. A schema's own "x-guidance" options override these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_lock = threading.Lock()
_ll_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # our Tokenizer -> {key: LLTokenizer}
_executor: LLExecutor | None = None  # llguidance's thread pool for filling several bitmask rows at once
# grammar -> (its llguidance tokenizer, a compiled matcher at the start): requests copy it (microseconds) instead of
# compiling again (milliseconds): n choices, and clients that send the same schema every time
_compiled: OrderedDict[tuple[int, str], tuple[LLTokenizer, LLMatcher]] = OrderedDict()
COMPILED_GRAMMARS_KEPT = 64


class _Vocabulary:
    """A cookmind byte-level BPE tokenizer as ``llguidance.TokenizerWrapper`` reads one: each id's bytes, the
    special ids (never matched by grammar text), and an encoder. Ids the model has beyond the tokenizer's
    vocabulary are empty special tokens, so no grammar can pick them."""

    def __init__(self, tokenizer, vocab_size: int, eos_id: int):
        specials = set(tokenizer.special_tokens.values())
        self.tokens = [tokenizer.vocab.get(i, b"") for i in range(vocab_size)]
        self.special_token_ids = sorted(specials | {i for i in range(vocab_size) if i not in tokenizer.vocab})
        self.eos_token_id = eos_id
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", errors="replace"))


def ll_tokenizer(tokenizer, vocab_size: int, eos_ids: Iterable[int]) -> LLTokenizer:
    """The llguidance tokenizer for our ``tokenizer`` over a model of ``vocab_size`` ids whose responses end with
    any of ``eos_ids``; built once per (tokenizer, vocab_size, eos_ids) and cached while the tokenizer lives."""
    if not hasattr(tokenizer, "vocab") or not hasattr(tokenizer, "special_tokens"):
        raise ValueError(
            f"structured outputs need a cookmind Tokenizer (byte-level BPE), got {type(tokenizer).__name__}"
        )
    eos = tuple(sorted({int(t) for t in eos_ids}))
    if not eos:
        raise ValueError("a grammar needs a token that ends the response (stop_token_ids); none was given")
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model only {vocab_size}; they do not belong together"
        )
    key = (vocab_size, eos)
    with _lock:
        built = _ll_tokenizers.setdefault(tokenizer, {})
        if key not in built:
            wrapper = TokenizerWrapper(_Vocabulary(tokenizer, vocab_size, eos[0]))
            built[key] = LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos))
        return built[key]


class ResponseFormatError(ValueError):
    """A malformed ``response_format``; ``param`` is the field the server's 400 names."""

    def __init__(self, message: str, param: str = "response_format"):
        super().__init__(message)
        self.param = param


def grammar_for_response_format(rf: dict | None) -> str | None:
    """The grammar of an OpenAI ``response_format``: None for ``{"type": "text"}`` (or no response_format),
    any JSON object for ``{"type": "json_object"}``, the schema's JSON for ``{"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``. ValueError naming the field for a malformed
    response_format or a schema that does not compile.

    ``strict: false`` (OpenAI's default) is enforced like ``strict: true``, as vLLM and SGLang do. OpenAI's false means
    "not guaranteed": their constrained decoding covers a subset of JSON Schema, and false lets other schemas through
    unenforced. llguidance compiles the schemas false would let through, and an enforced answer is one a client asking
    for strict: false accepts too, so both get the guarantee; a schema it cannot compile is a 400 either way."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise ValueError(f"response_format must be an object, got {type(rf).__name__}")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise ValueError("response_format.json_schema must be an object with a name and a schema")
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ValueError("response_format.json_schema.name must be a non-empty string")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"response_format.json_schema.strict must be true or false, got {strict!r}")
        if "schema" not in spec:  # {} would allow any JSON value: the client's format would constrain nothing
            raise ResponseFormatError(
                "response_format.json_schema.schema is missing; give the JSON schema the reply must follow "
                '(or use {"type": "json_object"} for any JSON object)',
                param="response_format.json_schema.schema",
            )
        schema = spec["schema"]
        if not isinstance(schema, dict):
            raise ValueError(f"response_format.json_schema.schema must be a JSON object, got {type(schema).__name__}")
    else:
        raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise ValueError(f"response_format.json_schema.schema: {exc}") from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"response_format.json_schema.schema is not a usable JSON schema: {error}")
    return grammar


def compile_grammar(tokenizer, vocab_size: int, grammar: str, eos_ids: Iterable[int]) -> None:
    """Compile ``grammar`` now and keep it, so that a ``GrammarMatcher`` for it (same tokenizer, vocab_size and
    eos_ids) copies the compiled matcher instead of compiling. A large schema's first compile can take seconds: the
    server runs this in a worker thread, keeping it off the event loop that every other request waits on.
    ValueError when the grammar is invalid."""
    _compiled_matcher(ll_tokenizer(tokenizer, vocab_size, eos_ids), grammar)


def _compiled_matcher(ll_tok: LLTokenizer, grammar: str) -> LLMatcher:
    """A matcher for ``grammar`` at its start, compiled once and kept (the last COMPILED_GRAMMARS_KEPT)."""
    key = (id(ll_tok), grammar)
    with _lock:
        hit = _compiled.get(key)
        if hit is not None and hit[0] is ll_tok:
            _compiled.move_to_end(key)
            return hit[1]
    matcher = LLMatcher(ll_tok, grammar, log_level=0)
    if matcher.is_error():
        raise ValueError(f"invalid grammar: {matcher.get_error()}")
    with _lock:
        _compiled[key] = (ll_tok, matcher)
        while len(_compiled) > COMPILED_GRAMMARS_KEPT:
            _compiled.popitem(last=False)
    return matcher


class GrammarMatcher:
    """One request's place in its grammar. Raises ValueError (llguidance's message) when the grammar is invalid."""

    def __init__(self, tokenizer, vocab_size: int, grammar: str, eos_ids: Iterable[int]):
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError(f"a grammar must be non-empty Lark text or a llguidance JSON grammar, got {grammar!r:.60}")
        self.vocab_size = vocab_size
        self._m = _compiled_matcher(ll_tokenizer(tokenizer, vocab_size, eos_ids), grammar).deep_copy()

    @property
    def words(self) -> int:
        """int32 words in one bitmask row."""
        return (self.vocab_size + 31) // 32

    def fill(self, row: torch.Tensor) -> None:
        """Write the allowed next tokens into ``row``: a contiguous CPU int32 tensor of ``words`` words, bit
        ``i % 32`` of word ``i // 32`` set when token i may come next."""
        if row.dtype != torch.int32 or row.device.type != "cpu" or not row.is_contiguous() or row.numel() != self.words:
            raise ValueError(f"a bitmask row must be a contiguous CPU int32 tensor of {self.words} words")
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def consume(self, token: int) -> bool:
        """Advance past ``token``; False (and the matcher is in error from then on) when the grammar forbids it."""
        return self._m.consume_token(int(token))

    def try_consume(self, tokens: list[int]) -> int:
        """Advance past as many of ``tokens`` as the grammar allows; returns how many."""
        return self._m.try_consume_tokens([int(t) for t in tokens])

    def is_accepting(self) -> bool:
        """May the response end here (the grammar is satisfied)?"""
        return self._m.is_accepting()

    def is_stopped(self) -> bool:
        """Can the grammar take no more tokens (complete, or in error)?"""
        return self._m.is_stopped()

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (tests use it to ask what the grammar allows after each prefix;
        requests with a grammar do not speculate, so the engine never rolls back)."""
        if not self._m.rollback(int(n)):
            raise ValueError(f"cannot roll back {n} tokens: {self._m.get_error() or 'fewer were consumed'}")

    @property
    def error(self) -> str:
        """llguidance's error message, empty while there is none."""
        return self._m.get_error()


def allowed_from_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, words) int32 bitmask -> (B, vocab_size) bool, True where the token is allowed (on the mask's device)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def fill_bitmask(matchers: list[GrammarMatcher], bitmask: torch.Tensor) -> None:
    """Row k of ``bitmask`` (a contiguous CPU int32 (len(matchers), words) tensor) gets matcher k's allowed tokens;
    several rows are computed in parallel on llguidance's threads."""
    if len(matchers) == 1:
        matchers[0].fill(bitmask[0])
        return
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or not bitmask.is_contiguous():
        raise ValueError("a bitmask must be a contiguous CPU int32 tensor")
    words = bitmask.shape[1]
    if any(m.words != words for m in matchers) or bitmask.shape[0] < len(matchers):
        raise ValueError(f"a bitmask of shape {tuple(bitmask.shape)} does not fit {len(matchers)} matchers")
    global _executor
    if _executor is None:
        _executor = LLExecutor()
    batch = [(m._m, k) for k, m in enumerate(matchers)]
    _executor.unsafe_compute_mask_ptr(batch, bitmask.data_ptr(), words * 4, bitmask.shape[0])


def constrain_logits(
    logits: torch.Tensor, matchers: list[GrammarMatcher | None], bitmask: torch.Tensor | None = None
) -> torch.Tensor:
    """``logits`` (B, V) with the tokens each row's grammar forbids set to -inf; rows whose matcher is None keep
    every logit. The constrained rows' bitmask is filled on the host (llguidance) and copied to the device once.
    bitmask: a host buffer of at least that many rows to fill (the engine's pinned one, copied without blocking:
    the caller must not refill it before this step's tokens are read back); else one is allocated."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    vocab = logits.shape[1]
    words = (vocab + 31) // 32
    host = torch.empty((len(rows), words), dtype=torch.int32) if bitmask is None else bitmask[: len(rows)]
    fill_bitmask([matchers[i] for i in rows], host)
    pinned = host.is_pinned() and logits.device.type == "cuda"
    allowed = allowed_from_bitmask(host.to(logits.device, non_blocking=pinned), vocab)
    if len(rows) == logits.shape[0]:
        return logits.masked_fill(~allowed, float("-inf"))
    index = torch.tensor(rows, device=logits.device)
    out = logits.clone()
    out[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return out
