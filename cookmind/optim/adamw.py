"""AdamW (Loshchilov & Hutter): Adam with weight decay decoupled from the gradient."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from cookmind.kernels import adamw as adamw_kernel
from cookmind.optim.master_weights import drop_grads, grad_of

# the fused path's kernel on CUDA: "triton" (cookmind/kernels/adamw.py, one pass at the memory's speed) or "torch"
# (torch._fused_adamw_, about half as fast at 1B parameters on an H200); other devices always take torch's
FUSED_KERNEL = "triton"
# ... for a group of at least this many elements: below it torch's kernel, one launch group, keeps the host's cost
# of a small model's step (the Triton path launches once a tensor); measured faster from the 0.6B presets up
TRITON_MIN_ELEMENTS = 2**27


class AdamW(torch.optim.Optimizer):
    """Per step t, for each parameter p with gradient g:

        p <- p (1 - lr wd)                                   decoupled decay, independent of g
        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    ``foreach=True`` runs the same math as multi-tensor ops (one kernel per op for all parameters of a
    group), which is what makes it fast on GPUs with many small tensors. ``fused=True`` is the fast path
    beside it: one pass over memory instead of about ten, through our Triton kernel on CUDA
    (``cookmind/kernels/adamw.py``, ``FUSED_KERNEL``) and PyTorch's ``torch._fused_adamw_`` elsewhere; tests
    show all of them give torch.optim.AdamW's parameters.

    ``model_params`` (master weights, ``cookmind.optim.master_weights``): {fp32 tensor it updates: the model's bf16
    parameter}. For such a master the gradient is read from the bf16 parameter (its fp32 accumulation buffer
    when it has one, else its bf16 ``.grad``), the update runs in fp32 on the master and its fp32 moments, and
    the parameter is rewritten as the master rounded to bf16: in the same pass in the Triton kernel, by one
    multi-tensor copy elsewhere. ``zero_grad`` clears those parameters' gradients.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        foreach: bool = True,
        fused: bool = False,
        model_params: dict[torch.Tensor, nn.Parameter] | None = None,
    ):
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"AdamW: invalid hyper-parameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        super().__init__(
            params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach, fused=fused)
        )
        self._lr_tensors: dict[tuple, tuple[dict, torch.Tensor]] = {}  # (group id, device) -> (group, lr tensor)
        self.model_params = dict(model_params or {})
        if self.model_params and any(p not in self.model_params for g in self.param_groups for p in g["params"]):
            raise ValueError("AdamW(model_params=...): every tensor it updates must be a master named there")
        for master, p in self.model_params.items():
            if master.dtype != torch.float32 or master.shape != p.shape:
                raise ValueError(
                    f"AdamW(model_params=...): a master must be float32 and of its parameter's shape, got "
                    f"{master.dtype} {tuple(master.shape)} for {p.dtype} {tuple(p.shape)}"
                )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the updated tensors and, with master weights, of the model's parameters."""
        super().zero_grad(set_to_none)
        if self.model_params:
            drop_grads(self.model_params.values(), set_to_none)

    def _with_grads(self, group: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The group's tensors that have a gradient, and those gradients (a master's: its parameter's)."""
        params, grads = [], []
        for p in group["params"]:
            model_param = self.model_params.get(p) if self.model_params else None
            g = p.grad if model_param is None else grad_of(model_param)
            if g is not None:
                params.append(p)
                grads.append(local(g))
        return params, grads

    def _write_back(self, params: list[torch.Tensor]) -> None:
        """Round the updated masters among ``params`` into their bf16 model parameters."""
        if self.model_params:
            pairs = [(self.model_params[p], p) for p in params if p in self.model_params]
            if pairs:
                torch._foreach_copy_([local(q) for q, _ in pairs], [local(p) for _, p in pairs])

    @torch.no_grad()
    def step(self, closure=None, found_inf: torch.Tensor | None = None, grad_divisor: torch.Tensor | None = None):
        """One update of every parameter that has a gradient.

        found_inf: an optional 0-dim float tensor; nonzero means "skip this step" (a non-finite loss or
        gradient). The fused path reads it on the device, so the caller need not wait for the GPU to decide;
        the other paths read it on the host.
        grad_divisor: an optional 0-dim fp32 tensor the gradients are divided by first (gradient clipping,
        ``clip_divisor``). The fused kernel divides as it reads them (and writes the divided gradients back),
        so clipping costs no pass of its own; the other paths divide in place first.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if found_inf is not None and not any(g.get("fused") for g in self.param_groups) and found_inf.item():
            return loss
        for group in self.param_groups:
            params, grads = self._with_grads(group)
            if not params:
                continue
            if group.get("fused"):
                self._fused_update(group, params, grads, found_inf, grad_divisor)
                continue
            grads = [g.float() for g in grads]  # a bf16 gradient of a master: the fp32 math reads an fp32 copy
            if grad_divisor is not None:
                torch._foreach_div_(grads, grad_divisor)
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif isinstance(state["step"], torch.Tensor):  # state saved by the fused path
                    state["step"] = int(state["step"].item())
                state["step"] += 1
            if group["foreach"]:
                self._foreach_update(group, params, grads)
            else:
                for p, g in zip(params, grads):
                    self._single_update(group, p, g)
            self._write_back(params)
        return loss

    def _single_update(self, group, p, g):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        state = self.state[p]
        m, v, t = local(state["exp_avg"]), local(state["exp_avg_sq"]), state["step"]
        p = local(p)
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)  # m + (1 - b1)(g - m) = b1 m + (1 - b1) g
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(eps)
        p.addcdiv_(m, denom, value=-lr / (1 - b1**t))

    def _foreach_update(self, group, params, grads):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        # parameters of one group can sit at different step counts (e.g. late-joining grads): bucket by step
        by_step: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for p, g in zip(params, grads):
            by_step.setdefault(self.state[p]["step"], []).append((p, g))
        for t, pairs in by_step.items():
            ps, grads = [p for p, _ in pairs], [g for _, g in pairs]
            ms = [local(self.state[p]["exp_avg"]) for p in ps]
            vs = [local(self.state[p]["exp_avg_sq"]) for p in ps]
            ps = [local(p) for p in ps]
            if wd != 0:
                torch._foreach_mul_(ps, 1 - lr * wd)
            torch._foreach_lerp_(ms, grads, 1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, math.sqrt(1 - b2**t))
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(ps, ms, denom, value=-lr / (1 - b1**t))

    def _fused_update(self, group, params, grads, found_inf=None, grad_divisor=None):
        (b1, b2) = group["betas"]
        buckets: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for p, g in zip(params, grads):
            state = self.state[p]
            if not state:
                # the fused kernel reads the step count from a float tensor on the parameter's device
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif not isinstance(state["step"], torch.Tensor):  # state saved by the foreach/single path
                state["step"] = torch.tensor(float(state["step"]), device=p.device)
            buckets.setdefault((p.device, p.dtype), []).append((p, g))
        for pairs in buckets.values():
            ps = [p for p, _ in pairs]
            steps = [self.state[p]["step"] for p in ps]
            torch._foreach_add_(steps, 1)
            tensors = (
                [local(p) for p in ps],
                [g for _, g in pairs],
                [local(self.state[p]["exp_avg"]) for p in ps],
                [local(self.state[p]["exp_avg_sq"]) for p in ps],
            )
            hyper = dict(beta1=b1, beta2=b2, weight_decay=group["weight_decay"], eps=group["eps"])
            lr = self._device_lr(group, ps[0].device)
            outs = [local(self.model_params[p]) for p in ps] if self.model_params else None
            if use_triton_kernel(tensors, outs):
                adamw_kernel.adamw_triton_(
                    *tensors, steps, lr=lr, grad_scale=grad_divisor, found_inf=found_inf, outs=outs, **hyper
                )
            else:
                if outs is not None:  # torch's kernel takes gradients of the parameters' dtype only
                    tensors = (tensors[0], [g.float() for g in tensors[1]], *tensors[2:])
                torch._fused_adamw_(
                    *tensors, [], steps, amsgrad=False, lr=lr, maximize=False, grad_scale=grad_divisor,
                    found_inf=found_inf, **hyper,
                )  # fmt: skip
                self._write_back(ps)  # a skipped step rewrites each parameter with its own value
            if found_inf is not None:  # a skipped step leaves the moments and params; undo the count too
                torch._foreach_sub_(steps, [found_inf] * len(steps))

    def _device_lr(self, group: dict, device: torch.device) -> torch.Tensor:
        """The group's lr as a 0-dim fp32 tensor on ``device``, which the fused kernel reads from memory.

        Refilled from ``group["lr"]`` here, except while a CUDA graph is being captured: a captured step
        (``train.cuda_graph``) must read the schedule's value of each replay, so the trainer refills the
        tensors before every replay (``refill_device_lr``) and the graph holds only the read. (The lr is
        rounded to fp32 on the way: a relative change below 6e-8.)
        """
        key = (id(group), device)
        if key not in self._lr_tensors:
            self._lr_tensors[key] = (group, torch.zeros((), dtype=torch.float32, device=device))
        lr = self._lr_tensors[key][1]
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            lr.fill_(group["lr"])
        return lr

    def refill_device_lr(self) -> None:
        """Copy every group's current lr into its device tensor (before replaying a captured step)."""
        for group, lr in self._lr_tensors.values():
            lr.fill_(group["lr"])


def use_triton_kernel(tensors: tuple[list[torch.Tensor], ...], outs: list[torch.Tensor] | None = None) -> bool:
    """Whether the fused path runs our Triton kernel on these (params, grads, exp_avgs, exp_avg_sqs) and the bf16
    parameters ``outs`` of master weights: CUDA with triton, FUSED_KERNEL == "triton", float32 parameters and
    moments, every tensor contiguous, and at least TRITON_MIN_ELEMENTS elements unless there are ``outs`` (torch's
    kernel would then need each bf16 gradient converted first, a launch a tensor too, and a copy-back pass)."""
    params, _, exp_avgs, exp_avg_sqs = tensors
    if FUSED_KERNEL != "triton" or not params or not adamw_kernel.available(params[0].device):
        return False
    if outs is None and sum(p.numel() for p in params) < TRITON_MIN_ELEMENTS:
        return False
    if any(t.dtype != torch.float32 for group in (params, exp_avgs, exp_avg_sqs) for t in group):
        return False
    return all(t.is_contiguous() for group in (*tensors, outs or []) for t in group)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters by shape: matrices (``p.dim() >= 2``) decay, vectors and scalars do not.

    Norm gains and biases are vectors: shrinking them toward 0 only fights the normalisation. Embeddings are
    matrices and decay, as in GPT-2/nanoGPT (a tied LM head is the same tensor). The rule reads shapes only,
    so it holds for any model (LoRA adapters, MoE routers) without knowing its classes. A tied weight is listed
    once. Empty groups are left out.
    """
    decay, no_decay = [], []
    for p in dict.fromkeys(model.parameters()):  # distinct tensors, in model order
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters, gradients and moments), any other tensor as it is.

    AdamW is elementwise, so updating each rank's shard is the whole update; on the shards the multi-tensor ops
    skip DTensor's dispatch, which costs the host milliseconds a step over a few hundred parameters (an FSDP run
    whose GPU then waits). The shard itself (``_local_tensor``, what ``to_local`` views under no_grad, at a
    fortieth of its host cost), so in-place ops land in the DTensor's storage.
    """
    return t._local_tensor if isinstance(t, DTensor) else t
