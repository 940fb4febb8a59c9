"""The sampling pipeline: a chain of small steps from raw logits to a chosen token.

Every step works on a batch of rows, each row with its own parameters (continuous batching
mixes requests with different settings in one decode step):

    logits ─► penalties ─► temperature ─► top-k ─► top-p ─► min-p ─► sample (or argmax)

A step receives float32 logits of shape (B, V) and returns logits of the same shape where
removed tokens are set to -inf; no step renormalises, sampling does that once at the end.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field

import torch

from cookmind.infer.stop import check_stop_strings

NEG_INF = float("-inf")


@dataclass
class SamplingParams:
    """How to decode one request: the one parameter type of every generation path (see docs/INTERFACES.md).

    The OpenAI names where one exists. temperature 0 is greedy. A stop token ends a response; a stop string
    ends it at the token that completes it. min_new_tokens bans the stop tokens before that many tokens.

    grammar: structured output, enforced while decoding by the serving engine (constraints.py, llguidance): Lark
    text such as ``start: "yes" | "no"``, with JSON schemas inline as ``%json {"type": "object", ...}``, or the
    JSON grammar ``constraints.grammar_for_response_format`` builds. The response may end (a stop token) only
    where the grammar is complete, and ends once the grammar can take no more.
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 -> greedy
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1 -> off
    min_p: float = 0.0  # 0 -> off
    repetition_penalty: float = 1.0  # 1 -> off; CTRL-style, over prompt + output
    presence_penalty: float = 0.0  # OpenAI: over output tokens seen at least once
    frequency_penalty: float = 0.0  # OpenAI: times each output token was seen
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop_token_ids, (str, int)):
            raise ValueError(f"sampling parameter stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        try:  # numpy / torch integers are fine; strings and floats are not token ids
            self.stop_token_ids = tuple(operator.index(t) for t in self.stop_token_ids)
        except TypeError:
            raise ValueError(f"sampling parameter stop_token_ids={self.stop_token_ids!r} must hold ints") from None
        self.stop_strings = check_stop_strings(self.stop_strings)
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"sampling parameter grammar={self.grammar!r:.60} must be None or non-empty grammar text")
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad field and its allowed range."""
        ints = ("max_new_tokens", "min_new_tokens", "top_k", "top_logprobs")
        bad_type = [n for n in ints if isinstance(getattr(self, n), bool) or not isinstance(getattr(self, n), int)]
        if bad_type:
            raise ValueError(f"sampling parameter {bad_type[0]}={getattr(self, bad_type[0])!r} must be an int")
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 0, ">= 0"),
            ("min_new_tokens", 0 <= self.min_new_tokens <= self.max_new_tokens, "in [0, max_new_tokens]"),
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_k", self.top_k >= 0, ">= 0 (0 turns it off)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            # a seen token's logit is divided (or multiplied) by it: beyond these the logits overflow or vanish
            ("repetition_penalty", 0.01 <= self.repetition_penalty <= 100, "in [0.01, 100] (1 turns it off)"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            ("top_logprobs", 0 <= self.top_logprobs <= 20, "in [0, 20]"),
            ("stop_token_ids", all(t >= 0 for t in self.stop_token_ids), "token ids >= 0"),
            # a 64-bit signed integer, as OpenAI's: one outside would be folded onto another seed's samples
            ("seed", self.seed is None or -(2**63) <= self.seed < 2**63, "a 64-bit signed integer"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(
                    f"sampling parameter {name}={getattr(self, name)!r} is out of range: must be {allowed}"
                )

    def replace(self, **changes) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SamplingBatch:
    """The per-row parameters of one decode step, as tensors on the logits' device."""

    temperature: torch.Tensor  # (B,) float
    top_k: torch.Tensor  # (B,) long, 0 = off
    top_p: torch.Tensor  # (B,) float
    min_p: torch.Tensor  # (B,) float
    repetition_penalty: torch.Tensor  # (B,) float
    presence_penalty: torch.Tensor  # (B,) float
    frequency_penalty: torch.Tensor  # (B,) float
    generators: list[torch.Generator | None] = field(default_factory=list)
    # which steps any row uses, known on the host so the chain never waits on the device to find out
    flags: dict[str, bool] | None = None

    @classmethod
    def from_params(
        cls, params: list[SamplingParams], device: torch.device | str = "cpu", generators=None
    ) -> SamplingBatch:
        """Stack a list of per-request params into tensors (one row each)."""

        def col(name, dtype=torch.float32):
            return torch.tensor([getattr(p, name) for p in params], dtype=dtype, device=device)

        return cls(
            temperature=col("temperature"),
            top_k=col("top_k", torch.long),
            top_p=col("top_p"),
            min_p=col("min_p"),
            repetition_penalty=col("repetition_penalty"),
            presence_penalty=col("presence_penalty"),
            frequency_penalty=col("frequency_penalty"),
            generators=list(generators) if generators is not None else [None] * len(params),
            flags={
                "repetition": any(p.repetition_penalty != 1 for p in params),
                "presence_frequency": any(p.presence_penalty != 0 or p.frequency_penalty != 0 for p in params),
                "temperature": any(p.temperature not in (0.0, 1.0) for p in params),
                "top_k": any(p.top_k > 0 for p in params),
                "top_p": any(p.top_p < 1 for p in params),
                "min_p": any(p.min_p > 0 for p in params),
                "all_greedy": all(p.temperature == 0 for p in params),
            },
        )

    def uses(self, step: str) -> bool:
        """Does any row use this step? From host-side flags when known, else from the tensors."""
        if self.flags is not None:
            return self.flags[step]
        checks = {
            "repetition": lambda: (self.repetition_penalty != 1).any(),
            "presence_frequency": lambda: ((self.presence_penalty != 0) | (self.frequency_penalty != 0)).any(),
            "temperature": lambda: ((self.temperature != 0) & (self.temperature != 1)).any(),
            "top_k": lambda: (self.top_k > 0).any(),
            "top_p": lambda: (self.top_p < 1).any(),
            "min_p": lambda: (self.min_p > 0).any(),
            "all_greedy": lambda: (self.temperature == 0).all(),
        }
        return bool(checks[step]())


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """CTRL penalty on tokens already seen: l -> l / p if l > 0 else l * p.

    seen: (B, V) bool, True where the token occurs in the prompt or the output so far.
    """
    p = penalty[:, None]
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


