"""Compile a model block by block, so data parallelism can overlap communication with backward.

A whole-model ``torch.compile`` makes backward one autograd node: every gradient becomes final at
its very end, and a DDP has nothing to send while backward runs. Compiled per block, each
block's backward is its own node; its gradients are final (and their buckets go out) while the
blocks before it still compute. Inside a block Inductor still fuses what it can.
"""

from __future__ import annotations

from torch import nn


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's list of repeated transformer blocks: the ``nn.ModuleList`` of one module type that holds
    the most parameters (not the longest: an MoE block's list of experts can be longer than the list of blocks,
    but the blocks hold the experts)."""
    best, best_numel = None, -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(m) for m in module}) == 1:
            numel = sum(p.numel() for p in module.parameters())
            if numel > best_numel:
                best, best_numel = module, numel
    if best is None:
        raise ValueError(
            f"compile_blocks: {type(model).__name__} has no nn.ModuleList of repeated blocks; pass blocks= explicitly"
        )
    return best


def compile_blocks(model: nn.Module, blocks: nn.ModuleList | None = None, **compile_kwargs) -> int:
    """``block.compile(**compile_kwargs)`` for each block (in place); returns how many were compiled."""
    blocks = find_blocks(model) if blocks is None else blocks
    for block in blocks:
        block.compile(**compile_kwargs)
    return len(blocks)
