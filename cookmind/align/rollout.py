"""Sampling responses for rollouts and evaluation: the rollout seam over ``cookmind.infer.generate``.

Everything about decoding (the sampler, the KV-cache loop for our model, a Hugging Face / peft model or a
logits callable, the serving engine on CUDA, stop tokens and strings) lives in ``cookmind.infer``; this adds
what rollouts want on top: the stop token kept at the end of a response (the policy gradient trains on it).
"""

from __future__ import annotations

from cookmind.infer import SamplingParams, generate

__all__ = ["SamplingParams", "generate_ids"]


def generate_ids(
    model,
    prompts: list[list[int]],
    params: SamplingParams,
    tokenizer=None,
    *,
    batch_size: int = 64,
    engine: str = "auto",
) -> list[list[int]]:
    """New token ids for each prompt, in input order; the stop token or the token completing a stop string is
    included at the end when hit. Row i is seeded ``params.seed + i``. engine: "auto", "builtin" (the plain
    KV-cache loop) or "serving" (the continuous-batching engine); see ``cookmind.infer.generate``."""
    return generate(model, prompts, params, tokenizer, keep_stop_token=True, batch_size=batch_size, engine=engine)
