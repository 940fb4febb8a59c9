"""Log-probabilities of the given labels under a policy (any callable returning logits)."""

from __future__ import annotations

import torch

from cookmind.align.entropy import compute_entropy


def logits_of(output) -> torch.Tensor:
    """A model's logits whether it returns a tensor, an object with ``.logits`` or a dict."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    logits = getattr(output, "logits", None)
    if logits is None:
        raise TypeError(f"policy returned {type(output).__name__}; expected a logits tensor or an object with .logits")
    return logits


def gather_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels) = logits[label] - logsumexp(logits); labels < 0 (ignored) read as 0."""
    logits = logits.float()
    safe = labels.clamp(min=0).unsqueeze(-1)
    return logits.gather(-1, safe).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def get_response_log_probs(model, input_ids: torch.Tensor, labels: torch.Tensor, return_token_entropy: bool = False) -> dict[str, torch.Tensor]:
    """Per-token log p(labels | prefix), (B, T); with ``token_entropy`` (B, T) when asked.

    ``model(input_ids)`` may return logits or an output object holding ``.logits``; our
    CookMindLM and a Hugging Face causal LM both work.
    """
    logits = logits_of(model(input_ids))
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"get_response_log_probs: logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    out = {"log_probs": gather_log_probs(logits, labels)}
    if return_token_entropy:
        out["token_entropy"] = compute_entropy(logits)
    return out
