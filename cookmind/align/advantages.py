"""GRPO's advantage: each rollout's reward measured against its own group."""

from __future__ import annotations

from typing import Callable

import torch


def compute_group_normalized_rewards(
    reward_fn: Callable[[str, str], dict[str, float]],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
    group_size: int,
    advantage_eps: float,
    normalize_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Score every rollout and normalise within its group of ``group_size``.

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)   (std: unbiased, as torch.std)
    or A_i = r_i - mean(r_group) when ``normalize_by_std`` is False (Dr. GRPO).
    Rollouts of one prompt are consecutive. Returns (advantages (N,), raw rewards (N,), metadata).
    """
    n = len(rollout_responses)
    if n != len(repeated_ground_truths):
        raise ValueError(f"compute_group_normalized_rewards: {n} responses but {len(repeated_ground_truths)} ground truths")
    if group_size < 1 or n % group_size:
        raise ValueError(f"compute_group_normalized_rewards: {n} responses do not split into groups of {group_size}")
    scores = [reward_fn(resp, gt) for resp, gt in zip(rollout_responses, repeated_ground_truths)]
    raw = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)
    groups = raw.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if normalize_by_std:
        std = groups.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(groups[:, :1])
        centred = centred / (std + advantage_eps)
    meta = {
        "reward_mean": raw.mean().item(),
        "reward_std": raw.std().item() if n > 1 else 0.0,
        "reward_max": raw.max().item(),
        "reward_min": raw.min().item(),
        # groups where every rollout scored the same teach nothing (zero advantage)
        "frac_zero_std_groups": (groups.std(dim=1) == 0).float().mean().item() if group_size > 1 else 1.0,
    }
    for key in ("format_reward", "answer_reward"):
        if scores and key in scores[0]:
            meta[key + "_mean"] = sum(float(s[key]) for s in scores) / n
    return centred.reshape(-1), raw, meta
