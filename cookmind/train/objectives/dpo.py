"""Direct Preference Optimisation (Rafailov et al. 2023), with the IPO and conservative variants.

With h = [log pi(y_w|x) - log pi(y_l|x)] - [log ref(y_w|x) - log ref(y_l|x)]:
    sigmoid (DPO, cDPO with label smoothing e):  L = -(1-e) log sigma(beta h) - e log sigma(-beta h)
    ipo     (Azar et al. 2023):                  L = (h - 1/(2 beta))^2
With ``nll_weight`` w > 0 the loss adds w * NLL, NLL = the mean over pairs of -log pi(y_w|x) / |y_w| (each chosen
response's mean token NLL), as in RPO / iterative reasoning preference optimisation (Pang et al. 2024, their
length-normalised L_NLL): it keeps the chosen answer's likelihood from falling while the margin grows. Both terms are
means over pairs, so the step's gradient is the same however the global batch is split into micro-batches and ranks
(the Trainer averages their losses, as micro-batches hold the same number of pairs). A token mean over a batch's
chosen tokens was not: averaged over micro-batches, a token of a micro-batch of short answers weighed more, and
``grad_accum_steps=2`` trained another model than one micro-batch of the whole batch.
log pi(y|x) sums (or averages, ``reduction="mean"``) the response tokens' log-probs; the prompt
and padding carry label -100 and count for nothing. Reference log-probs are computed under
no_grad, either by a frozen reference model or — for LoRA runs — by the policy itself with its
adapters switched off, which is the starting model without a second copy in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from cookmind.train.objectives.base import Objective, unwrap


def sequence_log_probs(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Per-sequence log p(labels): logits (B, T, V) predict labels shifted by one; -100 ignored. -> (B,)"""
    logits = logits[:, :-1].float()
    target = labels[:, 1:]
    mask = target != -100
    # log p(y_t) = logit[y_t] - logsumexp(logits)
    token_lp = logits.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    total = (token_lp * mask).sum(-1)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / mask.sum(-1).clamp(min=1)
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-pair losses (B,) from sequence log-probs; see the module docstring for the formulas."""
    h = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if loss_type == "sigmoid":
        return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    raise ValueError(f"dpo loss type must be 'sigmoid' or 'ipo', got {loss_type!r}")


def _pad_cat(a: torch.Tensor, b: torch.Tensor, value: int) -> torch.Tensor:
    """Stack two (B, T_i) tensors along the batch, right-padding the shorter to a common T."""
    t = max(a.shape[1], b.shape[1])
    return torch.cat([F.pad(a, (0, t - a.shape[1]), value=value), F.pad(b, (0, t - b.shape[1]), value=value)])


class DPOObjective(Objective):
    """The policy against a frozen reference on (chosen, rejected) pairs."""

    train_type = "dpo"

    def __init__(
        self,
        beta: float = 0.1,
        reduction: str = "sum",
        loss_type: str = "sigmoid",
        label_smoothing: float = 0.0,
        reference: torch.nn.Module | None = None,
        reference_context: Callable[[torch.nn.Module], contextlib.AbstractContextManager] | None = None,
        nll_weight: float = 0.0,
    ):
        if loss_type == "ipo" and label_smoothing:  # IPO's (h - 1/(2 beta))^2 has no labels: it would go unread
            raise ValueError(
                f"dpo.label_smoothing={label_smoothing:g} smooths the labels of the sigmoid loss (conservative DPO); "
                "dpo.loss=ipo has no labels to smooth and would ignore it: leave dpo.label_smoothing out, or set "
                "dpo.loss=sigmoid"
            )
        self.beta, self.reduction, self.loss_type, self.label_smoothing = beta, reduction, loss_type, label_smoothing
        self.nll_weight = nll_weight
        self.reference = reference
        # For LoRA: a context that turns the policy into the reference (adapters off).
        self.reference_context = reference_context
        if reference is None and reference_context is None:
            raise ValueError("DPOObjective needs a reference model or a reference_context (LoRA adapters off)")

    def _inputs(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = _pad_cat(batch["chosen_input_ids"], batch["rejected_input_ids"], 0)
        labels = _pad_cat(batch["chosen_labels"], batch["rejected_labels"], -100)
        return ids, labels

    def reference_log_probs(self, model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """log ref(y|x) for the stacked batch, without gradients."""
        with torch.no_grad():
            if self.reference is not None:
                logits = self.reference(ids).logits
            else:
                bare = unwrap(model)
                with self.reference_context(bare):
                    logits = bare(ids).logits
            return sequence_log_probs(logits, labels, self.reduction)

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        ids, labels = self._inputs(batch)
        n = batch["chosen_input_ids"].shape[0]
        ref = self.reference_log_probs(model, ids, labels)
        logits = model(ids).logits
        policy = sequence_log_probs(logits, labels, self.reduction)
        losses = dpo_loss(policy[:n], policy[n:], ref[:n], ref[n:], self.beta, self.loss_type, self.label_smoothing)
        loss = losses.mean()
        nll = None
        if self.nll_weight > 0:
            # each chosen response's mean token NLL, averaged over the pairs (see the module docstring)
            per_token = (
                policy[:n] / (labels[:n, 1:] != -100).sum(-1).clamp(min=1) if self.reduction == "sum" else policy[:n]
            )
            nll = -per_token.mean()
            loss = loss + self.nll_weight * nll
        with torch.no_grad():
            reward_chosen = self.beta * (policy[:n] - ref[:n])
            reward_rejected = self.beta * (policy[n:] - ref[n:])
            metrics = {
                "loss": loss.detach(),
                "reward_chosen": reward_chosen.mean(),
                "reward_rejected": reward_rejected.mean(),
                "reward_margin": (reward_chosen - reward_rejected).mean(),
                "reward_accuracy": (reward_chosen > reward_rejected).float().mean(),
            }
            if nll is not None:
                metrics["chosen_nll"] = nll.detach()
        return loss, metrics
