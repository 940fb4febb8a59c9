"""The module inside the wrappers that ``cookmind.parallel.parallelize`` puts around a model (data parallelism,
torch.compile, activation checkpointing). Here, beside the model, so that saving a model needs nothing of the
distributed stack (``cookmind.parallel`` re-exports it)."""

from __future__ import annotations

from torch import nn


def unwrap(model: nn.Module, data_parallel_only: bool = False) -> nn.Module:
    """Strip the wrappers around ``model``, outermost first: data parallelism (ours, torch's DDP or DataParallel:
    ``.module``), torch.compile (``._orig_mod``) and a checkpoint wrapper (``._checkpoint_wrapped_module``).

    data_parallel_only: strip only the data-parallel wrapper (what one rank may run on its own, e.g. evaluation:
    torch's DDP can talk to the other ranks in forward). Wrappers inside the model, such as the checkpoint
    wrappers around its blocks, stay: they keep the state-dict names of the plain model.
    """
    while True:
        children = model._modules  # not getattr: a checkpoint wrapper forwards unknown attributes to its module
        if "module" in children:
            model = children["module"]
        elif data_parallel_only:
            return model
        elif "_orig_mod" in children:
            model = children["_orig_mod"]
        elif "_checkpoint_wrapped_module" in children:
            model = children["_checkpoint_wrapped_module"]
        else:
            return model
