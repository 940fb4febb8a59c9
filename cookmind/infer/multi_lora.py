"""Several LoRA adapters served by one model at once: every row of a batch picks its own adapter (or none).

``attach_adapters`` replaces each projection some adapter targets with a ``MultiLoRALinear``: the base ``weight``
(and ``bias``) stay as they were, and every adapter's low-rank pair is stacked, index 0 being no adapter (zeros):

    A: (n+1, r_max, in), B: (n+1, out, r_max), scale: (n+1,)
    y = x W^T + b + scale[i] * (x A[i]^T) B[i]^T        for a row served by adapter i

An adapter of rank r < r_max fills the first r rows of A and columns of B; the zeros beyond add nothing, and an
adapter that does not target a module has zeros there. The product runs as two batched matmuls over the rows'
gathered pairs, for prefill (B, T, in) and decode (B, 1, in) alike.

A row's adapter is read from a device tensor, never a Python value: the engine writes each slot's adapter into
``by_slot`` when it admits a request, and the runner copies the forward's rows out of it into ``rows``, the one
tensor every layer reads. CUDA graphs replay over those fixed buffers, so one captured graph serves any mix of
adapters. The projections stay unfused (``model.fused`` leaves a layer with ``lora_A`` alone), so attach before
the runner is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LoRAAdapter:
    """One adapter read from disk (``loading.load_adapters``): module name -> (A (r, in), B (out, r)), and the
    scaling that multiplies B A (alpha / r, or alpha / sqrt(r) with rsLoRA)."""

    name: str
    path: Path
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class AdapterRows:
    """The adapter index of every slot (``by_slot``, set at admission) and of the rows of the running forward
    (``rows``, what the layers read); both fixed device tensors."""

    def __init__(self, names: list[str], num_slots: int, device):
        self.names = list(names)
        with torch.inference_mode():  # like every other input of a compiled layer: one compilation serves all
            self.by_slot = torch.zeros(num_slots, dtype=torch.long, device=device)
            self.rows = torch.zeros(num_slots, dtype=torch.long, device=device)

    def index(self, name: str | None) -> int:
        """The stack index of adapter ``name`` (0: None, the base model); ValueError naming the served ones."""
        if name is None:
            return 0
        if name not in self.names:
            raise ValueError(f"unknown adapter {name!r}; this engine serves {self.names}")
        return self.names.index(name) + 1

    def set_slot(self, slot: int, index: int) -> None:
        """The request in ``slot`` is served by adapter ``index`` (0: none) from its next forward on."""
        self.by_slot[slot] = index

    def select(self, slot_start: int, b: int) -> None:
        """Before a forward over slots slot_start..slot_start+b-1: their adapters become rows 0..b-1."""
        self.rows[:b].copy_(self.by_slot[slot_start : slot_start + b])


class MultiLoRALinear(nn.Module):
    """A projection plus, per row, the low-rank update of that row's adapter (see the module docstring)."""

    def __init__(self, base: nn.Module, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = base.weight.shape[1], base.weight.shape[0]
        self.weight = base.weight
        self.bias = getattr(base, "bias", None)
        # buffers, not parameters: nothing here trains. Named as PEFT's so fuse_projections leaves the layer alone.
        self.register_buffer("lora_A", a, persistent=False)  # (n+1, r_max, in)
        self.register_buffer("lora_B", b, persistent=False)  # (n+1, out, r_max)
        self.register_buffer("lora_scale", scale, persistent=False)  # (n+1,)
        self.register_buffer("rows", rows, persistent=False)  # AdapterRows.rows, shared by every layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        n = x.shape[0]
        xs = x.reshape(n, -1, x.shape[-1])  # (B, T, in); the LM head sees (B, in)
        idx = self.rows[:n]
        low = torch.bmm(xs, self.lora_A[idx].transpose(1, 2)) * self.lora_scale[idx].to(x.dtype)[:, None, None]
        delta = torch.bmm(low, self.lora_B[idx].transpose(1, 2))  # (B, T, out)
        return y + delta.reshape(y.shape)

    def extra_repr(self) -> str:
        n, r = self.lora_A.shape[0] - 1, self.lora_A.shape[1]
        return f"in={self.in_features}, out={self.out_features}, adapters={n}, r_max={r}"


def attach_adapters(model: nn.Module, adapters: list[LoRAAdapter], num_slots: int) -> AdapterRows:
    """Wrap every module some adapter targets in a ``MultiLoRALinear`` (in place; call before building the
    runner) and return the per-slot adapter table. Adapter i (1-based) is ``adapters[i - 1]``."""
    if any(isinstance(m, MultiLoRALinear) for m in model.modules()):
        raise ValueError("the model already serves LoRA adapters; attach every adapter in one call")
    if any(hasattr(m, "lora_A") for m in model.modules()):
        raise ValueError("the model carries trained LoRA layers; merge them (cookmind.model.lora.merged_copy) first")
    names = [a.name for a in adapters]
    if len(set(names)) != len(names):
        raise ValueError(f"adapter names must be unique, got {names}")
    weight = next(model.parameters())
    table = AdapterRows(names, num_slots, weight.device)
    modules = sorted({m for a in adapters for m in a.weights})
    for name in modules:
        base = model.get_submodule(name)
        w = base.weight
        pairs = [a.weights.get(name) for a in adapters]
        r_max = max(p[0].shape[0] for p in pairs if p is not None)
        stack_a = torch.zeros(len(adapters) + 1, r_max, w.shape[1], dtype=w.dtype, device=w.device)
        stack_b = torch.zeros(len(adapters) + 1, w.shape[0], r_max, dtype=w.dtype, device=w.device)
        scale = torch.zeros(len(adapters) + 1, dtype=torch.float32, device=w.device)
        for i, (adapter, pair) in enumerate(zip(adapters, pairs), start=1):
            if pair is not None:
                a, b = pair
                stack_a[i, : a.shape[0]] = a.to(w.dtype)
                stack_b[i, :, : b.shape[1]] = b.to(w.dtype)
                scale[i] = adapter.scaling
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, MultiLoRALinear(base, stack_a, stack_b, scale, table.rows))
    return table
