"""``generate``'s "serving" back end: a batch of prompts through the continuous-batching ``Engine``.

One engine is kept per model and reused across calls (GRPO rollouts call every step): it reads the model's
weights where they live, so each optimizer step is visible to the next call without rebuilding anything
(CUDA graphs replay against the same parameter memory). It leaves the weights' storage alone (no fused
projections), since an optimizer may own them.

Row i of a call draws from its own generator seeded ``seed + i``; the stop token that ended a row is returned
at its end (``generate`` drops it unless asked to keep it); a stop string ends a row with the token that
completes it (stop.TokenStops), by cancelling its request.
"""

from __future__ import annotations

import torch

from cookmind.infer.generate import check_context
from cookmind.infer.sampling import SamplingParams
from cookmind.infer.stop import TokenStops

# The engine of the model used last: (model, engine, slots, max_seq_len). One at a time: an engine holds its
# model (and GPU memory for its KV pool and graphs), so a call with another model replaces it.
_held: tuple | None = None


def release_engine() -> None:
    """Drop the kept engine (and with it its KV pool, graphs and reference to the model)."""
    global _held
    _held = None


def held_engine():
    """The engine kept for the model used last, or None."""
    return None if _held is None else _held[1]


def _engine_for(model, slots: int, max_seq_len: int):
    """The model's kept engine, rebuilt only when a call needs more rows or a longer context."""
    from cookmind.infer.engine import Engine

    global _held
    if _held is not None and _held[0] is model:
        if _held[2] >= slots and _held[3] >= max_seq_len:
            return _held[1]
        slots, max_seq_len = max(slots, _held[2]), max(max_seq_len, _held[3])  # grow: rebuild rarely
    _held = None  # free the old engine's memory before building the new one
    engine = Engine(
        model,
        num_slots=slots,
        max_seq_len=max_seq_len,
        max_waiting=1 << 30,
        prefill_chunk=max(512, slots * 64),
        fuse_projections=False,
    )
    _held = (model, engine, slots, max_seq_len)
    return engine


def engine_generate(
    model, prompts: list[list[int]], params: SamplingParams, tokenizer=None, max_rows: int = 64
) -> list[list[int]]:
    """New token ids for each prompt, in input order, the ending stop token (or stop string's last token)
    included; at most ``max_rows`` (and 256) rows decode together."""
    context = model.config.max_position_embeddings
    check_context(prompts, context)
    longest = max(len(p) for p in prompts)
    need = min(context, longest + params.max_new_tokens)
    need = min(context, -(-need // 64) * 64)  # round up: nearby lengths reuse one engine
    engine = _engine_for(model, max(1, min(len(prompts), max_rows, 256)), need)
    if params.grammar is not None:
        engine.tokenizer = tokenizer  # the grammar is matched against this call's tokenizer
    stops = [TokenStops(params.stop_token_ids, params.stop_strings, tokenizer) for _ in prompts]
    reqs: list = []

    def sink_for(i: int):
        from cookmind.infer.engine import TokenEvent

        if not stops[i].stop_strings:  # the engine ends a request at a stop token and does not emit it: the ids only
            ids = stops[i].ids

            def keep(ev) -> None:
                if type(ev) is TokenEvent:
                    ids.append(ev.token_id)

            return keep

        def sink(ev) -> None:
            if isinstance(ev, TokenEvent) and not stops[i].stopped and stops[i].feed(ev.token_id):
                engine.cancel(reqs[i], "stop")  # a stop string completed (stop tokens end the request by themselves)

        return sink

    for i, prompt in enumerate(prompts):
        row = params.replace(
            seed=None if params.seed is None else params.seed + i,
            max_new_tokens=min(params.max_new_tokens, context - len(prompt)),
            min_new_tokens=min(params.min_new_tokens, context - len(prompt)),
        )
        reqs.append(engine.submit(prompt, row, sink=sink_for(i)))
    with torch.inference_mode():
        engine.run_until_idle()
    for i, req in enumerate(reqs):
        if req.finish_reason == "error":
            raise RuntimeError(f"the engine failed on row {i} of the batch")
        if req.stop_token is not None:
            stops[i].feed(req.stop_token)
    return [s.ids for s in stops]
