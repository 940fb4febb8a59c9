"""Rollouts: sampled responses through ``cookmind.infer.generate``, scored and laid out as a training batch.

Everything about decoding (the sampler, the KV-cache loop for our model, a Hugging Face / peft model or a
logits callable, the serving engine on CUDA, stop tokens and strings) lives in ``cookmind.infer``; this adds
what rollouts want on top: the stop token kept at the end of a response (the policy gradient trains on it).
"""

from __future__ import annotations

from collections.abc import Callable

from cookmind.align.losses import compute_group_normalized_rewards, pack_prompt_and_output
from cookmind.align.prompts import decode_response, pad_id_of
from cookmind.infer import SamplingParams, generate

__all__ = ["SamplingParams", "collect_rollouts", "generate_ids"]


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


def cut_short(model, prompt_ids: list[list[int]], responses: list[list[int]], params: SamplingParams) -> list[bool]:
    """Whether each response ran out of room before it ended: it holds ``params.max_new_tokens`` tokens, or fills the
    model's context after its prompt, and its last token is no stop token (a stop string at the very end counts as
    cut: the ids do not say which). Such a response is graded and trained on as it stood."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    stops = set(params.stop_token_ids)
    cut = []
    for prompt, response in zip(prompt_ids, responses):
        room = (
            params.max_new_tokens if not isinstance(context, int) else min(params.max_new_tokens, context - len(prompt))
        )
        cut.append(len(response) >= room and not (response and response[-1] in stops))
    return cut


def collect_rollouts(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    answers: list[str],
    group_size: int,
    params: SamplingParams,
    reward_fn: Callable[[str, str], dict[str, float]],
    advantage_eps: float = 1e-6,
    normalize_by_std: bool = True,
    *,
    batch_size: int = 64,
    engine: str = "auto",
) -> dict:
    """Sample ``group_size`` responses per prompt, score them, and lay them out for training.

    batch_size and engine go to ``generate_ids`` (rows per forward; "auto", "builtin" or "serving").
    Returns input_ids / labels / response_mask (B*G, T), advantages and raw_rewards (B*G,),
    the response texts and token lists, and reward metadata (means of reward, format reward, accuracy).
    """
    if len(prompt_ids) != len(answers):
        raise ValueError(f"collect_rollouts: {len(prompt_ids)} prompts but {len(answers)} answers")
    rep_prompts = [list(p) for p in prompt_ids for _ in range(group_size)]
    rep_answers = [a for a in answers for _ in range(group_size)]
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        responses = generate_ids(model, rep_prompts, params, tokenizer, batch_size=batch_size, engine=engine)
    finally:
        if was_training:
            model.train()
    cut = cut_short(model, rep_prompts, responses, params)
    # an empty response still needs one target for the tensors; it scores as whatever the grader says of ""
    responses = [r if r else [pad_id_of(tokenizer)] for r in responses]
    texts = [decode_response(tokenizer, r) for r in responses]
    advantages, raw, meta = compute_group_normalized_rewards(
        reward_fn, texts, rep_answers, group_size, advantage_eps, normalize_by_std
    )
    batch = pack_prompt_and_output(rep_prompts, responses, pad_id_of(tokenizer))
    meta["response_length"] = sum(len(r) for r in responses) / len(responses)
    meta["cut_short"] = sum(cut) / len(cut)  # the share that ran into max_new_tokens or the context unfinished
    batch.update(
        {
            "advantages": advantages,
            "raw_rewards": raw,
            "responses": texts,
            "response_ids": responses,
            "answers": rep_answers,
            "metadata": meta,
        }
    )
    return batch
