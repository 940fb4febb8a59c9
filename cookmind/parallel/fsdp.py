"""FSDP2: each decoder block and then the root sharded over the ranks with ``torch.distributed.fsdp.fully_shard``.

Every rank keeps 1/world of each parameter, of its gradient and of the optimizer state; a block's full weights
exist only while it runs (all-gathered in its forward and again in backward, ``reshard_after_forward``), and its
gradients are reduce-scattered as soon as its backward is done. The parameters become DTensors: the optimizer
is built over them after sharding, and norms of their gradients are DTensors too (``plain``).

Forwards through a sharded model are collectives: every rank must run the same ones. Code that runs forwards on
one rank alone or a different number of them per rank (evaluation on rank 0, generation, GRPO rollouts that stop
at different lengths) runs inside ``gathered_weights``: the full weights are gathered once on every rank, then
each rank computes on its own, without collectives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from .compile_blocks import find_blocks

_RESHARD = "_cookmind_reshard_after_forward"  # the value each sharded module was given, restored after a gather


def shard_model(
    model: nn.Module,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """``fully_shard`` each block of ``model`` (``find_blocks``; in place) and then the root; returns ``model``.

    param_dtype: the dtype the weights are gathered and computed in (bf16 halves the all-gather; the sharded
    master weights stay fp32); None keeps theirs. reduce_dtype: the dtype gradients are reduce-scattered in.
    The root keeps its weights (embeddings, final norm, head) gathered from forward to backward, as torch's
    default does: backward needs them first. Frozen parameters (a LoRA base, a reference model) are sharded
    too and get no gradient. A model sharded already is returned as it is.
    """
    if isinstance(model, FSDPModule):
        return model
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in find_blocks(model):
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        setattr(block, _RESHARD, reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    setattr(model, _RESHARD, False)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (or the model inside a torch.compile wrapper) is sharded by FSDP2."""
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


@contextlib.contextmanager
def gathered_weights(model: nn.Module) -> Iterator[None]:
    """Inside, every FSDP-sharded module of ``model`` holds its full weights and keeps them through its forwards,
    so each rank can run any number of forwards on its own (no collectives); resharded on exit.

    Every rank must enter (the gather is a collective). A no-op for a model that is not sharded. Costs the
    memory of the whole model on each rank while inside.
    """
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        yield
        return
    for m in sharded:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in sharded:
            m.reshard()
            m.set_reshard_after_forward(getattr(m, _RESHARD, True), recurse=False)


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters the gradients (False: accumulate them unsharded, no traffic)."""
    root = getattr(model, "_orig_mod", model)
    if isinstance(root, FSDPModule):
        root.set_requires_gradient_sync(sync)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value as a plain tensor (a gradient norm over the shards); any other tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t
