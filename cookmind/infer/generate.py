"""generate / stream: the one generation entry point of every consumer (CLI, chat, evals, the Trainer's samples,
GRPO rollouts, the demo).

Two back ends under one contract, sharing the sampling pipeline (sampling.py) and the stop rules (stop.py):
  - "serving": the continuous-batching ``Engine`` (paged KV cache, CUDA graphs, the Triton decode kernel),
    kept per model across calls (engine_generate.py);
  - "builtin": a plain loop over the model's own KV cache (stepper.py), for CPU, Hugging Face / peft models
    and logits callables.
engine="auto" takes "serving" for a CookMindLM on CUDA and "builtin" otherwise, and "serving" for any request with a
grammar (structured outputs are enforced by the engine only). Both give row i of a call the
seed ``seed + i`` (repeated prompts, a GRPO group, get distinct, reproducible samples), and stop the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from cookmind.infer.sampling import (
    SamplingBatch,
    SamplingParams,
    ban_tokens,
    make_generator,
    process_logits,
    sample_from_logits,
)
from cookmind.infer.stepper import Stepper, model_device, model_kind
from cookmind.infer.stop import TokenStops

ENGINES = ("auto", "builtin", "serving")


def _check_prompts(prompts: list[list[int]]) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt needs at least one token (got an empty prompt or no prompts)")


def check_context(prompts: list[list[int]], context: int) -> None:
    """ValueError naming the first prompt that leaves no room for a new token in the model's context."""
    for i, p in enumerate(prompts):
        if len(p) >= context:
            which = "the prompt" if len(prompts) == 1 else f"prompts[{i}]"
            raise ValueError(
                f"generate: {which} has {len(p)} tokens and fills the model's context of {context} tokens; shorten it"
            )


def rooms(model, prompts: list[list[int]], params: SamplingParams) -> list[int]:
    """New tokens each prompt leaves room for in the model's context (at most max_new_tokens): every row's own, so
    a long prompt in a batch does not shorten the others' answers."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is None:
        return [params.max_new_tokens] * len(prompts)
    check_context(prompts, context)
    return [min(params.max_new_tokens, context - len(p)) for p in prompts]


@torch.inference_mode()
def generate_steps(
    model,
    prompts: list[list[int]],
    params: SamplingParams,
    seeds: list[int | None] | None = None,
    *,
    per_row: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The plain loop: yield (next tokens (B,), the logits they were drawn from (B, V)) once per decode step.

    Runs max_new_tokens steps, fewer where the longest prompt's context ends; rows that stopped keep being fed so
    the batch keeps one shape: callers stop consuming to end early. ``per_row``: run until the row with the most
    room (``rooms``) is done instead; a caller then stops consuming row i after ``rooms(...)[i]`` tokens (what it
    yields past its room lies beyond the context and means nothing), as ``generate`` does.
    seeds: one per row (default ``params.seed + i``).
    Stop tokens are banned for the first ``params.min_new_tokens`` steps.
    """
    if params.grammar is not None:
        raise ValueError("the plain loop (engine='builtin', stream) does not enforce grammars; use generate()")
    _check_prompts(prompts)
    room = rooms(model, prompts, params)
    max_new = max(room) if per_row else min(room)
    if max_new < 1:
        return
    b = len(prompts)
    stepper = Stepper(model, prompts, max_new)
    device = stepper.device
    logits = stepper.prefill()
    if seeds is None:
        seeds = [None if params.seed is None else params.seed + i for i in range(b)]
    batch = SamplingBatch.from_params([params] * b, device, [make_generator(s, device) for s in seeds])
    vocab = logits.shape[-1]
    seen = counts = None
    if batch.uses("repetition") or batch.uses("presence_frequency"):
        seen = torch.zeros((b, vocab), dtype=torch.bool, device=device)
        for i, prompt in enumerate(prompts):
            seen[i, torch.tensor(prompt, device=device).clamp(max=vocab - 1)] = True
        counts = torch.zeros((b, vocab), dtype=torch.long, device=device)
    early_ban = {i: params.stop_token_ids for i in range(b)} if params.stop_token_ids else {}
    rows = torch.arange(b, device=device)
    for step in range(max_new):
        banned = ban_tokens(logits, early_ban) if step < params.min_new_tokens else logits
        tokens = sample_from_logits(process_logits(banned, batch, seen, counts), batch)
        yield tokens, logits
        if step == max_new - 1:
            return
        if seen is not None:
            seen[rows, tokens] = True
            counts[rows, tokens] += 1
        logits = stepper.step(tokens)


