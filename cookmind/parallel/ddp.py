"""Bucketed data parallelism: gradients all-reduced in buckets while backward is still running.

Each parameter's post-accumulate-grad hook copies its finished gradient into a flat bucket;
when every gradient of a bucket is in, one asynchronous all_reduce starts for the whole
bucket, overlapping the rest of backward. ``finish_gradient_synchronization()`` starts what
is left (unused parameters contribute zeros), waits, and writes the averaged gradients back:

    grad = (1 / world_size) * sum over ranks of that rank's grad

Buckets always start in the same order on every rank (bucket i waits for buckets < i), as
collectives must match across ranks. Each bucket carries one "has a gradient" flag per
parameter, so a parameter no rank used keeps ``grad = None``, as in single-process training.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn


class _Bucket:
    """A flat buffer for a few parameters' gradients plus one used-flag per parameter."""

    def __init__(self, params: list[nn.Parameter], dtype: torch.dtype, device: torch.device):
        self.params = params
        self.offsets = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.buffer = torch.zeros(total + len(params), dtype=dtype, device=device)  # grads, then flags
        self.views = [self.buffer[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, params)]
        self.has_grad = [False] * len(params)
        self.arrived = [False] * len(params)
        self.n_arrived = 0
        self.work = None

    def view(self, i: int) -> torch.Tensor:
        return self.views[i]

    def add(self, i: int, grad: torch.Tensor | None) -> None:
        """Take parameter i's gradient (None: contributes zeros)."""
        if self.arrived[i]:
            raise RuntimeError(
                "DDP: a parameter's gradient arrived twice in one synchronised backward; call "
                "finish_gradient_synchronization() after each backward outside no_sync()"
            )
        self.arrived[i] = True
        self.n_arrived += 1
        dst = self.views[i]
        if grad is None:
            dst.zero_()
        else:
            self.has_grad[i] = True
            if grad.data_ptr() != dst.data_ptr():  # grads written back as bucket views need no copy
                dst.copy_(grad)

    def full(self) -> bool:
        return self.n_arrived == len(self.params)

    def launch(self, group) -> None:
        flags = self.buffer[self.numel:]
        flags.fill_(1)  # set on the device: a host-to-device copy here would stall backward
        for i, has in enumerate(self.has_grad):
            if not has:
                flags[i].fill_(0)
        self.work = dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM, group=group, async_op=True)

    def finish(self, world_size: int) -> None:
        """Wait for the all_reduce and write mean gradients back to the parameters."""
        self.work.wait()
        self.buffer[:self.numel].div_(world_size)  # sum -> mean
        used_anywhere = None
        if not all(self.has_grad):  # only then can a parameter be unused on every rank: read the flags
            used_anywhere = (self.buffer[self.numel:] > 0).tolist()
        for i, p in enumerate(self.params):
            if used_anywhere is not None and not used_anywhere[i]:
                p.grad = None
                continue
            g = self.view(i)
            if g.dtype == p.dtype:
                p.grad = g  # the gradient is a view of the bucket: no copy now, none next step
            elif p.grad is not None and p.grad.dtype == p.dtype and p.grad.shape == p.shape:
                p.grad.copy_(g)
            else:
                p.grad = g.to(p.dtype)
        self.has_grad = [False] * len(self.params)
        self.arrived = [False] * len(self.params)
        self.n_arrived = 0
        self.work = None


class DDP(nn.Module):
    """Data-parallel wrapper: ``DDP(module, bucket_size_mb=25, reduce_dtype=None)``.

    After each synchronised backward call ``finish_gradient_synchronization()`` before the
    optimizer step; wrap accumulation micro-steps in ``with ddp.no_sync():`` (or set
    ``ddp.require_backward_grad_sync = False``) and nothing is communicated for them.
    reduce_dtype=torch.bfloat16 halves the bytes sent (the user accepts bf16 rounding of grads).
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0, reduce_dtype: torch.dtype | None = None,
                 process_group=None, bucket_cap_mb: float | None = None):
        super().__init__()
        if bucket_cap_mb is not None:  # torch DDP's name for the same knob
            bucket_size_mb = bucket_cap_mb
        if not dist.is_initialized():
            raise RuntimeError("DDP needs an initialised process group: call cookmind.parallel.init_distributed() "
                               "under torchrun first")
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be > 0, got {bucket_size_mb}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.reduce_dtype = reduce_dtype
        self.require_backward_grad_sync = True
        self._broadcast_from_rank0()
        params = [p for p in dict.fromkeys(module.parameters()) if p.requires_grad]  # tied weights once
        self._buckets = self._make_buckets(params[::-1], bucket_size_mb * 2**20)  # grads finish roughly in reverse
        self._where = {p: (b, i) for b in self._buckets for i, p in enumerate(b.params)}
        self._next_launch = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        for t in list(dict.fromkeys(self.module.parameters())) + list(self.module.buffers()):
            dist.broadcast(t.data, src=src, group=self.process_group)

    def _make_buckets(self, params, capacity_bytes: float) -> list[_Bucket]:
        buckets, current, size = [], [], 0
        for p in params:
            dtype = self.reduce_dtype or p.dtype
            nbytes = p.numel() * torch.empty((), dtype=dtype).element_size()
            same_kind = not current or ((self.reduce_dtype or current[0].dtype) == dtype
                                        and current[0].device == p.device)
            if current and (size + nbytes > capacity_bytes or not same_kind):
                buckets.append(_Bucket(current, self.reduce_dtype or current[0].dtype, current[0].device))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(_Bucket(current, self.reduce_dtype or current[0].dtype, current[0].device))
        return buckets

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
        if not self.require_backward_grad_sync:
            return
        bucket, i = self._where[p]
        bucket.add(i, p.grad)
        self._launch_ready()

    def _launch_ready(self) -> None:
        # launch in bucket order only, so every rank issues the same sequence of collectives
        while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].full():
            self._buckets[self._next_launch].launch(self.process_group)
            self._next_launch += 1

    def finish_gradient_synchronization(self) -> None:
        """Send what backward left unsent, wait for every bucket, write mean gradients to ``.grad``."""
        if not self.require_backward_grad_sync:
            return
        for bucket in self._buckets[self._next_launch:]:
            for i, p in enumerate(bucket.params):
                if not bucket.arrived[i]:  # unused in this backward: grads from earlier micro-steps, or zeros
                    bucket.add(i, p.grad)
        self._launch_ready()
        for bucket in self._buckets:
            bucket.finish(self.world_size)
        self._next_launch = 0

    @property
    def bucket_params(self) -> list[list[nn.Parameter]]:
        """The parameters of each bucket, in launch order."""
        return [b.params for b in self._buckets]
