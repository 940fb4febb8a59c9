"""One DDP bucket: a few parameters whose gradients live in one flat buffer and are all-reduced together.

    grad_buffer  [g_0 | g_1 | ... | g_k]            param dtype; param.grad is a view of its slice
    comm_buffer  [g_0 | ... | g_k | flag_0 .. flag_k] reduce dtype (the grad buffer itself when equal)

Gradients are written straight into the bucket: DDP attaches each ``param.grad`` as a view of
its slice before backward, so autograd accumulates in place and nothing is copied in or out
(a gradient that arrives as a fresh tensor is copied in once). At launch the bucket is scaled
by 1/world_size (into the bf16 comm buffer when reducing in bf16) and summed across ranks:

    grad = sum over ranks r of (grad_r / world_size)

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
                raise ValueError(f"GradBucket: parameters of one bucket must share dtype and device; got "
                                 f"{p.dtype}/{p.device} beside {dtype}/{device}")
        self.params = params
        sizes = [p.numel() for p in params]
        self.numel = sum(sizes)
        n = len(params)
        buffer = torch.zeros(self.numel + n, dtype=dtype, device=device)  # grads, then flags (if same dtype)
        self.grad_buffer = buffer[:self.numel]
        reduce_dtype = reduce_dtype or dtype
        self.comm_buffer = buffer if reduce_dtype == dtype else torch.zeros(self.numel + n, dtype=reduce_dtype,
                                                                            device=device)
        self.views = [v.view_as(p) for v, p in zip(self.grad_buffer.split(sizes), params)]
        self.has_grad = [False] * n  # this rank produced (or kept) a gradient since the last sync
        self.fresh = [False] * n  # grad is a zeroed view attached by DDP, not written by autograd yet
        self.arrived = [False] * n  # ready in the current synchronised backward
        self.pending = n
        self.work = None

    @property
    def nbytes(self) -> int:
        """Bytes sent per all_reduce (gradients and flags, in the reduce dtype)."""
        return self.comm_buffer.numel() * self.comm_buffer.element_size()

    def attach_grads(self) -> None:
        """Before backward: a parameter without a gradient gets a zeroed view of its slice as ``.grad``."""
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if not missing:
            return
        if len(missing) == len(self.params):
            self.grad_buffer.zero_()  # one kernel for the whole bucket
        else:
            for i in missing:
                self.views[i].zero_()
        for i in missing:
            self.params[i].grad = self.views[i]
            self.fresh[i] = True

    def grad_ready(self, i: int) -> None:
        """Parameter i's gradient is final for this backward (from its post-accumulate-grad hook)."""
        if self.arrived[i]:
            raise RuntimeError(
                "DDP: a parameter's gradient arrived twice in one synchronised backward; call "
                "finish_gradient_synchronization() after each backward outside no_sync()"
            )
        self.arrived[i] = True
        self.pending -= 1
        self._take(i)
        self.has_grad[i] = True

    def grad_accumulated(self, i: int) -> None:
        """Parameter i got a gradient in a backward that does not synchronise (no_sync micro-step)."""
        self.has_grad[i] = True
        self.fresh[i] = False

    def _take(self, i: int) -> None:
        """Make sure parameter i's gradient lives in its slice (zeros if it has none)."""
        p, view = self.params[i], self.views[i]
        if p.grad is view:
            return
        if p.grad is None:
            view.zero_()
        else:
            view.copy_(p.grad)  # a gradient autograd allocated itself (grad was None at backward)
            p.grad = view

    def fill_missing(self) -> None:
        """At the end of backward: parameters not used in it contribute what they hold (or zeros)."""
        for i, p in enumerate(self.params):
            if not self.arrived[i]:
                self.arrived[i] = True
                self.pending -= 1
                if p.grad is not None and not self.fresh[i]:
                    self.has_grad[i] = True  # accumulated on an earlier micro-step, or kept by the user
                self._take(i)

    def launch(self, world_size: int, group=None) -> None:
        """Scale by 1/world_size and start the asynchronous sum over ranks."""
        flags = self.comm_buffer[self.numel:]
        flags.fill_(1)  # set on the device: a host-to-device copy here would stall backward
        for i, has in enumerate(self.has_grad):
            if not has:
                flags[i].fill_(0)
        grads = self.comm_buffer[:self.numel]
        if grads.data_ptr() == self.grad_buffer.data_ptr():
            grads.div_(world_size)  # pre-divide: the sum of the ranks' shares is the mean
        else:
            torch.div(self.grad_buffer, world_size, out=grads)  # and round to the reduce dtype
        self.work = dist.all_reduce(self.comm_buffer, op=dist.ReduceOp.SUM, group=group, async_op=True)

    def finish(self) -> None:
        """Wait for the all_reduce; mean gradients become the parameters' ``.grad`` (views, no copy)."""
        self.work.wait()
        if self.comm_buffer.data_ptr() != self.grad_buffer.data_ptr():
            self.grad_buffer.copy_(self.comm_buffer[:self.numel])
        used_anywhere = None
        if not all(self.has_grad):  # only then can a parameter be unused on every rank: read the flags
            used_anywhere = (self.comm_buffer[self.numel:] > 0).tolist()
        for i, p in enumerate(self.params):
            if used_anywhere is not None and not used_anywhere[i]:
                p.grad = None
            elif p.grad is not self.views[i]:
                p.grad = self.views[i]
        n = len(self.params)
        self.has_grad, self.fresh, self.arrived = [False] * n, [False] * n, [False] * n
        self.pending = n
        self.work = None

    def adopt_grads_from(self, old: dict[nn.Parameter, torch.Tensor | None]) -> None:
        """After a re-bucketing: copy each parameter's current gradient into this bucket's views."""
        for p, view in zip(self.params, self.views):
            g = old.get(p)
            if g is not None:
                view.copy_(g)
                p.grad = view
