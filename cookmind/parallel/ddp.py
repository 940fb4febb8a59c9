"""Bucketed data parallelism: gradients all-reduced in buckets while backward is still running.

Each parameter's post-accumulate-grad hook marks its gradient final; when every gradient of a
bucket is in, one asynchronous all_reduce starts for the whole bucket, overlapping the rest of
backward. ``finish_gradient_synchronization()`` starts what is left (unused parameters
contribute zeros), waits, and leaves the mean gradients in ``.grad``:

    grad = (1 / world_size) * sum over ranks of that rank's grad

Gradients end in the buckets (``param.grad`` is a view of a flat buffer), so nothing is copied
back per parameter, and kept gradients are accumulated by autograd in the bucket itself. Buckets start in the same order
on every rank (bucket i waits for buckets < i), as collectives must match across ranks; after
the first synchronised backward they are rebuilt in the order gradients actually arrived there
(rank 0's order, so all ranks agree), which puts e.g. a tied embedding, ready last, last.

With a compiled model, compile each transformer block on its own (``compile_blocks``): a block's
backward is then one autograd node whose gradients are final, and sent, while earlier blocks
still compute. A whole-model compile hands every gradient over at the very end: nothing overlaps.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from .bucket_plan import plan_buckets
from .grad_bucket import GradBucket

HOOK_ATTR = "_cookmind_ddp_hook"  # a parameter's gradient-ready hook, owned by the newest DDP over it


class DDP(nn.Module):
    """Data-parallel wrapper: ``DDP(module, bucket_size_mb=25, reduce_dtype=None, first_bucket_mb=None)``.

    After each synchronised backward call ``finish_gradient_synchronization()`` before the
    optimizer step; wrap accumulation micro-steps in ``with ddp.no_sync():`` (or set
    ``ddp.require_backward_grad_sync = False``) and nothing is communicated for them.
    reduce_dtype=torch.bfloat16 halves the bytes sent (the user accepts bf16 rounding of grads).
    first_bucket_mb: a smaller first bucket, so communication starts after the first few gradients
    (helps eager models whose gradients trickle in; per-block compiled blocks hand theirs over at once).
    rebuild_buckets=False keeps the initial order (reverse registration order) for good.
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float = 25.0,
        reduce_dtype: torch.dtype | None = None,
        process_group=None,
        bucket_cap_mb: float | None = None,
        first_bucket_mb: float | None = None,
        rebuild_buckets: bool = True,
    ):
        super().__init__()
        if bucket_cap_mb is not None:  # torch DDP's name for the same knob
            bucket_size_mb = bucket_cap_mb
        if not dist.is_initialized():
            raise RuntimeError(
                "DDP needs an initialised process group: call cookmind.parallel.init_distributed() under torchrun first"
            )
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be > 0, got {bucket_size_mb}")
        if first_bucket_mb is not None and first_bucket_mb <= 0:
            raise ValueError(
                f"first_bucket_mb must be > 0 (or None for no smaller first bucket), got {first_bucket_mb}"
            )
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.reduce_dtype = reduce_dtype
        self.bucket_bytes = bucket_size_mb * 2**20
        self.first_bucket_bytes = None if first_bucket_mb is None else first_bucket_mb * 2**20
        self.require_backward_grad_sync = True
        self._use_avg = dist.get_backend(process_group) == "nccl"  # NCCL averages inside the reduction
        self._broadcast_from_rank0()
        self._params = [p for p in dict.fromkeys(module.parameters()) if p.requires_grad]  # tied weights once
        self._buckets: list[GradBucket] = []
        self._build_buckets(list(range(len(self._params)))[::-1])  # until observed: grads finish roughly in reverse
        self._next_launch = 0
        self._ready_log: list[int] | None = [] if rebuild_buckets else None
        self._index = {p: i for i, p in enumerate(self._params)}
        self._hooks = []
        for p in self._params:  # one DDP per parameter: a wrapper of the same model before (a Trainer per round of
            stale = getattr(p, HOOK_ATTR, None)  # expert iteration) would mark each gradient arrived a second time
            if stale is not None:
                stale.remove()
            self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
            setattr(p, HOOK_ATTR, self._hooks[-1])

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        for t in list(dict.fromkeys(self.module.parameters())) + list(self.module.buffers()):
            dist.broadcast(t.data, src=src, group=self.process_group)

    @torch.no_grad()
    def _build_buckets(self, order: list[int]) -> None:
        """(Re)make the buckets for parameters in ``order``; current gradients move into the new buffers."""
        old = {p: p.grad for p in self._params}
        params = [self._params[i] for i in order]
        plan = plan_buckets(params, self.bucket_bytes, self.first_bucket_bytes, self.reduce_dtype)
        self._buckets = [GradBucket([params[i] for i in idx], self.reduce_dtype) for idx in plan]
        for b in self._buckets:
            b.adopt_grads_from(old)
        self._where = {p: (b, i) for b in self._buckets for i, p in enumerate(b.params)}
        self._order = list(order)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients (gradient accumulation)."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _grad_ready(self, p: nn.Parameter) -> None:
        # runs once per parameter per backward on autograd's thread, the busiest one: keep it tiny
        if not self.require_backward_grad_sync:
            return
        bucket, i = self._where[p]
        if bucket.arrived[i]:
            raise RuntimeError(
                "DDP: a parameter's gradient arrived twice in one synchronised backward; call "
                "finish_gradient_synchronization() after each backward outside no_sync()"
            )
        bucket.arrived[i] = True
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready()
        if self._ready_log is not None:
            self._ready_log.append(self._index[p])

    def _launch_ready(self) -> None:
        # launch in bucket order only, so every rank issues the same sequence of collectives
        while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].pending == 0:
            self._buckets[self._next_launch].launch(self.world_size, self.process_group, self._use_avg)
            self._next_launch += 1

    def finish_gradient_synchronization(self) -> None:
        """Send what backward left unsent, wait for every bucket, leave mean gradients in ``.grad``."""
        if not self.require_backward_grad_sync:
            return
        for bucket in self._buckets[self._next_launch :]:
            bucket.fill_missing()  # unused in this backward: grads from earlier micro-steps, or zeros
        self._launch_ready()
        for bucket in self._buckets:
            bucket.finish()
        self._next_launch = 0
        if self._ready_log is not None:
            self._rebuild_in_ready_order()

    def _rebuild_in_ready_order(self) -> None:
        """Once, after the first synchronised backward: buckets in the order gradients arrived on rank 0."""
        seen = dict.fromkeys(self._ready_log)
        order = list(seen) + [i for i in self._order if i not in seen]  # never-ready ones keep their place, last
        self._ready_log = None
        box = [order]
        dist.broadcast_object_list(
            box,
            src=dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0,
            group=self.process_group,
        )
        if box[0] != self._order:
            self._build_buckets(box[0])

    def remove_hooks(self) -> None:
        """Detach from the module's parameters (the wrapper stops synchronising for good)."""
        for p, h in zip(self._params, self._hooks):
            h.remove()
            if getattr(p, HOOK_ATTR, None) is h:
                setattr(p, HOOK_ATTR, None)
        self._hooks = []

    @property
    def bucket_params(self) -> list[list[nn.Parameter]]:
        """The parameters of each bucket, in launch order."""
        return [b.params for b in self._buckets]

    @property
    def bucket_bytes_sent(self) -> list[int]:
        """Bytes each bucket's all_reduce carries (gradients and used-flags, in the reduce dtype)."""
        return [b.nbytes for b in self._buckets]
