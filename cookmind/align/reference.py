"""The frozen reference policy for the KL penalty: a copy of the start, or the base under LoRA."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from cookmind.align.losses import get_response_log_probs
from cookmind.parallel.fsdp import copy_shards, is_sharded


def _adapters_off(model):
    """A context manager that runs ``model`` without its LoRA adapters, or None when it has none."""
    from cookmind.model.lora import adapters_disabled, has_lora

    if has_lora(model):  # cookmind's own (lora.enabled=true)
        return adapters_disabled(model)
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
    shard: for a model sharded by FSDP, what shards the copy like it (``cookmind.parallel.shard_frozen``); the
          copy is then sharded too (memory x2 of this rank's shards, not of the model) and every rank must call
          ``log_probs`` together, as for the policy's forwards.
    """

    def __init__(self, model, kind: str = "copy", shard: Callable[[nn.Module], nn.Module] | None = None):
        if kind not in ("copy", "base"):
            raise ValueError(
                f"reference kind {kind!r}: choose 'copy' (frozen copy) or 'base' (LoRA base, adapters off)"
            )
        self.kind = kind
        if kind == "copy" and is_sharded(model):
            if shard is None:
                raise ValueError("Reference: a model sharded by FSDP needs shard= (cookmind.parallel.shard_frozen)")
            self.model = sharded_copy(model, shard).eval()
        elif kind == "copy":
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


def sharded_copy(model: nn.Module, shard: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """A frozen copy of ``model`` (sharded by FSDP, which cannot be deep-copied), sharded alike by ``shard``.

    Rebuilt from the model's class and ``config`` on the meta device (LoRA adapters again from its
    ``lora_config``), sharded, given memory for this rank's shards only, and filled with this rank's shards and
    the buffers of ``model``: no rank ever holds the whole model. Training wrappers (checkpointing, compile, FP8
    blocks) are not copied: the copy runs forwards without gradients.
    """
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # fully_shard subclasses it
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(
            f"grpo.reference=copy under parallel.fsdp rebuilds the model from its class and .config; "
            f"{cls.__name__} has no .config: use grpo.reference=base (LoRA) or parallel.fsdp=false"
        )
    device = next(model.parameters()).device
    with torch.device("meta"):
        ref = cls(copy.deepcopy(config))
        lora = getattr(model, "lora_config", None)
        if lora is not None:
            from cookmind.model.lora import apply_lora

            apply_lora(ref, lora["r"], lora["alpha"], lora["dropout"], lora["targets"])
    ref.requires_grad_(False)
    shard(ref)
    ref.to_empty(device=device)
    copy_shards(ref, model)
    return ref
