"""The objective seam: a small object that turns a batch into a loss.

    loss, metrics = objective(model, batch)

The Trainer owns everything else (precision, accumulation, DDP, checkpoints). An objective
that must act before the loss — GRPO generating rollouts with the current policy — overrides
``prepare(model, batch)``, which the Trainer calls once per micro-batch before the forward pass,
outside autocast and without gradients. ``setup(trainer)`` runs once before the first step
(reference models, tokenizers); ``state_dict`` / ``load_state_dict`` carry any objective state
(e.g. running reward statistics) through checkpoints so resume stays exact.
"""

from __future__ import annotations

from typing import Any

import torch

from cookmind.parallel import unwrap as unwrap  # objectives reach the plain model through the Trainer's wrappers


class Objective:
    """Base class; subclasses set ``train_type`` (the dataset they read) and implement ``__call__``."""

    train_type: str = "seq"

    def setup(self, trainer: Any) -> None:
        """Called once by the Trainer before training (after the model is built and wrapped)."""

    def prepare(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, Any]:
        """Turn a data batch into a loss batch (default: unchanged). Runs under no_grad."""
        return batch

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        raise NotImplementedError

    # metrics that count things in a batch (summed over the validation set); the others are means, weighted by
    # each batch's ``loss_units``
    count_metrics: tuple[str, ...] = ()

    def loss_units(self, batch: dict[str, Any]) -> float:
        """How many terms the batch's loss is the mean of: its target tokens where it has ``labels`` (the model
        predicts labels[:, 1:]), else its rows (DPO's pairs). Validation weights each batch by it, so the loss of
        the set is the mean over its tokens, whatever the batches' sizes."""
        if torch.is_tensor(batch.get("labels")):
            return float(self.target_tokens(batch))
        return float(next((len(v) for v in batch.values() if torch.is_tensor(v) and v.dim() > 0), 1))

    # the loss is a mean over target tokens whose number varies from batch to batch (SFT's supervised tokens): the
    # Trainer then weights each micro-batch by its share of the global batch's tokens, over every micro-batch and
    # rank, so the step's loss is the mean over the global batch's tokens however it is split (a mean of
    # micro-batch means would weight a token of a short micro-batch more)
    token_mean_loss: bool = False

    def target_tokens(self, batch: dict[str, Any]) -> torch.Tensor:
        """The number of terms of the batch's loss (its labels[:, 1:] other than -100), as a tensor on the batch's
        device, read by the Trainer without waiting for the device (``loss_units`` is it as a host number)."""
        return (batch["labels"][:, 1:] != -100).sum()

    def num_tokens(self, batch: dict[str, Any]) -> int:
        """Tokens processed by one forward pass over ``batch`` (for tokens/s and MFU)."""
        return int(sum(v.numel() for k, v in batch.items() if k.endswith("input_ids") and torch.is_tensor(v)))

    def state_dict(self) -> dict[str, Any]:
        """Objective state to checkpoint (JSON-serialisable)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
