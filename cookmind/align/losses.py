"""The losses of alignment: masked reductions, per-token log-probs and entropy, policy-gradient losses,
group-normalised advantages, the SFT/GRPO micro-batch steps and prompt+response packing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cookmind.align.prompts import pad_id_of
from cookmind.tokenizer.documents import continuation_ids

# -- Reductions that count only the positions a mask selects --------------------------------------------------------


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(tensor * mask) / sum(mask), over ``dim`` (all elements when None)."""
    kept = torch.where(mask.bool(), tensor, torch.zeros_like(tensor))  # where, not *, so inf/nan outside stay out
    count = mask.to(tensor.dtype)
    if dim is None:
        return kept.sum() / count.sum()
    return kept.sum(dim=dim) / count.sum(dim=dim)


def masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None, normalize_constant: float = 1.0
) -> torch.Tensor:
    """sum(tensor * mask) / normalize_constant, over ``dim`` (all elements when None).

    A fixed constant instead of the mask count is Dr. GRPO's remedy for the length bias
    of per-sequence means.
    """
    kept = torch.where(mask.bool(), tensor, torch.zeros_like(tensor))
    if dim is None:
        return kept.sum() / normalize_constant
    return kept.sum(dim=dim) / normalize_constant


# -- Per-token entropy of the next-token distribution ---------------------------------------------------------------


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum_v p_v log p_v over the last dim, with p = softmax(logits); shape (..., V) -> (...).

    Computed from log-softmax (logits - logsumexp) so large logits never overflow.
    """
    log_p = logits.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    return -(log_p.exp() * log_p).sum(dim=-1)


# -- Log-probabilities of the given labels under a policy (any callable returning logits) ---------------------------


def logits_of(output) -> torch.Tensor:
    """A model's logits whether it returns a tensor, an object with ``.logits`` or a dict."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    logits = getattr(output, "logits", None)
    if logits is None:
        raise TypeError(f"policy returned {type(output).__name__}; expected a logits tensor or an object with .logits")
    return logits


def gather_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels) = logits[label] - logsumexp(logits); labels < 0 (ignored) read as 0."""
    logits = logits.float()
    safe = labels.clamp(min=0).unsqueeze(-1)
    return logits.gather(-1, safe).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def get_response_log_probs(
    model, input_ids: torch.Tensor, labels: torch.Tensor, return_token_entropy: bool = False
) -> dict[str, torch.Tensor]:
    """Per-token log p(labels | prefix), (B, T); with ``token_entropy`` (B, T) when asked.

    ``model(input_ids)`` may return logits or an output object holding ``.logits``; our
    CookMindLM and a Hugging Face causal LM both work.
    """
    logits = logits_of(model(input_ids))
    if logits.shape[:2] != labels.shape:
        raise ValueError(
            f"get_response_log_probs: logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}"
        )
    out = {"log_probs": gather_log_probs(logits, labels)}
    if return_token_entropy:
        out["token_entropy"] = compute_entropy(logits)
    return out


# -- Per-token policy-gradient losses: REINFORCE, REINFORCE with a baseline, GRPO-Clip; k3 KL -----------------------


LOSS_TYPES = ("no_baseline", "reinforce_with_baseline", "grpo_clip")


def _column(x: torch.Tensor, name: str) -> torch.Tensor:
    """Rewards/advantages arrive as (B,) or (B, 1); broadcast them over tokens as (B, 1)."""
    if x is None:
        raise ValueError(f"compute_policy_gradient_loss: this loss_type needs {name}")
    return x.reshape(-1, 1) if x.dim() == 1 else x


def compute_naive_policy_gradient_loss(
    raw_rewards_or_advantages: torch.Tensor, policy_log_probs: torch.Tensor
) -> torch.Tensor:
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


# -- GRPO's advantage: each rollout's reward measured against its own group -----------------------------------------


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
        raise ValueError(
            f"compute_group_normalized_rewards: {n} responses but {len(repeated_ground_truths)} ground truths"
        )
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


# -- One micro-batch of SFT or GRPO: loss, scaled for gradient accumulation, then backward --------------------------


LENGTH_NORMALIZATIONS = ("sequence", "token", "constant")


def aggregate_token_loss(
    per_token_loss: torch.Tensor,
    response_mask: torch.Tensor,
    length_normalization: str = "sequence",
    normalize_constant: float = 1.0,
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
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    normalize_constant: float = 1.0,
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


# -- Prompt + response pairs as one padded batch, with a mask over the response tokens ------------------------------


def tokenize_prompt_and_output(prompt_strs: list[str], output_strs: list[str], tokenizer) -> dict[str, torch.Tensor]:
    """Tokenize each prompt and its output, join them and pad to the longest join. A prompt opens a document
    (``prompt_ids``: Llama's <s> first, none for cookmind's tokenizers); an output's ids are those of prompt and
    output written as one text, past the prompt's (``continuation_ids``: no SentencePiece dummy "▁" between).

    Returns ``input_ids`` = joined[:, :-1], ``labels`` = joined[:, 1:] and ``response_mask``
    (1 where the *label* is a response token), each (batch, longest prompt+output - 1).
    Padding uses the tokenizer's pad id (labels there are masked out, never -100, so they
    can be gathered directly).
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(
            f"tokenize_prompt_and_output: {len(prompt_strs)} prompts but {len(output_strs)} outputs; "
            "pass one output per prompt"
        )
    # each prompt opens a document (Llama's <s>); its output's ids are those it has written after it
    prompts, outputs = zip(*(continuation_ids(tokenizer, p, o) for p, o in zip(prompt_strs, output_strs)))
    return pack_prompt_and_output(list(prompts), list(outputs), pad_id_of(tokenizer))


def pack_prompt_and_output(
    prompt_ids: list[list[int]], output_ids: list[list[int]], pad: int
) -> dict[str, torch.Tensor]:
    """``tokenize_prompt_and_output`` for text already tokenized (rollouts keep their sampled ids:
    re-encoding decoded text can give other ids than the ones the policy chose)."""
    joined = [list(p) + list(o) for p, o in zip(prompt_ids, output_ids)]
    masks = [[0] * len(p) + [1] * len(o) for p, o in zip(prompt_ids, output_ids)]
    width = max(len(ids) for ids in joined)
    if width < 2:
        raise ValueError("tokenize_prompt_and_output: every prompt+output is shorter than 2 tokens; nothing to predict")
    ids = torch.full((len(joined), width), pad, dtype=torch.long)
    mask = torch.zeros((len(joined), width), dtype=torch.bool)
    for row, (seq, m) in enumerate(zip(joined, masks)):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.bool)
    # target t+1 is predicted at position t, so the mask follows the labels
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask[:, 1:]}
