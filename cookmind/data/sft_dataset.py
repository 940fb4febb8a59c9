"""Supervised fine-tuning conversations: one record per conversation, or packed windows."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from cookmind.store import TokenStore

IGNORE_INDEX = -100


def supervised_labels(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """labels[t] = ids[t] where mask[t] == 1 (assistant content + its end of turn), else -100."""
    return np.where(mask.astype(bool), ids.astype(np.int64), IGNORE_INDEX)


def supervised_records(store: TokenStore, mask_key: str, window_size: int, block: int = 1 << 16) -> np.ndarray:
    """Indices of records that still hold a supervised token after truncation to ``window_size``.

    Works through each shard ``block`` records at a time, so memory stays bounded on large stores.
    """
    keep = []
    base = 0
    for shard in store.shards:
        off = shard.offsets(mask_key)
        m = shard.array(mask_key)
        for b0 in range(0, len(off) - 1, block):
            b1 = min(b0 + block, len(off) - 1)
            lo = off[b0]
            span = np.asarray(m[lo : off[b1]])
            cs = np.concatenate([[0], np.cumsum(span, dtype=np.int64)])  # cs[k] = sum(span[:k])
            starts = off[b0:b1] - lo
            stops = np.minimum(starts + window_size, off[b0 + 1 : b1 + 1] - lo)
            keep.append(np.nonzero(cs[stops] - cs[starts] > 0)[0] + base + b0)
        base += len(off) - 1
    return np.concatenate(keep).astype(np.int64) if keep else np.zeros(0, np.int64)


class SFTDataset(Dataset):
    """Items ``{"input_ids", "labels"}`` of one conversation truncated to ``window_size``.

    A conversation whose supervised tokens all fall past the window is dropped; ``num_dropped``
    counts them, and ``num_truncated`` the kept ones that lose their tail to the window. ``pad_to_window`` right-pads
    every item to ``window_size`` with ``pad_id``
    (labels -100); otherwise items keep their length and ``collate_for("sft", pad_id)`` pads the
    batch. ``packing=True`` fills each window with whole conversations in order (first fit)
    and adds ``position_ids`` that restart per conversation, so attention can be kept to one
    conversation with ``doc_attention_mask``.
    """

    def __init__(
        self, store: TokenStore, window_size: int, packing: bool = False, pad_to_window: bool = False, pad_id: int = 0
    ):
        if window_size <= 0:
            raise ValueError(f"window_size must be positive, got {window_size}")
        self.store, self.window_size, self.packing = store, window_size, packing
        self.pad_to_window, self.pad_id = pad_to_window, pad_id
        self.indices = supervised_records(store, "loss_mask", window_size)
        self.num_dropped = len(store) - len(self.indices)
        self.num_truncated = int((store.lengths("sequence")[self.indices] > window_size).sum())
        self.bins = self._pack(store.lengths("sequence")[self.indices]) if packing else None

    def _pack(self, lengths: np.ndarray) -> list[np.ndarray]:
        bins, current, used = [], [], 0
        for j, n in enumerate(np.minimum(lengths, self.window_size)):
            if used + n > self.window_size and current:
                bins.append(np.asarray(current))
                current, used = [], 0
            current.append(j)
            used += int(n)
        if current:
            bins.append(np.asarray(current))
        return bins

    def __len__(self) -> int:
        return len(self.bins) if self.packing else len(self.indices)

    def _conversation(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        r = int(self.indices[j])
        ids = self.store.record("sequence", r)[: self.window_size]
        mask = self.store.record("loss_mask", r)[: self.window_size]
        return ids.astype(np.int64), supervised_labels(ids, mask)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not self.packing:
            ids, labels = self._conversation(i)
            item = {"input_ids": ids, "labels": labels}
        else:
            parts = [self._conversation(int(j)) for j in self.bins[i]]
            item = {
                "input_ids": np.concatenate([p[0] for p in parts]),
                "labels": np.concatenate([p[1] for p in parts]),
                "position_ids": np.concatenate([np.arange(len(p[0])) for p in parts]),
            }
        if self.pad_to_window:
            item = pad_item(item, self.window_size, self.pad_id)
        return {k: torch.from_numpy(np.asarray(v, dtype=np.int64)) for k, v in item.items()}


def pad_item(item: dict[str, np.ndarray], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad ids with ``pad_id``, labels with -100 and position ids with 0 up to ``length``."""
    fill = {"input_ids": pad_id, "labels": IGNORE_INDEX, "position_ids": 0}
    return {k: np.concatenate([v, np.full(length - len(v), fill[k], dtype=np.int64)]) for k, v in item.items()}
