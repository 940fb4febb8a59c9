"""Optimizer-state sharding (ZeRO stage 1): each rank keeps and steps the state of 1/N of the parameters.

Every parameter gets one owner rank (largest parameters first, each to the least-loaded rank,
the same on every rank). A rank builds the wrapped optimizer over the parameters it owns only,
so Adam's two moments exist once across the job instead of N times. After each step every
owner broadcasts its updated parameters, so all ranks again hold the full model. Gradients
must already be averaged across ranks (DDP does that), which makes the result equal to the
unsharded optimizer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class _TensorSpec:
    """Stands in for a state tensor in the gathered metadata; the tensor itself is broadcast."""

    shape: tuple
    dtype: torch.dtype


class ShardedOptimizer(torch.optim.Optimizer):
    """``ShardedOptimizer(params, optimizer_cls, **kwargs)``; use like ``optimizer_cls(params, **kwargs)``.

    ``state_dict()`` is collective (call it on every rank) and returns the full, unsharded
    optimizer state in optimizer_cls's own format, so checkpoints load into either optimizer.
    """

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], process_group=None, **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError(
                "ShardedOptimizer needs an initialised process group (cookmind.parallel.init_distributed)"
            )
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.optimizer_cls = optimizer_cls
        self._kwargs = kwargs
        self._owner: dict[torch.Tensor, int] = {}
        self._load = [0] * self.world_size  # elements owned per rank
        self._local: torch.optim.Optimizer | None = None
        self._consolidated: dict | None = None
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer over this rank's parameters only."""
        return self._local

    def owner(self, p: torch.Tensor) -> int:
        """Rank that steps and broadcasts parameter p."""
        return self._owner[p]

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in sorted(group["params"], key=lambda t: -t.numel()):  # stable: ties keep model order
            rank = min(range(self.world_size), key=lambda r: self._load[r])
            self._owner[p] = rank
            self._load[rank] += p.numel()
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p in group["params"] if self._owner[p] == self.rank]
        if self._local is None:
            self._local = self.optimizer_cls([local], **self._kwargs)
        else:
            self._local.add_param_group(local)

    def _sync_hyperparameters(self) -> None:
        # LR schedulers write self.param_groups; the local optimizer must see the same values
        for full, local in zip(self.param_groups, self._local.param_groups):
            for key, value in full.items():
                if key != "params":
                    local[key] = value

    @torch.no_grad()
    def step(self, closure=None):
        """Step the owned shard, then every owner broadcasts its parameters to all ranks."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        self._local.step()
        self._broadcast_parameters()
        self._consolidated = None  # a gathered state is stale after a step
        return loss

    def _global_rank(self, rank: int) -> int:
        return dist.get_global_rank(self.process_group, rank) if self.process_group is not None else rank

    def _broadcast_parameters(self) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        for rank in range(self.world_size):
            owned = [p for p in params if self._owner[p] == rank]
            by_kind: dict[tuple, list[torch.Tensor]] = {}
            for p in owned:
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            for (dtype, device), group in by_kind.items():
                if rank == self.rank:
                    flat = torch.cat([p.detach().reshape(-1) for p in group])
                else:
                    flat = torch.empty(sum(p.numel() for p in group), dtype=dtype, device=device)
                dist.broadcast(flat, src=self._global_rank(rank), group=self.process_group)
                if rank != self.rank:
                    for p, chunk in zip(group, flat.split([p.numel() for p in group])):
                        p.copy_(chunk.view_as(p))

    def _global_index(self) -> dict[torch.Tensor, int]:
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def consolidate_state_dict(self) -> None:
        """Gather the full state now (collective, every rank); a later ``state_dict()`` on any rank alone returns it.

        For checkpoint code that saves on rank 0 only: call this on every rank first.
        """
        self._consolidated = None
        self._consolidated = self.state_dict()

    def state_dict(self) -> dict:
        """Full optimizer state: {"state": {index: {...}}, "param_groups": [...]}, indexed as unsharded.

        Collective (every rank must call it) unless ``consolidate_state_dict()`` ran since the last step.
        """
        if self._consolidated is not None:
            return self._consolidated
        self._sync_hyperparameters()  # a scheduler may have changed lr since the last step
        index = self._global_index()
        local_params = [p for g in self._local.param_groups for p in g["params"]]
        local_sd = self._local.state_dict()
        mine = {index[local_params[i]]: s for i, s in local_sd["state"].items()}
        meta = {
            gi: {k: (_TensorSpec(tuple(v.shape), v.dtype) if _is_big(v) else v) for k, v in s.items()}
            for gi, s in mine.items()
        }
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, meta, group=self.process_group)
        params = list(index)
        state: dict[int, dict] = {}
        for rank, rank_meta in enumerate(gathered):
            for gi in sorted(rank_meta):
                entry = {}
                for key, value in rank_meta[gi].items():
                    if isinstance(value, _TensorSpec):
                        if rank == self.rank:
                            buf = mine[gi][key].detach().clone()
                        else:
                            buf = torch.empty(value.shape, dtype=value.dtype, device=params[gi].device)
                        dist.broadcast(buf, src=self._global_rank(rank), group=self.process_group)
                        value = buf
                    entry[key] = value
                state[gi] = entry
        groups = []
        for full, local in zip(self.param_groups, local_sd["param_groups"]):
            g = {k: v for k, v in local.items() if k != "params"}
            g["params"] = [index[p] for p in full["params"]]
            groups.append(g)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full (unsharded-format) state; each rank keeps the entries of the parameters it owns."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state has {len(groups)} param groups, this optimizer {len(self.param_groups)}")
        local_groups, local_state, n = [], {}, 0
        for full, saved in zip(self.param_groups, groups):
            if len(saved["params"]) != len(full["params"]):
                raise ValueError(f"param group size mismatch: saved {len(saved['params'])}, here {len(full['params'])}")
            hyper = {k: v for k, v in saved.items() if k != "params"}
            full.update(hyper)
            ids = []
            for p, saved_id in zip(full["params"], saved["params"]):
                if self._owner[p] != self.rank:
                    continue
                if saved_id in state_dict["state"]:
                    local_state[n] = state_dict["state"][saved_id]
                ids.append(n)
                n += 1
            local_groups.append({**hyper, "params": ids})
        self._local.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._consolidated = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients of every parameter (all ranks hold all gradients)."""
        super().zero_grad(set_to_none=set_to_none)


def _is_big(v) -> bool:
    """State tensors worth a broadcast; scalars (e.g. Adam's step) travel in the gathered metadata."""
    return isinstance(v, torch.Tensor) and v.numel() > 1
