"""bf16 model parameters with fp32 master weights in the optimizer (``train.master_weights``).

Under bf16 autocast over fp32 parameters every step casts each weight to bf16 in the forward and each weight
gradient back to fp32 in the backward (6 + 6 bytes a parameter). Here the model's parameters themselves are bf16:
the forward reads them directly and the backward's gradients come out bf16. The fp32 copy the update needs (a
bf16 weight cannot take an update of lr * 1e-3 of its size) lives in the optimizer: ``AdamW(model_params=...)``
updates the fp32 master from the bf16 gradient and writes the bf16 weight back in the same pass.

    masters = to_bf16_with_masters(model)         # {bf16 parameter: its fp32 master}, no copy of the weights
    opt = AdamW([masters[p] for p in ...], model_params={m: p for p, m in masters.items()})
    hooks = accumulate_grads_in_fp32(params)      # only with gradient accumulation (see there)
    all_reduce_fp32_grads(params)                 # ... and data parallelism: after the last micro-batch
    with masters_in_place(model, opt.model_params):
        save_model(...)                           # writes the fp32 masters under the parameters' names

Buffers (RoPE tables) keep their dtype; frozen parameters (a LoRA base) become bf16 with no master.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

LOW = torch.bfloat16
GRAD_ATTR = "grad_fp32"  # a parameter's fp32 gradient accumulation buffer (accumulate_grads_in_fp32)
HOOK_ATTR = "grad_fp32_hook"  # the handle of a parameter's accumulation hook (accumulate_grads_in_fp32)


def to_bf16_with_masters(model: nn.Module) -> dict[nn.Parameter, torch.Tensor]:
    """Make every floating-point parameter of ``model`` bf16 in place; return {trainable parameter: fp32 master}.

    The master of an fp32 parameter is its own tensor (no copy) and the parameter gets a bf16 copy of it; a
    parameter that is bf16 already (a model loaded in bf16) keeps its tensor and gets an fp32 copy as its master.
    In model order, a tied weight listed once. Frozen parameters just become bf16.
    """
    masters: dict[nn.Parameter, torch.Tensor] = {}
    for p in dict.fromkeys(model.parameters()):
        if not p.is_floating_point():
            continue
        if p.requires_grad:
            masters[p] = p.detach().float()  # p's own storage when it is fp32
        if p.dtype != LOW:
            p.data = p.data.to(LOW)
    return masters


def grad_of(p: torch.Tensor) -> torch.Tensor | None:
    """The gradient ``p`` holds: its fp32 accumulation buffer when it has one, else ``p.grad``."""
    buf = getattr(p, GRAD_ATTR, None)
    return buf if buf is not None else p.grad


def _accumulate(p: torch.Tensor) -> None:
    buf = getattr(p, GRAD_ATTR, None)
    if buf is None:
        setattr(p, GRAD_ATTR, p.grad.float())
    else:
        buf.add_(p.grad)
    p.grad = None  # the next micro-batch's gradient is stolen into .grad again, not added to it in bf16


def accumulate_grads_in_fp32(params: list[nn.Parameter]) -> list:
    """Over several micro-batches, add each bf16 gradient into an fp32 buffer (``grad_of``) as soon as autograd has
    accumulated it, and drop ``.grad``: bf16 gradients never sum in bf16. Returns the hooks' handles.

    With one micro-batch a step no buffer is needed: the optimizer reads the bf16 gradient itself. A parameter hooked
    already (a second Trainer over the same model, as expert iteration runs one a round) gets no second hook, which
    would find ``.grad`` taken by the first.
    """
    handles = []
    for p in params:
        if p.requires_grad and getattr(p, HOOK_ATTR, None) is None:
            handles.append(p.register_post_accumulate_grad_hook(_accumulate))
            setattr(p, HOOK_ATTR, handles[-1])
    return handles


def release_fp32_accumulation(params) -> None:
    """Take off what ``accumulate_grads_in_fp32`` left on ``params`` (its hooks and buffers): a later Trainer of
    the same model without master weights reads ``.grad``, which those hooks would keep taking."""
    for p in params:
        handle = getattr(p, HOOK_ATTR, None)
        if handle is not None:
            handle.remove()
            setattr(p, HOOK_ATTR, None)
        if getattr(p, GRAD_ATTR, None) is not None:
            setattr(p, GRAD_ATTR, None)


def all_reduce_fp32_grads(params: list[nn.Parameter], group=None) -> None:
    """Average the fp32 accumulation buffers of ``params`` over the ranks of ``group``: data parallelism with
    gradient accumulation, where the buffers, not ``.grad``, hold the step's gradients (so DDP's own all-reduce
    of ``.grad`` is skipped on every micro-batch). One all-reduce a buffer, all in flight at once, in fp32.

    A parameter that got no gradient on this rank gets a zero buffer first: every rank then sends the same list.
    """
    import torch.distributed as dist

    bufs = []
    for p in params:
        if getattr(p, GRAD_ATTR, None) is None:
            setattr(p, GRAD_ATTR, torch.zeros(p.shape, dtype=torch.float32, device=p.device))
        bufs.append(getattr(p, GRAD_ATTR))
    for work in [dist.all_reduce(b, group=group, async_op=True) for b in bufs]:
        work.wait()
    torch._foreach_div_(bufs, dist.get_world_size(group))


def drop_grads(params, set_to_none: bool = True) -> None:
    """``zero_grad`` for parameters whose gradient may sit in an fp32 buffer: ``.grad`` and the buffer both."""
    for p in params:
        for name in ("grad", GRAD_ATTR):
            g = getattr(p, name, None)
            if g is None:
                continue
            if set_to_none:
                setattr(p, name, None)
            else:
                g.detach_().zero_()


@contextlib.contextmanager
def masters_in_place(model: nn.Module, model_params: dict[torch.Tensor, nn.Parameter]) -> Iterator[None]:
    """For the body, each bf16 parameter of ``model`` is replaced in its module by an fp32 stand-in: its master
    (``model_params``: master -> parameter), or an fp32 copy for a frozen one. A save then writes fp32 weights under
    the usual names, a load fills the masters; afterwards the parameters are back, rewritten from the stand-ins.

    The modules' entries are swapped, not the parameters' ``.data``: a parameter whose data changes dtype loses its
    gradient accumulator, and with it the hooks DDP's reducer placed there."""
    masters = {p: master for master, p in model_params.items()}
    stand_ins: dict[nn.Parameter, nn.Parameter] = {}  # one per parameter, so a tied weight stays one tensor
    swapped = []
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.dtype == LOW:
                if p not in stand_ins:
                    full = masters.get(p)
                    stand_ins[p] = nn.Parameter(full if full is not None else p.detach().float(), requires_grad=False)
                swapped.append((module, name, p))
    for module, name, p in swapped:
        module._parameters[name] = stand_ins[p]
    try:
        yield
    finally:
        for module, name, p in swapped:
            module._parameters[name] = p
        with torch.no_grad():
            for p, full in stand_ins.items():
                p.copy_(full)
