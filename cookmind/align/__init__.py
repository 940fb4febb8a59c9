"""Alignment with verifiable rewards: building blocks, rewards, the GRPO objective and expert iteration.

GRPO and expert iteration train through ``cookmind.train.Trainer``; those heavier pieces are imported
lazily so that ``import cookmind.align`` stays cheap.
"""

from cookmind.align.losses import (
    aggregate_token_loss,
    compute_entropy,
    compute_group_normalized_rewards,
    compute_policy_gradient_loss,
    get_response_log_probs,
    grpo_microbatch_train_step,
    k3_kl,
    masked_mean,
    masked_normalize,
    sft_microbatch_train_step,
    tokenize_prompt_and_output,
)
from cookmind.align.prompts import R1_ZERO_PROMPT, format_prompt
from cookmind.align.rewards import (
    answer_reward,
    answers_match,
    extract_answer,
    extract_gold,
    format_reward,
    grade_gsm8k,
    parse_gsm8k_response,
    parse_mmlu_response,
    r1_zero_reward_fn,
)

_LAZY = {
    "GRPOConfig": "cookmind.align.objective",
    "GRPOObjective": "cookmind.align.objective",
    "evaluate_accuracy": "cookmind.align.objective",
    "ExpertIterationConfig": "cookmind.align.expert_iteration",
    "run_expert_iteration": "cookmind.align.expert_iteration",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cookmind.align' has no attribute {name!r}")


__all__ = [
    "R1_ZERO_PROMPT",
    "aggregate_token_loss",
    "answer_reward",
    "answers_match",
    "compute_entropy",
    "compute_group_normalized_rewards",
    "compute_policy_gradient_loss",
    "extract_answer",
    "extract_gold",
    "format_prompt",
    "format_reward",
    "get_response_log_probs",
    "grade_gsm8k",
    "grpo_microbatch_train_step",
    "k3_kl",
    "masked_mean",
    "masked_normalize",
    "parse_gsm8k_response",
    "parse_mmlu_response",
    "r1_zero_reward_fn",
    "sft_microbatch_train_step",
    "tokenize_prompt_and_output",
    *_LAZY,
]
