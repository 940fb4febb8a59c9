"""One micro-batch of SFT or GRPO: loss, scaled for gradient accumulation, then backward."""

from __future__ import annotations

import torch

from cookmind.align.masked import masked_mean, masked_normalize
from cookmind.align.pg_loss import compute_policy_gradient_loss

LENGTH_NORMALIZATIONS = ("sequence", "token", "constant")


def aggregate_token_loss(
    per_token_loss: torch.Tensor, response_mask: torch.Tensor, length_normalization: str = "sequence", normalize_constant: float = 1.0
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    sequence: mean_b( sum_t l_bt m_bt / sum_t m_bt )    (GRPO as published: short answers weigh more per token)
    token:    sum_bt l_bt m_bt / sum_bt m_bt             (DAPO: every token counts the same)
    constant: mean_b( sum_t l_bt m_bt / C )             (Dr. GRPO: C fixed, e.g. the max generation length)
    """
    if length_normalization == "sequence":
        return masked_mean(per_token_loss, response_mask, dim=-1).mean()
    if length_normalization == "token":
        return masked_mean(per_token_loss, response_mask)
    if length_normalization == "constant":
        return masked_normalize(per_token_loss, response_mask, dim=-1, normalize_constant=normalize_constant).mean()
    raise ValueError(f"unknown length_normalization {length_normalization!r}; choose one of {LENGTH_NORMALIZATIONS}")


def sft_microbatch_train_step(
    policy_log_probs: torch.Tensor, response_mask: torch.Tensor, gradient_accumulation_steps: int, normalize_constant: float = 1.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss = mean_b( -sum_t log p_bt m_bt / normalize_constant ) / gradient_accumulation_steps; backward.

    Returns the scaled loss (what was backpropagated) and metadata with the unscaled loss and
    the number of response tokens.
    """
    per_seq_nll = -masked_normalize(policy_log_probs, response_mask, dim=-1, normalize_constant=normalize_constant)
    unscaled = per_seq_nll.mean()
    loss = unscaled / gradient_accumulation_steps
    loss.backward()
    return loss.detach(), {"loss_unscaled": unscaled.detach(), "num_response_tokens": response_mask.sum().detach()}


def grpo_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    loss_type: str,
    raw_rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    length_normalization: str = "sequence",
    normalize_constant: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient loss over the response tokens, / gradient_accumulation_steps; backward.

    The per-token loss comes from ``compute_policy_gradient_loss``; ``length_normalization``
    picks the reduction (see ``aggregate_token_loss``). Metadata: clip fraction over response
    tokens (grpo_clip) and mean k3 KL (with a reference).
    """
    per_token, pg_meta = compute_policy_gradient_loss(
        policy_log_probs, loss_type, raw_rewards, advantages, old_log_probs, cliprange, ref_log_probs, kl_coef
    )
    unscaled = aggregate_token_loss(per_token, response_mask, length_normalization, normalize_constant)
    loss = unscaled / gradient_accumulation_steps
    loss.backward()
    meta: dict[str, torch.Tensor] = {"loss_unscaled": unscaled.detach()}
    if "clipped" in pg_meta:
        meta["clip_fraction"] = masked_mean(pg_meta["clipped"].float(), response_mask).detach()
    if "kl" in pg_meta:
        meta["kl"] = masked_mean(pg_meta["kl"], response_mask).detach()
    return loss.detach(), meta
