"""RL data for GRPO: prompts with reference answers (online) or scored responses (offline)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from cookmind.store import TokenStore


class GRPODataset(Dataset):
    """Online items ``{"prompt_ids": (P,), "answer": str}``; an offline store adds
    ``"response_ids"``, ``"response_mask"`` and a float ``"reward"``.

    Prompts are never cut (a cut prompt asks another question): a prompt that leaves no room
    in ``window_size`` for one answer token is dropped and counted in ``num_dropped``. Offline
    responses are truncated so that prompt + response fits the window, and counted in ``num_truncated``
    (None online, where no stored response is cut: the Trainer then speaks of prompts alone).
    """

    def __init__(self, store: TokenStore, window_size: int):
        if window_size <= 0:
            raise ValueError(f"window_size must be positive, got {window_size}")
        self.store, self.window_size = store, window_size
        self.offline = "responses" in store.keys
        lengths = store.lengths("prompts")
        # room for at least one response token after the prompt: online, an unset window is the model's context,
        # and a prompt that fills it cannot be answered (its rollout would stop the run at the step that drew it)
        self.indices = np.nonzero(lengths <= window_size - 1)[0].astype(np.int64)
        self.num_dropped = len(store) - len(self.indices)
        self.num_truncated = None
        if self.offline:  # kept records whose response runs past the window: trained cut, so counted
            whole = lengths[self.indices] + store.lengths("responses")[self.indices]
            self.num_truncated = int((whole > window_size).sum())

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        r = int(self.indices[i])
        prompt = self.store.record("prompts", r).astype(np.int64)
        item = {"prompt_ids": torch.from_numpy(prompt)}
        if not self.offline:
            item["answer"] = bytes(self.store.record("answers", r)).decode("utf-8")
            return item
        room = self.window_size - len(prompt)
        item["response_ids"] = torch.from_numpy(self.store.record("responses", r)[:room].astype(np.int64))
        item["response_mask"] = torch.from_numpy(self.store.record("masks", r)[:room].astype(np.int64))
        item["reward"] = torch.tensor(float(self.store.record("rewards", r)[0]), dtype=torch.float32)
        return item
