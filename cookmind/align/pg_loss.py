"""Per-token policy-gradient losses: REINFORCE, REINFORCE with a baseline, GRPO-Clip; k3 KL."""

from __future__ import annotations

import torch

LOSS_TYPES = ("no_baseline", "reinforce_with_baseline", "grpo_clip")


def _column(x: torch.Tensor, name: str) -> torch.Tensor:
    """Rewards/advantages arrive as (B,) or (B, 1); broadcast them over tokens as (B, 1)."""
    if x is None:
        raise ValueError(f"compute_policy_gradient_loss: this loss_type needs {name}")
    return x.reshape(-1, 1) if x.dim() == 1 else x


def compute_naive_policy_gradient_loss(raw_rewards_or_advantages: torch.Tensor, policy_log_probs: torch.Tensor) -> torch.Tensor:
    """loss_t = -A * log pi(o_t); its gradient is the REINFORCE estimator."""
    return -_column(raw_rewards_or_advantages, "rewards") * policy_log_probs


def compute_grpo_clip_loss(
    advantages: torch.Tensor, policy_log_probs: torch.Tensor, old_log_probs: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss_t = -min(rho_t A, clip(rho_t, 1-eps, 1+eps) A),  rho_t = pi/pi_old = exp(log pi - log pi_old)."""
    adv = _column(advantages, "advantages")
    ratio = torch.exp(policy_log_probs - old_log_probs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange) * adv
    loss = -torch.minimum(unclipped, clipped)
    # the clipped term won: its gradient is zero there
    was_clipped = clipped < unclipped
    return loss, {"clipped": was_clipped, "ratio": ratio.detach()}


def k3_kl(policy_log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: r - log r - 1 with r = ref/pi; >= 0, unbiased."""
    log_r = ref_log_probs - policy_log_probs
    return torch.exp(log_r) - log_r - 1.0


def compute_policy_gradient_loss(
    policy_log_probs: torch.Tensor,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (B, T) for ``loss_type`` in no_baseline | reinforce_with_baseline | grpo_clip.

    With ``ref_log_probs`` and ``kl_coef`` > 0 adds kl_coef * k3(pi || ref) per token.
    Reduction over tokens (per sequence, per token, or by a constant) is the caller's choice;
    see ``aggregate_token_loss``.
    """
    meta: dict[str, torch.Tensor] = {}
    if loss_type == "no_baseline":
        loss = compute_naive_policy_gradient_loss(raw_rewards, policy_log_probs)
    elif loss_type == "reinforce_with_baseline":
        loss = compute_naive_policy_gradient_loss(advantages, policy_log_probs)
    elif loss_type == "grpo_clip":
        if old_log_probs is None or cliprange is None:
            raise ValueError("compute_policy_gradient_loss: grpo_clip needs old_log_probs and cliprange")
        loss, meta = compute_grpo_clip_loss(advantages, policy_log_probs, old_log_probs, cliprange)
    else:
        raise ValueError(f"compute_policy_gradient_loss: unknown loss_type {loss_type!r}; choose one of {LOSS_TYPES}")
    if ref_log_probs is not None and kl_coef:
        kl = k3_kl(policy_log_probs, ref_log_probs)
        meta["kl"] = kl.detach()
        loss = loss + kl_coef * kl
    return loss, meta
