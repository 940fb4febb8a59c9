"""One DDP bucket: a few parameters whose gradients are all-reduced together from one flat buffer.

    comm_buffer  [g_0 | g_1 | ... | g_k | flag_0 .. flag_k]   reduce dtype
    grad_buffer  [g_0 | g_1 | ... | g_k]                      param dtype (the comm buffer's front when equal)

After the all_reduce each ``param.grad`` is a view of its slice of ``grad_buffer``: nothing is
copied back per parameter, and when the user keeps gradients (``zero_grad(set_to_none=False)``)
autograd accumulates straight into the bucket next time. A gradient that autograd allocated
itself (``.grad`` was None) is copied in at launch, one multi-tensor copy for the bucket. The
sum over ranks is then scaled to the mean:

    grad = (1 / world_size) * sum over ranks of grad_r

(NCCL's AVG does the scaling inside the reduction; other backends pre-divide the bucket.)
Each parameter carries a "has a gradient" flag in the same all_reduce, so a parameter that no
rank used ends with ``grad = None``, as in single-process training.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class GradBucket:
    """Flat gradient storage and one asynchronous all_reduce for ``params`` (same dtype and device)."""

    def __init__(self, params: list[nn.Parameter], reduce_dtype: torch.dtype | None = None):
        dtype, device = params[0].dtype, params[0].device
        for p in params:
            if p.dtype != dtype or p.device != device:
                raise ValueError(
                    f"GradBucket: parameters of one bucket must share dtype and device; got "
                    f"{p.dtype}/{p.device} beside {dtype}/{device}"
                )
        self.params = params
        sizes = [p.numel() for p in params]
        self.numel = sum(sizes)
        n = len(params)
        reduce_dtype = reduce_dtype or dtype
        self.comm_buffer = torch.zeros(self.numel + n, dtype=reduce_dtype, device=device)  # grads, then flags
        self.grad_buffer = (
            self.comm_buffer[: self.numel]
            if reduce_dtype == dtype
            else torch.zeros(self.numel, dtype=dtype, device=device)
        )
        self.views = [v.view_as(p) for v, p in zip(self.grad_buffer.split(sizes), params)]
        self.comm_views = list(self.comm_buffer[: self.numel].split(sizes))
        self.separate_comm = reduce_dtype != dtype
        self._ones = torch.ones(n, dtype=reduce_dtype, device=device)
        self.has_grad = [False] * n  # this rank holds a gradient for the parameter this step
        self.arrived = [False] * n  # ready in the current synchronised backward (set by DDP's hook)
        self.pending = n
        self.work = None

    @property
    def nbytes(self) -> int:
        """Bytes sent per all_reduce (gradients and flags, in the reduce dtype)."""
        return self.comm_buffer.numel() * self.comm_buffer.element_size()

    def fill_missing(self) -> None:
        """At the end of backward: parameters not used in it send what they hold (earlier micro-steps) or zeros."""
        for i in range(len(self.params)):
            if not self.arrived[i]:
                self.arrived[i] = True
                self.pending -= 1

    @torch.no_grad()
    def _gather(self) -> None:
        """Bring every gradient and its flag into the comm buffer: one multi-tensor copy for the bucket."""
        src, dst = [], []
        for i, p in enumerate(self.params):
            g = p.grad
            self.has_grad[i] = g is not None
            if g is None:
                self.comm_views[i].zero_()
            elif self.separate_comm or g is not self.views[i]:
                src.append(g.reshape(-1))
                dst.append(self.comm_views[i])
        flags = self.comm_buffer[self.numel :]
        if all(self.has_grad):
            src.append(self._ones)  # the flags ride in the same copy: no extra kernel
            dst.append(flags)
        else:
            flags.copy_(torch.tensor(self.has_grad, dtype=flags.dtype), non_blocking=True)
        if src:
            torch._foreach_copy_(dst, src)  # casts to the reduce dtype on the way
        # the gradients autograd allocated are in the bucket now: point .grad at its slice and let them go
        # (with a separate comm buffer the slice is filled at finish(); nothing reads .grad before that)
        for i, p in enumerate(self.params):
            if p.grad is not None and p.grad is not self.views[i]:
                p.grad = self.views[i]

    def launch(self, world_size: int, group=None, use_avg: bool = False) -> None:
        """Start the asynchronous mean over ranks (use_avg: the backend averages itself, as NCCL does)."""
        self._gather()
        if use_avg:
            op = dist.ReduceOp.AVG  # the 1/world_size scaling happens inside the reduction
        else:
            self.comm_buffer.div_(world_size)  # pre-divide: the sum of the ranks' shares is the mean
            op = dist.ReduceOp.SUM
        self.work = dist.all_reduce(self.comm_buffer, op=op, group=group, async_op=True)

    @torch.no_grad()
    def finish(self) -> None:
        """Wait for the all_reduce; mean gradients become the parameters' ``.grad`` (views, no copy)."""
        self.work.wait()
        if self.separate_comm:
            self.grad_buffer.copy_(self.comm_buffer[: self.numel])  # one cast back for the whole bucket
        used_anywhere = None
        if not all(self.has_grad):  # only then can a parameter be unused on every rank: read the flags
            used_anywhere = (self.comm_buffer[self.numel :] > 0).tolist()
        for i, p in enumerate(self.params):
            if used_anywhere is not None and not used_anywhere[i]:
                p.grad = None
            elif p.grad is not self.views[i]:
                p.grad = self.views[i]
        n = len(self.params)
        self.has_grad, self.arrived = [False] * n, [False] * n
        self.pending = n
        self.work = None

    @torch.no_grad()
    def adopt_grads_from(self, old: dict[nn.Parameter, torch.Tensor | None]) -> None:
        """After a re-bucketing: copy each parameter's current gradient into this bucket's views."""
        for p, view in zip(self.params, self.views):
            g = old.get(p)
            if g is not None:
                view.copy_(g)
                p.grad = view
