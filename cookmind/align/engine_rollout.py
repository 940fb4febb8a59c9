"""Rollouts through the serving engine (continuous batching, paged KV cache, CUDA graphs on GPU).

The built-in loop in rollout.py runs the model's forward once per token with a contiguous KV
cache; the serving engine decodes the same model several times faster on a GPU. One engine is kept
per model and reused across GRPO steps: it reads the model's weights where they live, so each
optimizer step is visible to the next rollout without rebuilding anything (CUDA graphs replay
against the same parameter memory). It leaves the weights' storage alone (no fused projections),
since the optimizer owns them.

What GRPO needs beyond serving:
  - distinct samples within a group: row i of a call draws from its own generator, seeded
    ``seed + i`` (reproducible under a seed; unseeded rows draw from fresh entropy);
  - the stop token kept at the end of a response that hit it (the policy gradient trains on it);
  - stop strings: the response ends with the token that completes one, like the built-in loop.
"""

from __future__ import annotations

import torch

from cookmind.align.rollout import SamplingParams

# The engine of the model used last: (model, engine, slots, max_seq_len). One at a time: an engine holds its
# model (and GPU memory for its KV pool and graphs), so rollouts of another model replace it.
_held: tuple | None = None


def release_engine() -> None:
    """Drop the kept engine (and with it its KV pool, graphs and reference to the model)."""
    global _held
    _held = None


def supports(model, params: SamplingParams) -> bool:
    """Whether the engine can run these rollouts: a CookMindLM without LoRA modules (the engine reads
    plain projection weights), and no min_new_tokens (the engine has no ban on early stop tokens)."""
    if type(model).__name__ != "CookMindLM" or params.min_new_tokens > 0:
        return False
    from cookmind.model.lora import has_lora

    return not has_lora(model)


def _engine_for(model, slots: int, max_seq_len: int):
    """The model's cached engine, rebuilt only when a call needs more rows or a longer context."""
    from cookmind.infer.engine import Engine

    global _held
    if _held is not None and _held[0] is model:
        if _held[2] >= slots and _held[3] >= max_seq_len:
            return _held[1]
        slots, max_seq_len = max(slots, _held[2]), max(max_seq_len, _held[3])  # grow: rebuild rarely
    _held = None  # free the old engine's memory before building the new one
    engine = Engine(model, num_slots=slots, max_seq_len=max_seq_len, max_waiting=1 << 30,
                    prefill_chunk=max(512, slots * 64), fuse_projections=False)
    _held = (model, engine, slots, max_seq_len)
    return engine


def engine_generate_ids(model, prompts: list[list[int]], params: SamplingParams, tokenizer=None) -> list[list[int]]:
    """New token ids for each prompt through the serving engine, in input order (stop token or the
    token completing a stop string included at the end when hit)."""
    from cookmind.infer.engine import TokenEvent
    from cookmind.infer.sampling import SamplingParams as EngineParams

    context = model.config.max_position_embeddings
    longest = max(len(p) for p in prompts)
    if longest >= context:
        raise ValueError(f"a prompt of {longest} tokens leaves no room in the model's context of {context}")
    need = min(context, longest + params.max_new_tokens)
    need = min(context, -(-need // 64) * 64)  # round up: nearby lengths reuse one engine
    slots = max(1, min(len(prompts), params.batch_size, 256))
    engine = _engine_for(model, slots, need)
    if params.stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer to decode the responses; pass tokenizer=")
    from cookmind.align.prompts import decode_ids

    tail = max((len(x) for x in params.stop_strings), default=0) + 4
    outs: list[list[int]] = [[] for _ in prompts]
    reqs: list = []

    def sink_for(i: int):
        done = [False]

        def sink(ev) -> None:
            if done[0] or not isinstance(ev, TokenEvent):
                return
            outs[i].append(ev.token_id)
            if params.stop_strings and any(s in decode_ids(tokenizer, outs[i][-tail:]) for s in params.stop_strings):
                done[0] = True
                engine.cancel(reqs[i])

        return sink

    greedy = params.temperature <= 0
    for i, prompt in enumerate(prompts):
        sp = EngineParams(temperature=max(params.temperature, 0.0), top_p=params.top_p if not greedy else 1.0,
                          seed=None if params.seed is None else params.seed + i)
        reqs.append(engine.submit(prompt, sp, min(params.max_new_tokens, context - len(prompt)),
                                  stop_token_ids=params.stop_token_ids, sink=sink_for(i)))
    with torch.inference_mode():
        engine.run_until_idle()
    for i, req in enumerate(reqs):
        if req.finish_reason == "error":
            raise RuntimeError(f"the engine failed on rollout {i}")
        if req.stop_token is not None:
            outs[i].append(req.stop_token)
    return outs

