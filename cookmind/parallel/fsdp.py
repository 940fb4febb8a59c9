"""FSDP2: each decoder block and then the root sharded over the ranks with ``torch.distributed.fsdp.fully_shard``.

Every rank keeps 1/world of each parameter, of its gradient and of the optimizer state; a block's full weights
exist only while it runs (all-gathered in its forward and again in backward, ``reshard_after_forward``), and its
gradients are reduce-scattered as soon as its backward is done. The parameters become DTensors: the optimizer
is built over them after sharding, and norms of their gradients are DTensors too (``plain``).

Forwards through a sharded model are collectives: every rank must run the same ones. Plain forwards (evaluation
losses, a frozen reference's log-probs) run through the sharded model on every rank, a block gathered at a time.
Code that runs forwards on one rank alone or a different number of them per rank (sampling text with the KV-cache
engine, GRPO rollouts that stop at different lengths) runs inside ``gathered_weights``: the full weights are
gathered once on every rank, then each rank computes on its own, without collectives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..optim.adamw import local
from .compile_blocks import find_blocks

_RESHARD = "_cookmind_reshard_after_forward"  # the value each sharded module was given, restored after a gather


def shard_model(
    model: nn.Module,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_root: bool = False,
    unit_blocks: int = 1,
    prefetch: bool = False,
) -> nn.Module:
    """``fully_shard`` each block of ``model`` (``find_blocks``; in place) and then the root; returns ``model``.

    param_dtype: the dtype the weights are gathered and computed in (bf16 halves the all-gather; the sharded
    master weights stay fp32); None keeps theirs. reduce_dtype: the dtype gradients are reduce-scattered in.
    The root keeps its weights (embeddings, final norm, head) gathered from forward to backward, as torch's
    default does: backward needs them first; ``reshard_root`` frees them after the forward too (a model that
    runs no backward: nothing else would). Frozen parameters (a LoRA base, a reference model) are sharded too and
    get no gradient. A model sharded already is returned as it is.

    unit_blocks: consecutive blocks sharded as one unit (one all-gather and one reduce-scatter for all of them,
    and one set of FSDP's hooks: a host that cannot keep ahead of the GPU runs half the hooks at 2). prefetch:
    each unit's forward issues the next unit's all-gather, and its backward the previous one's, as it starts
    (the gathers no longer wait for the host to reach the unit that needs them; one more unit gathered at a time).
    """
    if isinstance(model, FSDPModule):
        return model
    if unit_blocks < 1:
        raise ValueError(f"shard_model: unit_blocks must be at least 1, got {unit_blocks}")
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = list(find_blocks(model))
    units = [blocks[i : i + unit_blocks] for i in range(0, len(blocks), unit_blocks)]
    for unit in units:
        fully_shard(unit if len(unit) > 1 else unit[0], mp_policy=mp, reshard_after_forward=reshard_after_forward)
        for block in unit:
            setattr(block, _RESHARD, reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard_root)
    setattr(model, _RESHARD, reshard_root)
    if prefetch:
        heads = [unit[0] for unit in units]  # a unit's hooks run on its first block
        for i, head in enumerate(heads):
            head.set_modules_to_forward_prefetch(heads[i + 1 : i + 2])
            head.set_modules_to_backward_prefetch(heads[i - 1 : i] if i else [])
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (or the model inside a torch.compile wrapper) is sharded by FSDP2."""
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


@contextlib.contextmanager
def gathered_weights(model: nn.Module) -> Iterator[None]:
    """Inside, every FSDP-sharded module of ``model`` holds its full weights and keeps them through its forwards,
    so each rank can run any number of forwards on its own (no collectives); resharded on exit.

    Every rank must enter (the gather is a collective). A no-op for a model that is not sharded. Costs the
    memory of the whole model on each rank while inside, so only what cannot run as lockstep forwards uses it:
    decoding with the KV cache (GRPO rollouts, sample generations, GRPO's held-out accuracy). Plain forwards
    (validation losses, a reference's log-probs) run through the sharded model instead.
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


def reshard_all(model: nn.Module) -> None:
    """Free every gathered weight of ``model``: what no-grad forwards left gathered (the root, and every block with
    ``reshard_after_forward`` off, keep theirs until a backward that does not come). A no-op when not sharded."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def copy_shards(dst: nn.Module, src: nn.Module) -> None:
    """Copy ``src``'s parameters and buffers into ``dst`` by name; both sharded alike by ``shard_model`` (the same
    shapes on the same ranks). Each rank copies its own shards: nothing is gathered.

    Wrapper prefixes (activation checkpointing's, torch.compile's) are ignored in the names, so a plain ``dst``
    takes a wrapped ``src``'s values. A name or shape that differs is an error naming it.
    """
    for what in ("parameters", "buffers"):
        want = _by_plain_name(getattr(src, f"named_{what}")())
        have = _by_plain_name(getattr(dst, f"named_{what}")())
        if set(want) != set(have):
            missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
            raise ValueError(
                f"copy_shards: the copy's {what} differ from the model's: missing {missing}, extra {extra}"
            )
        with torch.no_grad():
            for name, target in have.items():
                mine, theirs = local(target), local(want[name])
                if mine.shape != theirs.shape:
                    raise ValueError(
                        f"copy_shards: {name} is {tuple(theirs.shape)} on this rank in the model and "
                        f"{tuple(mine.shape)} in the copy: shard both with shard_model over the same ranks"
                    )
                mine.copy_(theirs)


_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def plain_name(name: str) -> str:
    """A parameter's name without the wrappers' parts (the name its state dict and DCP give it)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _by_plain_name(named) -> dict[str, torch.Tensor]:
    return {plain_name(name): t for name, t in named}


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters the gradients (False: accumulate them unsharded, no traffic)."""
    root = getattr(model, "_orig_mod", model)
    if isinstance(root, FSDPModule):
        root.set_requires_gradient_sync(sync)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value as a plain tensor (a gradient norm over the shards); any other tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t
