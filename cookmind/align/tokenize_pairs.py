"""Prompt + response pairs as one padded batch, with a mask over the response tokens."""

from __future__ import annotations

import torch

from cookmind.align.text_codec import encode_text, pad_id_of


def tokenize_prompt_and_output(prompt_strs: list[str], output_strs: list[str], tokenizer) -> dict[str, torch.Tensor]:
    """Tokenize prompts and outputs separately, join them and pad to the longest join.

    Returns ``input_ids`` = joined[:, :-1], ``labels`` = joined[:, 1:] and ``response_mask``
    (1 where the *label* is a response token), each (batch, longest prompt+output - 1).
    Padding uses the tokenizer's pad id (labels there are masked out, never -100, so they
    can be gathered directly).
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(
            f"tokenize_prompt_and_output: {len(prompt_strs)} prompts but {len(output_strs)} outputs; pass one output per prompt"
        )
    prompts = [encode_text(tokenizer, p) for p in prompt_strs]
    outputs = [encode_text(tokenizer, o) for o in output_strs]
    return pack_prompt_and_output(prompts, outputs, pad_id_of(tokenizer))


def pack_prompt_and_output(prompt_ids: list[list[int]], output_ids: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    """``tokenize_prompt_and_output`` for text already tokenized (rollouts keep their sampled ids:
    re-encoding decoded text can give other ids than the ones the policy chose)."""
    joined = [list(p) + list(o) for p, o in zip(prompt_ids, output_ids)]
    masks = [[0] * len(p) + [1] * len(o) for p, o in zip(prompt_ids, output_ids)]
    width = max(len(ids) for ids in joined)
    if width < 2:
        raise ValueError("tokenize_prompt_and_output: every prompt+output is shorter than 2 tokens; nothing to predict")
    ids = torch.full((len(joined), width), pad, dtype=torch.long)
    mask = torch.zeros((len(joined), width), dtype=torch.bool)
    for row, (seq, m) in enumerate(zip(joined, masks)):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.bool)
    # target t+1 is predicted at position t, so the mask follows the labels
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask[:, 1:]}
