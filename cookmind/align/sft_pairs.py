"""Supervised fine-tuning on (prompt ids, response ids) pairs: the SFT half of expert iteration."""

from __future__ import annotations

import random

import torch
from tqdm import tqdm

from cookmind.align.log_probs import get_response_log_probs
from cookmind.align.tokenize_pairs import pack_prompt_and_output
from cookmind.align.train_step import sft_microbatch_train_step


def sft_on_pairs(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    optimizer: torch.optim.Optimizer,
    epochs: int = 1,
    batch_size: int = 16,
    gradient_accumulation_steps: int = 1,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    progress: bool = False,
) -> list[float]:
    """Minimise -log p(response | prompt) per response token; returns the loss of each optimizer step.

    Each micro-batch's loss is the per-sequence sum over response tokens divided by the batch's
    mean response length (so the scale is a per-token NLL), via ``sft_microbatch_train_step``.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"sft_on_pairs: {len(prompts)} prompts but {len(responses)} responses")
    if not prompts:
        return []
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    order = list(range(len(prompts)))
    rng = random.Random(seed)
    micro = max(1, batch_size // gradient_accumulation_steps)
    losses = []
    model.train()
    steps = epochs * ((len(order) + batch_size - 1) // batch_size)
    bar = tqdm(total=steps, desc="sft", unit="step", disable=not progress)
    for _ in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            chunk = order[start : start + batch_size]
            for m in range(0, len(chunk), micro):
                idx = chunk[m : m + micro]
                b = pack_prompt_and_output([prompts[i] for i in idx], [responses[i] for i in idx], pad_id)
                mask = b["response_mask"].to(device)
                lp = get_response_log_probs(model, b["input_ids"].to(device), b["labels"].to(device))["log_probs"]
                mean_len = mask.sum(-1).float().mean().clamp(min=1).item()
                loss, _ = sft_microbatch_train_step(lp, mask, gradient_accumulation_steps, normalize_constant=mean_len)
                total += loss.item()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            losses.append(total)
            bar.update(1)
    bar.close()
    optimizer.zero_grad(set_to_none=True)
    return losses
