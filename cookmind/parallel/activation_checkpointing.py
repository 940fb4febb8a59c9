"""Activation checkpointing: each block keeps only its inputs in forward and recomputes the rest in backward.

Each block in the model's list of blocks (``find_blocks``) is replaced there by torch's ``CheckpointWrapper``
around it, the wrapper FSDP2 and torchtitan compose with. The block's own forward is untouched, so no
argument (a KV cache, a mask) has to be found by position. What stays the same:

- state-dict names: the wrapper's hooks drop its ``_checkpoint_wrapped_module.`` prefix on save and add it
  back on load, so checkpoints, exports and strict loads see the plain model's names;
- the parameters and their order (optimizer state indexes them), and attribute access: ``layers[i].self_attn``
  reaches the block's module through the wrapper.

Under ``torch.no_grad()`` (decoding with a KV cache, evaluation) a wrapped block runs as it is: there is
nothing to recompute, so the RNG state is not stashed either.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils.checkpoint import checkpoint

from .compile_blocks import find_blocks


def _checkpoint_with_grad(module: nn.Module, *args, **kwargs):
    """``module(*args, **kwargs)``, its activations recomputed in backward when autograd records it."""
    if not torch.is_grad_enabled():
        return module(*args, **kwargs)
    return checkpoint(module, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, blocks: nn.ModuleList | None = None) -> int:
    """Wrap each block of ``model`` (in place) for activation checkpointing; returns how many blocks are wrapped.

    blocks: the list to wrap; default ``find_blocks(model)``. Blocks wrapped already are left as they are, so a
    second call (a second Trainer over the same model) changes nothing.
    """
    blocks = find_blocks(model) if blocks is None else blocks
    for i, block in enumerate(blocks):
        if not isinstance(block, CheckpointWrapper):
            blocks[i] = CheckpointWrapper(block, checkpoint_fn=_checkpoint_with_grad)
    return len(blocks)
