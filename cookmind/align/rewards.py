"""Verifiable rewards: a format reward for <think>…</think> <answer>…</answer>, an answer reward, and both."""

from __future__ import annotations

import re

from cookmind.align.grading import answers_match, extract_answer, extract_gold

# the prompt ends with "<think>", so a well-formed response is: reasoning </think> <answer> … </answer>
_FORMAT_RE = re.compile(r"^(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)
_TRAILING_SPECIALS = re.compile(r"(?:\s*<\|(?:endoftext|im_end)\|>)+\s*$")


def format_reward(response: str) -> float:
    """1.0 when ``response`` is ``… </think> <answer> … </answer>`` (only end tokens after), else 0.0."""
    body = _TRAILING_SPECIALS.sub("", response)
    match = _FORMAT_RE.match(body)
    if not match or "<answer>" in match.group("think") or "</think>" in match.group("answer"):
        return 0.0
    return 1.0 if match.group("answer").strip() else 0.0


def answer_reward(response: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0."""
    return 1.0 if answers_match(extract_answer(response), extract_gold(ground_truth)) else 0.0


def r1_zero_reward_fn(response: str, ground_truth: str, format_weight: float = 0.0) -> dict[str, float]:
    """R1-Zero reward: the answer counts only inside the format.

    reward = answer_reward * format_reward + format_weight * format_reward
    (format_weight 0 is the paper's; a small positive weight helps a tiny model learn the tags).
    """
    fmt = format_reward(response)
    ans = answer_reward(response, ground_truth) if fmt else 0.0
    return {"format_reward": fmt, "answer_reward": ans, "reward": ans * fmt + format_weight * fmt}


_HASH_RE = re.compile(r"####\s*[-+$]?\s*\d")


def hash_reward_fn(response: str, ground_truth: str, format_weight: float = 0.0) -> dict[str, float]:
    """GSM8K's own format: the answer follows ``#### ``; format reward 1 when that line is present.

    reward = answer_reward * format_reward + format_weight * format_reward.
    """
    fmt = 1.0 if _HASH_RE.search(response) else 0.0
    ans = answer_reward(response, ground_truth) if fmt else 0.0
    return {"format_reward": fmt, "answer_reward": ans, "reward": ans * fmt + format_weight * fmt}


def reward_fn_for_template(template: str, format_weight: float = 0.0):
    """r1-zero tags for prompts that open <think>; ``#### N`` for chat; the last number otherwise."""
    from cookmind.align.prompts import uses_think_tags

    if uses_think_tags(template):
        return lambda r, g: r1_zero_reward_fn(r, g, format_weight)
    if template == "chat":
        return lambda r, g: hash_reward_fn(r, g, format_weight)
    return plain_reward_fn


def plain_reward_fn(response: str, ground_truth: str) -> dict[str, float]:
    """For models not taught the tags: the final answer (####, \\boxed, last number) against the reference."""
    ans = answer_reward(response, ground_truth)
    return {"format_reward": 1.0 if extract_answer(response) is not None else 0.0, "answer_reward": ans, "reward": ans}
