"""Preference pairs for DPO: chosen and rejected sequences, labels only on the responses."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from cookmind.data.sft_dataset import supervised_labels, supervised_records
from cookmind.store import TokenStore


class DPODataset(Dataset):
    """Items ``{"chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"}``.

    Each side is truncated to ``window_size``; labels are -100 outside the response
    (``chosen_mask`` / ``rejected_mask``). A pair where either side loses its whole response
    to truncation is dropped and counted in ``num_dropped``; ``num_truncated`` counts kept pairs
    with a side cut short.
    """

    def __init__(self, store: TokenStore, window_size: int):
        if window_size <= 0:
            raise ValueError(f"window_size must be positive, got {window_size}")
        self.store, self.window_size = store, window_size
        keep = np.intersect1d(
            supervised_records(store, "chosen_mask", window_size),
            supervised_records(store, "rejected_mask", window_size),
        )
        self.indices = keep
        self.num_dropped = len(store) - len(keep)
        longest = np.maximum(store.lengths("chosen")[keep], store.lengths("rejected")[keep])
        self.num_truncated = int((longest > window_size).sum())

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        r = int(self.indices[i])
        item = {}
        for side in ("chosen", "rejected"):
            ids = self.store.record(side, r)[: self.window_size]
            mask = self.store.record(f"{side}_mask", r)[: self.window_size]
            item[f"{side}_input_ids"] = torch.from_numpy(ids.astype(np.int64))
            item[f"{side}_labels"] = torch.from_numpy(supervised_labels(ids, mask))
        return item
