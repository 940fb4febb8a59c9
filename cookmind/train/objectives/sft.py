"""Supervised fine-tuning: cross-entropy on assistant tokens only (labels are -100 elsewhere)."""

from __future__ import annotations

from typing import Any

import torch

from cookmind.train.objectives.base import Objective


class SFTObjective(Objective):
    """loss = -mean over supervised t of log p(y_t | prefix); prompt/padding labels are -100."""

    train_type = "sft"
    count_metrics = ("supervised_tokens",)
    token_mean_loss = True  # over the global batch's supervised tokens, however it is split

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        labels = batch["labels"]
        out = model(
            batch["input_ids"], labels=labels, position_ids=batch.get("position_ids"), return_logits=False
        )  # only the loss is read
        supervised = (labels[:, 1:] != -100).sum()
        return out.loss, {"loss": out.loss.detach(), "supervised_tokens": supervised}
