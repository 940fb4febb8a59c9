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
    to truncation is dropped and counted in ``num_dropped``, and so is a pair whose two sides are the same in the
    window (they differ past it: it would teach nothing, its gradient is 0, and count as wrong in the reward
    accuracy), counted in ``num_same_in_window`` too, with a warning; ``num_truncated`` counts kept pairs
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
        same = self._same_in_window(store, keep, window_size)
        self.num_same_in_window = int(same.sum())
        keep = keep[~same]
        self.indices = keep
        self.num_dropped = len(store) - len(keep)
        if self.num_same_in_window:
            _warn_same_in_window(self.num_same_in_window, len(store), window_size, store)
        longest = np.maximum(store.lengths("chosen")[keep], store.lengths("rejected")[keep])
        self.num_truncated = int((longest > window_size).sum())

    @staticmethod
    def _same_in_window(store: TokenStore, records: np.ndarray, window_size: int) -> np.ndarray:
        """For each of ``records``: are its chosen and rejected the same in their first ``window_size`` tokens?
        Only pairs with both sides at least that long can be (shorter sides of equal tokens are one pair twice,
        which pack refuses)."""
        long_enough = (store.lengths("chosen")[records] >= window_size) & (
            store.lengths("rejected")[records] >= window_size
        )
        same = np.zeros(len(records), dtype=bool)
        for j in np.nonzero(long_enough)[0]:
            r = int(records[j])
            chosen, rejected = store.record("chosen", r), store.record("rejected", r)
            same[j] = np.array_equal(chosen[:window_size], rejected[:window_size])
        return same

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


def _warn_same_in_window(same: int, total: int, window_size: int, store: TokenStore) -> None:
    """Say (once, on rank 0 of a group) how many pairs were dropped as the same in the window, and what to do."""
    import warnings

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    warnings.warn(
        f"{same} of the {total} dpo pairs in {store.path} have chosen and rejected the same in their first "
        f"{window_size} tokens (data.window_size; they differ past it): dropped, since they would teach nothing and "
        "count as wrong in the reward accuracy. Raise data.window_size, or pack pairs whose answers differ sooner",
        stacklevel=3,
    )
