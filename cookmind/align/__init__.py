"""Alignment with verifiable rewards: building blocks, rewards, the GRPO objective and expert iteration.

GRPO and expert iteration train through ``cookmind.train.Trainer``; those heavier pieces are imported
lazily so that ``import cookmind.align`` stays cheap.
"""

from cookmind.align.advantages import compute_group_normalized_rewards
from cookmind.align.entropy import compute_entropy
from cookmind.align.grading import answers_match, extract_answer, extract_gold, grade_gsm8k
from cookmind.align.log_probs import get_response_log_probs
from cookmind.align.masked import masked_mean, masked_normalize
from cookmind.align.parse import parse_gsm8k_response, parse_mmlu_response
from cookmind.align.pg_loss import compute_policy_gradient_loss, k3_kl
from cookmind.align.prompts import R1_ZERO_PROMPT, format_prompt
from cookmind.align.rewards import answer_reward, format_reward, r1_zero_reward_fn
from cookmind.align.tokenize_pairs import tokenize_prompt_and_output
from cookmind.align.train_step import aggregate_token_loss, grpo_microbatch_train_step, sft_microbatch_train_step

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