def apply_presence_frequency(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """OpenAI's penalties: l -> l - count * frequency - [count > 0] * presence.

    counts: (B, V) how often each token occurs in the output so far.
    """
    c = counts.to(logits.dtype)
    return logits - c * frequency[:, None] - (c > 0).to(logits.dtype) * presence[:, None]


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """l -> l / T; rows with T == 0 (greedy) are left as they are."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return logits / t[:, None]


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep each row's k largest logits (k = 0 keeps all); ties at the k-th value are kept."""
    vocab = logits.shape[-1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    sorted_desc = logits.sort(dim=-1, descending=True).values
    kth = sorted_desc.gather(-1, (k - 1)[:, None])  # the k-th largest value of each row
    return logits.masked_fill(logits < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability sum reaches p.

    In descending order a token is kept when the mass strictly before it is < p, so the
    most likely token is always kept.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # sum of probabilities ranked above each token
    remove_sorted = mass_before >= top_p[:, None]
    remove_sorted[:, 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep tokens with probability >= min_p * (the row's largest probability)."""
    probs = logits.softmax(dim=-1)
    threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, NEG_INF)


def process_logits(
    logits: torch.Tensor,
    batch: SamplingBatch,
    seen: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run every step of the chain; steps that are off for all rows are skipped (cheap path)."""
    logits = logits.float()
    if seen is not None and batch.uses("repetition"):
        logits = apply_repetition_penalty(logits, seen, batch.repetition_penalty)
    if counts is not None and batch.uses("presence_frequency"):
        logits = apply_presence_frequency(logits, counts, batch.presence_penalty, batch.frequency_penalty)
    if batch.uses("all_greedy"):
        return logits  # argmax ignores temperature and every filter (each keeps the top token)
    if batch.uses("temperature"):
        logits = apply_temperature(logits, batch.temperature)
    if batch.uses("top_k"):
        logits = apply_top_k(logits, batch.top_k)
    if batch.uses("top_p"):
        logits = apply_top_p(logits, batch.top_p)
    if batch.uses("min_p"):
        logits = apply_min_p(logits, batch.min_p)
    return logits


def sample_from_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Draw one token per row from softmax(logits); greedy rows (T == 0) take the argmax.

    Sampling uses the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with
    probability p_i, and lets each row draw its noise from its own seeded generator.
    """
    greedy_tokens = logits.argmax(dim=-1)
    if batch.uses("all_greedy"):
        return greedy_tokens
    greedy_rows = batch.temperature == 0
    probs = logits.softmax(dim=-1)
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(batch.generators) if g is None]
    if shared:
        noise[shared] = torch.empty((len(shared), probs.shape[-1]), device=probs.device).exponential_()
    for i, gen in enumerate(batch.generators):
        if gen is not None:
            noise[i].exponential_(generator=gen)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(greedy_rows, greedy_tokens, sampled)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator for a request's seed (None -> share the global RNG)."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return gen


def ban_tokens(logits: torch.Tensor, bans: dict[int, tuple[int, ...]]) -> torch.Tensor:
    """logits with bans[row]'s token ids set to -inf in that row (min_new_tokens: no stop token yet)."""
    if not bans:
        return logits
    logits = logits.clone()
    for row, ids in bans.items():
        logits[row, list(ids)] = NEG_INF
    return logits
