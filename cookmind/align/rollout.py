"""Sampling responses for rollouts and evaluation, from our model, a Hugging Face model or any logits callable.

Prompts are bucketed by length so a batch needs no padding and no attention mask: every row
of a bucket sits at the same position, which is what lets one simple loop drive a KV cache on
both our ``CookMindLM`` and a Hugging Face causal LM. GRPO repeats each prompt ``group_size``
times, so its buckets are full. For a ``CookMindLM``, ``engine="auto"`` hands decoding to the
serving engine on CUDA (engine_rollout.py), and greedy decoding to ``cookmind.infer.generate``
on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cookmind.align.losses import logits_of


@dataclass
class SamplingParams:
    """How to decode: temperature 0 is greedy; stop at any stop token or once a stop string appears."""

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    batch_size: int = 64
    engine: str = "auto"  # auto | builtin | cookmind | serving (see generate_ids)


def _kind(model) -> str:
    module = type(model).__module__
    if module.startswith("transformers") or module.startswith("peft"):
        return "hf"
    if hasattr(model, "config") and type(model).__name__ == "CookMindLM":
        return "cookmind"
    return "callable"


def _sample_next(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    """Greedy when temperature is 0; else sample softmax(logits / T), optionally nucleus-truncated."""
    if params.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_p.cumsum(-1) - sorted_p > params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _hf_cache_kwarg(model) -> str:
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class _Stepper:
    """Feeds tokens to a model and returns next-token logits, keeping a KV cache where the model has one."""

    def __init__(self, model, batch: int, max_len: int, device):
        self.model, self.kind = model, _kind(model)
        self.past, self.tokens = None, None
        if self.kind == "cookmind":
            from cookmind.model import KVCache

            dtype = next(model.parameters()).dtype
            self.cache = KVCache(model.config, batch, max_len, device=device, dtype=dtype)

    def __call__(self, new_ids: torch.Tensor) -> torch.Tensor:
        if self.kind == "hf":
            # transformers >= 5.2x names the cache argument `cache`; older 5.x `past_key_values`
            if self.past is None:
                out = self.model(input_ids=new_ids, use_cache=True)
            elif _hf_cache_kwarg(self.model) == "cache":
                out = self.model(input_ids=new_ids, cache=self.past, use_cache=True)
            else:
                out = self.model(input_ids=new_ids, past_key_values=self.past, use_cache=True)
            self.past = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
            return out.logits[:, -1]
        if self.kind == "cookmind":
            return self.model(new_ids, kv_cache=self.cache).logits[:, -1]
        # plain callable: no cache, run the whole sequence each step
        self.tokens = new_ids if self.tokens is None else torch.cat([self.tokens, new_ids], dim=1)
        return logits_of(self.model(self.tokens))[:, -1]


def _stopped(text_tail: str, stop_strings) -> bool:
    return any(s in text_tail for s in stop_strings)


@torch.no_grad()
def _generate_bucket(model, prompts: list[list[int]], params: SamplingParams, decode, gen) -> list[list[int]]:
    device = next(model.parameters()).device if hasattr(model, "parameters") else torch.device("cpu")
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    b, p = ids.shape
    step = _Stepper(model, b, p + params.max_new_tokens, device)
    rows: list[list[int]] = [[] for _ in range(b)]  # on the host: stop checks never touch the device
    done = [False] * b
    ends = [params.max_new_tokens] * b
    logits = step(ids)
    stop_set = set(params.stop_token_ids)
    stop_ids = torch.tensor(list(params.stop_token_ids), dtype=torch.long, device=device)
    tail = max((len(x) for x in params.stop_strings), default=0) + 4  # tokens are >= 1 char, mostly
    for t in range(params.max_new_tokens):
        if t < params.min_new_tokens and len(stop_ids):
            logits = logits.clone()
            logits[:, stop_ids] = float("-inf")  # min_new_tokens: no ending before then
        nxt = _sample_next(logits, params, gen)
        for r, tok in enumerate(nxt.tolist()):  # the step's one device-to-host copy
            rows[r].append(tok)
            if done[r]:
                continue
            # a stop string spans at most len(stop) tokens: decode only that tail
            if tok in stop_set or (params.stop_strings and decode is not None
                                   and _stopped(decode(rows[r][-tail:]), params.stop_strings)):
                done[r], ends[r] = True, t + 1
        if all(done) or t + 1 == params.max_new_tokens:
            break
        logits = step(nxt[:, None])
    return [row[:end] for row, end in zip(rows, ends)]


def generate_ids(model, prompts: list[list[int]], params: SamplingParams, tokenizer=None) -> list[list[int]]:
    """New token ids for each prompt (stop tokens/strings included at the end when hit), in input order."""
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("generate_ids: an empty prompt has nothing to condition on; give every prompt at least one token")
    if params.engine not in ("auto", "builtin", "cookmind", "serving"):
        raise ValueError(f"unknown engine {params.engine!r}; choose auto, builtin, cookmind or serving")
    # serving: the continuous-batching engine (engine_rollout.py), kept per model, row i seeded seed + i.
    # auto picks it for a CookMindLM on CUDA, where it decodes several times faster. On CPU, auto keeps
    # what it always did (the demo's numbers depend on it): `cookmind.infer.generate` for greedy decoding,
    # the built-in loop for sampling (one generator for every row).
    if params.engine == "serving" or (params.engine == "auto" and _kind(model) == "cookmind"
                                      and next(model.parameters()).device.type == "cuda"):
        from cookmind.align import engine_rollout

        if engine_rollout.supports(model, params):
            return engine_rollout.engine_generate_ids(model, prompts, params, tokenizer)
        if params.engine == "serving":
            raise ValueError("engine='serving' needs a CookMindLM without LoRA modules and min_new_tokens=0; "
                             "use engine='builtin'")
    if params.engine == "cookmind" or (params.engine == "auto" and _kind(model) == "cookmind" and params.temperature <= 0):
        engine = _cookmind_engine() if params.engine == "auto" else _cookmind_engine(required=True)
        if engine is not None:
            return engine(model, prompts, params, tokenizer)
    from cookmind.align.prompts import decode_ids

    decode = (lambda ids: decode_ids(tokenizer, ids)) if tokenizer is not None else None
    gen = None
    if params.seed is not None and params.temperature > 0:
        device = next(model.parameters()).device if hasattr(model, "parameters") else torch.device("cpu")
        gen = torch.Generator(device=device).manual_seed(params.seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[int] | None] = [None] * len(prompts)
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and len(prompts[order[j]]) == len(prompts[order[i]]) and j - i < params.batch_size:
            j += 1
        chunk = order[i:j]
        for k, row in zip(chunk, _generate_bucket(model, [prompts[k] for k in chunk], params, decode, gen)):
            results[k] = row
        i = j
    return results  # type: ignore[return-value]


def _cookmind_engine(required: bool = False):
    """``cookmind.infer.generate`` wrapped to our params, or None when it is not installed."""
    try:
        from cookmind.infer import GenerationConfig, generate
    except ImportError:
        if required:
            raise
        return None

    def run(model, prompts, params: SamplingParams, tokenizer):
        cfg = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop_token_ids=tuple(params.stop_token_ids),
            stop_strings=tuple(params.stop_strings),
            seed=params.seed,
        )
        return [list(r) for r in generate(model, prompts, cfg, tokenizer=tokenizer)]

    return run
