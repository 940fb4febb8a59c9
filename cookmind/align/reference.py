"""The frozen reference policy for the KL penalty: a copy of the start, or the base under LoRA."""

from __future__ import annotations

import contextlib
import copy

import torch

from cookmind.align.losses import get_response_log_probs


def _adapters_off(model):
    """A context manager that runs ``model`` without its LoRA adapters, or None when it has none."""
    if hasattr(model, "disable_adapter"):  # peft
        return model.disable_adapter()
    if hasattr(model, "disable_adapters") and callable(model.disable_adapters):
        result = model.disable_adapters()
        if hasattr(result, "__enter__"):
            return result
    return None


class Reference:
    """Computes log pi_ref(labels | inputs) without gradients.

    kind: "copy" freezes a deep copy of the model as it is now (memory x2);
          "base" runs the policy itself with its LoRA adapters switched off (no copy; the
          adapters' starting point is the base model, so this is the start of training).
    """

    def __init__(self, model, kind: str = "copy"):
        if kind not in ("copy", "base"):
            raise ValueError(
                f"reference kind {kind!r}: choose 'copy' (frozen copy) or 'base' (LoRA base, adapters off)"
            )
        self.kind = kind
        if kind == "copy":
            self.model = copy.deepcopy(model).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        else:
            if _adapters_off(model) is None:
                raise ValueError(
                    "reference 'base' needs a LoRA model (peft, or one with disable_adapters()); use 'copy'"
                )
            self.model = model

    @torch.no_grad()
    def log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs (B, T) under the reference."""
        ctx = _adapters_off(self.model) if self.kind == "base" else contextlib.nullcontext()
        with ctx:
            return get_response_log_probs(self.model, input_ids, labels)["log_probs"]
