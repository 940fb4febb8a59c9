"""Pretraining: next-token cross-entropy over every position (the model shifts labels inside)."""

from __future__ import annotations

from typing import Any

import torch

from cookmind.train.objectives.base import Objective


class PretrainObjective(Objective):
    """loss = -mean_t log p(x_{t+1} | x_<=t), computed by the model from ``labels``."""

    train_type = "seq"

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        # only the loss is read: the model need not write out the (B, T, V) logits
        out = model(
            batch["input_ids"], labels=batch["labels"], position_ids=batch.get("position_ids"), return_logits=False
        )
        return out.loss, {"loss": out.loss.detach()}
