"""Shared model pieces of the tests: the tiny model shape, a tiny model with sharp distributions, the little corpus
conftest's ``tok_dir`` tokenizer is trained on."""

import torch

from cookmind.model import CookMindConfig, CookMindLM

CORPUS = (
    "The cook stirs the soup. Tom has 3 apples and buys 4 more; now he has 7 apples.\n"
    "A small model learns to answer questions about numbers and recipes.\n"
) * 20

TINY = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
# Smaller still, for the RL tests that run whole GRPO loops: 1 layer of width 16, 2 query heads and 1 KV head.
MICRO = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def tiny_config(**overrides) -> CookMindConfig:
    """The tests' tiny model shape (``TINY``: 2 layers of width 32, 4 query and 2 KV heads) with ``overrides``.

    A test that needs another shape for a reason (a tokenizer's vocabulary, an MoE, a longer context) says so
    through its overrides; fields ``TINY`` does not name keep ``CookMindConfig``'s defaults.
    """
    return CookMindConfig(**{**TINY, **overrides})


def tiny_lm(**overrides) -> CookMindLM:
    """A CookMindLM of ``tiny_config(**overrides)``, initialised from torch's current seed."""
    return CookMindLM(tiny_config(**overrides))


def tiny_cli_overrides(**overrides) -> list[str]:
    """``TINY`` with ``overrides`` as ``model.KEY=VALUE`` overrides (for TrainConfig.load and `cookmind train`)."""
    return [f"model.{k}={v}" for k, v in {**TINY, **overrides}.items()]


def sharp_tiny_lm(**overrides) -> CookMindLM:
    """A seeded 2-layer CookMindLM (vocabulary 97) in eval mode whose matrices are scaled by 8.

    Larger weights give sharper, more varied next-token distributions, so greedy and sampled outputs
    differ between prompts and positions (a random small model would repeat one token).
    """
    torch.manual_seed(0)
    model = tiny_lm(**{"vocab_size": 97, **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model
