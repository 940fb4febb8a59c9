"""A KV cache of fixed slots, one per running request, sized from a memory budget.

Layout per layer: keys and values of shape (slots, kv_heads, max_seq_len, head_dim). A request
owns one slot; its token at position p lives in column p, so requests of different lengths
share one batch without padding, and a finished request frees its slot at once. Shapes never
change, which is what CUDA graphs need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class SlotKVCache:
    """Preallocated per-layer keys/values indexed by (slot, position)."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        shape = (num_slots, num_kv_heads, max_seq_len, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.num_rows, self.max_seq_len = num_slots, max_seq_len

    @staticmethod
    def slots_for_budget(
        budget_bytes: int, num_layers: int, num_kv_heads: int, max_seq_len: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """How many slots fit: bytes per slot = 2 (K and V) * layers * kv_heads * max_seq_len * head_dim * elem."""
        elem = torch.empty((), dtype=dtype).element_size()
        per_slot = 2 * num_layers * num_kv_heads * max_seq_len * head_dim * elem
        slots = budget_bytes // per_slot
        if slots < 1:
            raise ValueError(
                f"KV cache budget of {budget_bytes / 2**20:.1f} MiB holds no slot of {max_seq_len} tokens "
                f"({per_slot / 2**20:.1f} MiB each): raise the budget or lower max_seq_len"
            )
        return int(slots)

    @property
    def num_slots(self) -> int:
        return self.num_rows

    def step(self, slot_start: int, batch: int, write_cols: torch.Tensor, length: int) -> SlotStep:
        """Where one forward writes (write_cols (B, T) of slots slot_start..) and how far it reads (length)."""
        return SlotStep(slot_start, batch, write_cols, length)

    @staticmethod
    def write(keys: torch.Tensor, values: torch.Tensor, step: SlotStep, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, kv_heads, T, D) of the step's slots at its per-row columns, in one layer's
        keys/values (self.keys[layer], self.values[layer])."""
        b, h, t, d = k.shape
        index = step.write_cols[:, None, :, None].expand(b, h, t, d)
        sl = slice(step.slot_start, step.slot_start + b)
        keys[sl].scatter_(2, index, k.to(keys.dtype))
        values[sl].scatter_(2, index, v.to(values.dtype))

    @staticmethod
    def view(keys: torch.Tensor, values: torch.Tensor, step: SlotStep) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values (B, kv_heads, L, D) of the step's run of slots, first L columns (no copy)."""
        sl = slice(step.slot_start, step.slot_start + step.batch)
        return keys[sl, :, : step.length], values[sl, :, : step.length]


@dataclass
class SlotStep:
    """One forward's rows (a contiguous run of slots), write columns (B, T) and read length."""

    slot_start: int
    batch: int
    write_cols: torch.Tensor
    length: int
