"""A paged KV cache: one pool of fixed-size blocks shared by all requests, found through block tables.

A slot cache gives every request room for the whole context up front; most requests are far
shorter, so most of that memory sits empty. Here the pool is cut into blocks of ``block_size``
token positions. A request owns a list of blocks (its block table, one row per batch row) that
grows as its sequence does, and every block goes back to the pool the moment it finishes or is
cancelled. Token position p of row r lives at physical index

    table[r, p // block_size] * block_size + p % block_size

in a token-major pool of shape (num_blocks * block_size, kv_heads, head_dim) per layer.
Block 0 is a scratch block: unused table entries point at it, so padding rows and idle rows of
a fixed-shape (CUDA-graph) step write there and never into anyone's data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class BlockAllocator:
    """A free list of block ids 1..num_blocks-1 (block 0 is the scratch block and never handed out)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"a paged KV cache needs at least 2 blocks (one is scratch), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first

    @property
    def capacity(self) -> int:
        """Blocks that requests can hold (all but the scratch block)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("the KV block pool is empty: the engine should have kept this request waiting")
        return self._free.pop()

    def free(self, blocks: list[int]) -> None:
        """Return blocks to the pool (the scratch block and double frees are errors: they would corrupt it)."""
        for b in blocks:
            if not 0 < b < self.num_blocks:
                raise ValueError(f"block id {b} is not a pool block (1..{self.num_blocks - 1})")
        self._free.extend(reversed(blocks))
        if len(self._free) > self.capacity:
            raise RuntimeError("a block was freed twice: the pool holds more free blocks than it has")


def blocks_for_budget(
    budget_bytes: int, num_layers: int, num_kv_heads: int, block_size: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Blocks that fit in budget_bytes.

    Bytes per block = 2 (K and V) * layers * kv_heads * block_size * head_dim * elem."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_block = 2 * num_layers * num_kv_heads * block_size * head_dim * elem
    blocks = budget_bytes // per_block
    if blocks < 2:
        raise ValueError(
            f"KV cache budget of {budget_bytes / 2**20:.2f} MiB holds {blocks} blocks of {block_size} "
            f"tokens ({per_block / 2**20:.3f} MiB each) but needs at least 2: raise the budget or "
            "lower block_size"
        )
    return int(blocks)


@dataclass
class PagedStep:
    """Physical indices of one forward, computed once and shared by every layer."""

    write_index: torch.Tensor  # (B*T,) where each new token's key/value goes
    read_index: torch.Tensor | None  # (B, L) where each row's columns 0..L-1 live (None: a kernel reads in place)
    table: torch.Tensor  # (B, max_blocks) the rows' block tables


class PagedKVCache:
    """Per-layer token-major key/value pools plus a (rows, max_blocks) block table on the device."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        num_rows: int,
        max_seq_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.block_size, self.num_blocks, self.num_rows = block_size, num_blocks, num_rows
        self.max_seq_len = max_seq_len  # columns 0..max_seq_len (the last one is the runner's scratch column)
        self.max_blocks = math.ceil(max_seq_len / block_size)
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.block_tables = torch.zeros((num_rows, self.max_blocks), dtype=torch.long, device=device)
        self._host_tables = torch.zeros((num_rows, self.max_blocks), dtype=torch.long)  # edited here, copied over
        self._dirty: set[int] = set()  # rows edited since the last sync
        self.allocator = BlockAllocator(num_blocks)

    @property
    def num_slots(self) -> int:
        return self.num_rows

    def set_row(self, row: int, blocks: list[int]) -> None:
        """Point row's table at blocks (the rest at the scratch block); reaches the device at sync_tables()."""
        if len(blocks) > self.max_blocks:
            raise ValueError(f"row {row}: {len(blocks)} blocks exceed the table's {self.max_blocks}")
        self._host_tables[row].zero_()
        if blocks:
            self._host_tables[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        self._dirty.add(row)

    def sync_tables(self) -> None:
        """Copy edited tables to the device before the next forward. From pageable memory the copy is
        staged at once, so later edits cannot leak into it, and the host does not wait for the device.
        A few edited rows go one by one (a long context makes the whole table large); many, all at once."""
        if len(self._dirty) > 8:
            self.block_tables.copy_(self._host_tables, non_blocking=True)
        else:
            for row in self._dirty:
                self.block_tables[row].copy_(self._host_tables[row], non_blocking=True)
        self._dirty.clear()

    def step(self, slot_start: int, batch: int, write_cols: torch.Tensor, length: int, read: bool = True) -> PagedStep:
        """Indices for rows slot_start.. slot_start+batch-1 writing at write_cols (B, T), reading columns < length
        (read=False: no read indices, for the decode kernel that follows the block tables itself)."""
        bs = self.block_size
        table = self.block_tables[slot_start : slot_start + batch]
        # the scratch column (== max_seq_len) may fall past the table: send it to the scratch block
        blk = (write_cols // bs).clamp(max=self.max_blocks - 1)
        phys_block = torch.where(write_cols < self.max_seq_len, table.gather(1, blk), torch.zeros_like(blk))
        write_index = (phys_block * bs + write_cols % bs).reshape(-1)
        if not read:
            return PagedStep(write_index, None, table)
        cols = torch.arange(length, device=table.device)
        read_index = table[:, cols // bs] * bs + cols % bs  # (B, L)
        return PagedStep(write_index, read_index, table)

    @staticmethod
    def write(keys: torch.Tensor, values: torch.Tensor, step: PagedStep, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, kv_heads, T, D) at the step's write indices of one layer's pools."""
        b, h, t, d = k.shape
        keys.index_copy_(0, step.write_index, k.transpose(1, 2).reshape(b * t, h, d).to(keys.dtype))
        values.index_copy_(0, step.write_index, v.transpose(1, 2).reshape(b * t, h, d).to(values.dtype))

    @staticmethod
    def view(keys: torch.Tensor, values: torch.Tensor, step: PagedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values (B, kv_heads, L, D) of the step's rows, gathered through their block tables."""
        return keys[step.read_index].transpose(1, 2), values[step.read_index].transpose(1, 2)
