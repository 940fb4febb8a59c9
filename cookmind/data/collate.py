"""``collate_for(train_type, pad_id)``: batch items of varying length by right-padding."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cookmind.data.doc_mask import doc_attention_mask
from cookmind.data.sft_dataset import IGNORE_INDEX


def pad_right(seqs: list[torch.Tensor], value: int, length: int | None = None) -> torch.Tensor:
    """Stack 1-D tensors into (B, L), right-padded with ``value``; L = longest unless given."""
    length = max(len(s) for s in seqs) if length is None else length
    out = torch.full((len(seqs), length), value, dtype=seqs[0].dtype)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = s
    return out


def _fill(key: str, pad_id: int) -> int:
    if key.endswith("labels"):
        return IGNORE_INDEX
    if key.endswith("input_ids") or key.endswith("prompt_ids") or key == "response_ids":
        return pad_id
    return 0  # position ids, masks


def collate_for(train_type: str, pad_id: int, doc_mask: bool = False) -> Callable[[list[dict]], dict]:
    """Return a collate function for ``train_type``.

    Token ids pad with ``pad_id``, labels with -100, masks and position ids with 0, all to the
    batch's longest. dpo pads chosen and rejected to one common length (so they can be
    concatenated); grpo adds ``prompt_lengths`` and keeps ``answer`` as a list of strings.
    ``doc_mask=True`` (seq, packed sft) adds ``attention_mask`` (B, 1, T, T), block-diagonal
    by document.
    """
    if train_type not in ("seq", "sft", "dpo", "grpo"):
        raise ValueError(f"unknown train type {train_type!r}; choose one of ['dpo', 'grpo', 'seq', 'sft']")

    def collate(items: list[dict]) -> dict:
        if not items:
            raise ValueError("cannot collate an empty batch")
        keys = items[0].keys()
        common = None
        if train_type == "dpo":
            common = max(len(it[k]) for it in items for k in ("chosen_input_ids", "rejected_input_ids"))
        batch = {}
        for key in keys:
            values = [it[key] for it in items]
            if isinstance(values[0], str):
                batch[key] = values
            elif values[0].dim() == 0:
                batch[key] = torch.stack(values)
            else:
                batch[key] = pad_right(values, _fill(key, pad_id), common)
        if train_type == "grpo":
            batch["prompt_lengths"] = torch.tensor([len(it["prompt_ids"]) for it in items], dtype=torch.long)
        if doc_mask:
            if "position_ids" not in batch:
                raise ValueError(f"doc_mask needs position_ids in the items ({train_type}: use seq or packed sft)")
            batch["attention_mask"] = doc_attention_mask(batch["position_ids"])
        return batch

    return collate
