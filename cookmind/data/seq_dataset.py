"""Pretraining windows over the concatenated token stream of a seq store."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from cookmind.store import TokenStore


class SeqDataset(Dataset):
    """Window ``i`` is tokens ``[i*stride, i*stride + window_size)`` of the stream; ``num_unused`` of its
    ``num_tokens`` tokens lie in no window.

    ``labels`` equal ``input_ids``: the model shifts them inside its loss, so the target of
    position t is token t+1 (targets offset by one). Each document ends in the tokenizer's
    end-of-text id (added by the packer). With ``doc_mask=True`` the ``position_ids`` restart
    at 0 where a document begins, which is also how ``doc_attention_mask`` finds the blocks of
    the block-diagonal mask; otherwise they are ``0..T-1``.
    """

    def __init__(self, store: TokenStore, window_size: int, stride: int | None = None, doc_mask: bool = False):
        if window_size <= 0:
            raise ValueError(f"window_size must be positive, got {window_size}")
        stride = window_size if stride is None else stride
        if stride <= 0:
            raise ValueError(f"stride must be positive, got {stride}")
        self.store, self.window_size, self.stride, self.doc_mask = store, window_size, stride, doc_mask
        n = store.stream_length("sequence")
        # full windows only: start + T <= n  ->  count = (n - T) // stride + 1
        self.num_windows = (n - window_size) // stride + 1 if n >= window_size else 0
        # tokens no window covers, so never trained on: the tail after the last window, and the gaps between
        # windows when stride > window_size (the Trainer prints how many)
        covered = min(stride, window_size) * (self.num_windows - 1) + window_size if self.num_windows else 0
        self.num_tokens, self.num_unused = n, n - covered
        self.doc_starts = store.document_starts("sequence") if doc_mask else None

    def __len__(self) -> int:
        return self.num_windows

    def window_bounds(self, i: int) -> tuple[int, int]:
        """Stream span ``(start, stop)`` of window ``i``."""
        if not 0 <= i < self.num_windows:
            raise IndexError(f"window {i} out of range for {self.num_windows} windows")
        start = i * self.stride
        return start, start + self.window_size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start, stop = self.window_bounds(i)
        ids = torch.from_numpy(self.store.stream("sequence", start, stop).astype(np.int64))
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": self._positions(start, stop)}

    def _positions(self, start: int, stop: int) -> torch.Tensor:
        t = np.arange(stop - start, dtype=np.int64)
        if self.doc_starts is None:
            return torch.from_numpy(t)
        lo, hi = np.searchsorted(self.doc_starts, [start, stop])
        begins = np.zeros_like(t)
        begins[self.doc_starts[lo:hi] - start] = self.doc_starts[lo:hi] - start
        # position = t - (start of the document t is in, within the window)
        return torch.from_numpy(t - np.maximum.accumulate(begins))
