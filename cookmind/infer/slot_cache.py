"""A KV cache of fixed slots, one per running request, sized from a memory budget.

Layout per layer: keys and values of shape (slots, kv_heads, max_seq_len, head_dim). A request
owns one slot; its token at position p lives in column p, so requests of different lengths
share one batch without padding, and a finished request frees its slot at once. Shapes never
change, which is what CUDA graphs need.
"""

from __future__ import annotations

import torch


class SlotKVCache:
    """Preallocated per-layer keys/values indexed by (slot, position)."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (num_slots, num_kv_heads, max_seq_len, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.num_slots, self.max_seq_len = num_slots, max_seq_len

    @staticmethod
    def slots_for_budget(budget_bytes: int, num_layers: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                         dtype: torch.dtype) -> int:
        """How many slots fit: bytes per slot = 2 (K and V) * layers * kv_heads * max_seq_len * head_dim * elem."""
        elem = torch.empty((), dtype=dtype).element_size()
        per_slot = 2 * num_layers * num_kv_heads * max_seq_len * head_dim * elem
        slots = budget_bytes // per_slot
        if slots < 1:
            raise ValueError(
                f"KV cache budget of {budget_bytes / 2**20:.1f} MiB holds no slot of {max_seq_len} tokens "
                f"({per_slot / 2**20:.1f} MiB each): raise the budget or lower max_seq_len")
        return int(slots)

    def write(self, layer: int, slot_start: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, kv_heads, T, D) of slots slot_start..slot_start+B-1 at per-row positions (B, T)."""
        b, h, t, d = k.shape
        index = positions[:, None, :, None].expand(b, h, t, d)
        self.keys[layer][slot_start : slot_start + b].scatter_(2, index, k.to(self.keys[layer].dtype))
        self.values[layer][slot_start : slot_start + b].scatter_(2, index, v.to(self.values[layer].dtype))

    def view(self, layer: int, slot_start: int, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a contiguous run of slots, first `length` columns (no copy)."""
        sl = slice(slot_start, slot_start + batch)
        return self.keys[layer][sl, :, :length], self.values[layer][sl, :, :length]