def _batches(model, prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """Row indices of each batch of the plain loop: our model pads rows of any length into one batch (in input
    order); a Hugging Face model or callable takes rows of one prompt length (grouped by length)."""
    padded = model_kind(model) == "cookmind"
    order = list(range(len(prompts)))
    if not padded:
        order.sort(key=lambda i: len(prompts[i]))
    out: list[list[int]] = []
    for i in order:
        if out and len(out[-1]) < batch_size and (padded or len(prompts[out[-1][0]]) == len(prompts[i])):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def pick_engine(model, engine: str = "auto") -> str:
    """ "serving" or "builtin" for this model (see the module docstring); ValueError for an unknown name."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose {', '.join(ENGINES)}")
    if engine == "auto":
        return "serving" if model_kind(model) == "cookmind" and model_device(model).type == "cuda" else "builtin"
    if engine == "serving" and model_kind(model) != "cookmind":
        raise ValueError(f"engine='serving' runs a CookMindLM, not a {type(model).__name__}; use engine='builtin'")
    return engine


def generate(
    model,
    prompts: list[list[int]],
    params: SamplingParams,
    tokenizer=None,
    *,
    keep_stop_token: bool = False,
    batch_size: int = 64,
    engine: str = "auto",
) -> list[list[int]]:
    """New token ids for each prompt, in input order.

    A stop token ends a row (returned at its end only with keep_stop_token: GRPO trains on it); a stop string
    (needs ``tokenizer``) ends a row with the token that completes it. batch_size: rows per forward of the plain
    loop (the engine batches by itself). engine: "auto", "builtin" or "serving" (module docstring).
    params.grammar (needs ``tokenizer``) constrains every row to the grammar, through the serving engine.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"generate: params must be a cookmind.infer.SamplingParams, got {type(params).__name__}")
    if not prompts:
        return []
    _check_prompts(prompts)
    if params.stop_strings and tokenizer is None:
        raise ValueError("generate: stop_strings need a tokenizer to decode the output; pass tokenizer=")
    if batch_size < 1:
        raise ValueError(f"generate: batch_size must be >= 1, got {batch_size}")
    if params.grammar is not None:
        if tokenizer is None:
            raise ValueError("generate: a grammar is matched against the tokenizer's tokens; pass tokenizer=")
        if engine == "builtin":
            raise ValueError(
                "generate: grammars are enforced by the serving engine only; use engine='auto' or 'serving'"
            )
        engine = "serving"
    if pick_engine(model, engine) == "serving":
        from cookmind.infer.engine_generate import engine_generate

        outs = engine_generate(model, prompts, params, tokenizer, max_rows=batch_size)
    else:
        outs = [[] for _ in prompts]
        for rows in _batches(model, prompts, batch_size):
            seeds = [None if params.seed is None else params.seed + i for i in rows]
            for i, out in zip(rows, _loop(model, [prompts[i] for i in rows], params, tokenizer, seeds)):
                outs[i] = out
    if not keep_stop_token and params.stop_token_ids:
        stop = set(params.stop_token_ids)
        outs = [o[:-1] if o and o[-1] in stop else o for o in outs]
    return outs


def _loop(model, prompts, params: SamplingParams, tokenizer, seeds) -> list[list[int]]:
    """One batch through the plain loop; each row ends with its stop token or stop string's last token, or where
    its own room in the context ends."""
    limits = rooms(model, prompts, params)
    stops = [TokenStops(params.stop_token_ids, params.stop_strings, tokenizer, r) for r in limits]
    for tokens, _ in generate_steps(model, prompts, params, seeds, per_row=True):
        for stop, t in zip(stops, tokens.tolist()):  # the step's one device-to-host copy
            if not stop.stopped:
                stop.feed(t)
        if all(s.stopped for s in stops):
            break
    return [s.ids for s in stops]


def stream(model, prompt: list[int], params: SamplingParams, tokenizer=None) -> Iterator[int]:
    """Yield new token ids one at a time through the plain loop (the same stopping rules as ``generate``;
    a stop token is not yielded)."""
    stop = TokenStops(params.stop_token_ids, params.stop_strings, tokenizer)
    for tokens, _ in generate_steps(model, [prompt], params):
        t = int(tokens[0])
        if stop.feed(t) and t in stop.stop_token_ids:
            return
        yield t
        if stop.stopped:
            return
