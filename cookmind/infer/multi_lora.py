"""Several LoRA adapters served by one model at once: every row of a batch picks its own adapter (or none).

``attach_adapters`` replaces each projection some adapter targets with a ``MultiLoRALinear``: the base ``weight``
(and ``bias``) stay as they were, and every adapter's low-rank pair is stacked, index 0 being no adapter (zeros):

    A: (n+1, r_max, in), B: (n+1, out, r_max), scale: (n+1,)
    y = x W^T + b + scale[i] * (x A[i]^T) B[i]^T        for a row served by adapter i

An adapter of rank r < r_max fills the first r rows of A and columns of B; the zeros beyond add nothing, and an
adapter that does not target a module has zeros there. A decode step computes every adapter's down-projection
inside the projection's own GEMM where the stacked A joins its weight (``MultiLoRALinear`` fold,
``LowRankDelta.fold_into``) and, compiled, the rows' up-projections and the add as one fused kernel (no gathers
into memory: it is launch-bound); a prefill gathers each row's
pair (``LowRankDelta``).

A row's adapter is read from a device tensor, never a Python value: the engine writes each slot's adapter into
``by_slot`` when it admits a request, and the runner copies the forward's rows out of it into ``rows``, the one
tensor every layer reads. CUDA graphs replay over those fixed buffers, so one captured graph serves any mix of
adapters.

``attach_adapters(update="kernel")`` (CUDA) runs a decode step's update as two Triton launches per projection
instead, each row reading only its own adapter (``kernels.lora_bgmv``: a shrink, skipped where the fold gave
x A_all^T, and an expand that adds into the output in place; rows of the base do no work).

The serving runner still fuses q/k/v and gate/up into one GEMM each (``model.fused``): a ``MultiLoRALinear`` among
the parts hands the fused projection a ``LowRankDelta`` that adds every part's update into its slice of the fused
output (zeros for a part no adapter targets). Attach before the runner is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cookmind.kernels import lora_bgmv


@dataclass
class LoRAAdapter:
    """One adapter read from disk (``loading.load_adapters``): module name -> (A (r, in), B (out, r)), and the
    scaling that multiplies B A (alpha / r, or alpha / sqrt(r) with rsLoRA)."""

    name: str
    path: Path
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class AdapterRows:
    """The adapter index of every slot (``by_slot``, set at admission) and of the rows of the running forward
    (``rows``, what the layers read); both fixed device tensors."""

    def __init__(self, names: list[str], num_slots: int, device):
        self.names = list(names)
        with torch.inference_mode():  # like every other input of a compiled layer: one compilation serves all
            self.by_slot = torch.zeros(num_slots, dtype=torch.long, device=device)
            self.rows = torch.zeros(num_slots, dtype=torch.long, device=device)

    def index(self, name: str | None) -> int:
        """The stack index of adapter ``name`` (0: None, the base model); ValueError naming the served ones."""
        if name is None:
            return 0
        if name not in self.names:
            raise ValueError(f"unknown adapter {name!r}; this engine serves {self.names}")
        return self.names.index(name) + 1

    def set_slot(self, slot: int, index: int) -> None:
        """The request in ``slot`` is served by adapter ``index`` (0: none) from its next forward on."""
        self.by_slot[slot] = index

    def select(self, slot_start: int, b: int) -> None:
        """Before a forward over slots slot_start..slot_start+b-1: their adapters become rows 0..b-1."""
        self.rows[:b].copy_(self.by_slot[slot_start : slot_start + b])


# above this many stacked entries (adapters + the base) a projection gathers each row's pair instead of masking
# (``attach_adapters(update="auto")``)
MASKED_MAX_STACK = 16
# attach_adapters' ways of computing a decode step's per-row updates
UPDATES = ("auto", "masked", "gathered", "kernel")
# ... and only for at most this many tokens per row (decode, verify): a prefill's low-rank work n+1 times over would
# show, and it is not launch-bound, so it gathers each row's pair (one gather per row, not per token)
MASKED_MAX_TOKENS = 16
# compiled, an update whose x A_all^T has at most this many elements (a decode step: 256 rows at (n+1) R = 256)
# runs its up-projection as one fused reduction (``COMPILED_UPDATE``); larger ones (prefill) as a GEMM
COMPILED_EXPAND_MAX_ELEMENTS = 256 * 256
# that reduction: "own" reads each row's own R columns of x A_all^T and its own adapter's B (indexed loads, no
# mask); "select" zeroes the other adapters' columns and multiplies by every adapter's B, which reads all (n+1) R
# columns of B once per row: (n+1) times the traffic. Yet on the H200 (3b9c477, bench_multi_lora --profile: 32 rows,
# 4 adapters, 12 layers) a decode graph replays in 1.45 ms with "select" and 1.66 ms with "own" (the base 0.42 ms):
# the indexed loads cost more than the bytes they save, so "select" stays the default
COMPILED_UPDATES = ("own", "select")
COMPILED_UPDATE = "select"
# a projection's weight takes every adapter's A below its rows (``fold_into``, ``MultiLoRALinear``) when they add at
# most this share of its rows: a decode step's GEMM grows by that much, and a fused one's prefill too
FOLD_MAX_SHARE = 0.25
# the projections ``model.fused`` stacks into one GEMM each (q/k/v, gate/up): their fused update is built there
FUSED_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


class LowRankDelta(nn.Module):
    """Each row's adapter update of one projection's output, the projection made of parts side by side (one part:
    a plain projection; q/k/v or gate/up: a fused one, ``model.fused``). Part j of the output gets
    scale_j[i] * (x A_j[i]^T) B_j[i]^T for a row served by adapter i; a part no adapter targets is left as it is.

    A decode step (up to ``MASKED_MAX_TOKENS`` tokens a row) with few adapters (n+1 <= ``MASKED_MAX_STACK``) is
    launch-bound, so its update is two GEMMs and one select, whatever the mix of rows: every adapter's A of every
    part stacked into one ((n+1) R, in) matrix gives x A_all^T for all adapters at once, the columns of adapters
    other than the row's are zeroed (a mask read from ``rows``), and one GEMM with every B side by side (scale
    folded in; block-diagonal over the parts, so fused parts stay one GEMM) adds the update to y. Compiled, the
    select, the up-projection and the add are one fused reduction (``COMPILED_UPDATE`` "select"); "own" instead
    loads only the row's own R columns and its adapter's B (``_own_update``: no mask, no other adapter's B read).
    The low-rank down-projection grows n+1 times, tiny beside the projection at a few tokens a row; what it saves
    is a dozen small gather/bmm kernels per projection. A prefill (or many adapters) gathers each row's pair
    instead and runs two batched matmuls (all parts' down-projections in one, each part's up-projection on its own).

    kernel: a step of up to ``lora_bgmv.MAX_TOKENS`` tokens a row runs the Triton kernels of ``kernels.lora_bgmv``
    instead (each row's own adapter only, whatever their number; the update added into y in place)."""

    def __init__(
        self,
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | int],
        rows: torch.Tensor,
        masked: bool,
        kernel: bool = False,
    ):
        """parts: in output order, (A (n+1, r, in), B (n+1, out, r), scale (n+1,)) for a part some adapter targets,
        else the part's width; rows: ``AdapterRows.rows``; masked: a step of few tokens a row computes every
        adapter's update and keeps each row's (else every step gathers each row's pair); kernel: see above (not
        with masked)."""
        super().__init__()
        targeted = [p for p in parts if not isinstance(p, int)]
        # buffers, not parameters: nothing here trains
        self.register_buffer("rows", rows, persistent=False)  # AdapterRows.rows, shared by every layer
        spans, out, rank = [], 0, 0
        for p in parts:
            if isinstance(p, int):
                spans.append((out, out + p, None))
                out += p
                continue
            a, b, s = p
            j = sum(s_[2] is not None for s_ in spans)
            for key, t in (("A", a), ("B", b), ("scale", s)):  # the stacks as given: shared, not copied
                self.register_buffer(f"{key}{j}", t, persistent=False)
            spans.append((out, out + b.shape[1], (rank, rank + a.shape[1])))
            out, rank = out + b.shape[1], rank + a.shape[1]
        self.spans = tuple(spans)  # (first output, end, rank columns or None) per part
        self.out_features = out
        stack, dtype = targeted[0][0].shape[0], targeted[0][0].dtype
        stack_a = torch.cat([a for a, _, _ in targeted], dim=1) if len(targeted) > 1 else targeted[0][0]
        self.register_buffer("stack_A", stack_a, persistent=False)  # (n+1, R, in); one part's A is not copied
        scale = torch.cat([s[:, None].expand(-1, a.shape[1]) for a, _, s in targeted], dim=1)
        self.register_buffer("stack_scale", scale.float().contiguous(), persistent=False)  # (n+1, R)
        self.masked, self.kernel = masked, kernel
        if kernel:  # the expand kernel's B, its targeted output columns only
            targeted_spans = [s for s in spans if s[2] is not None]
            layout = lora_bgmv.expand_layout(
                [(start, r[0], getattr(self, f"B{j}")) for j, (start, _, r) in enumerate(targeted_spans)]
            )
            for key, t in layout._asdict().items():
                self.register_buffer(f"expand_{key}", t, persistent=False)
        if self.masked:
            # column c of x A_all^T (A_all: stack_A flattened) is adapter c // R's, rank-column c % R
            flat_b = torch.zeros(out, stack, rank, dtype=dtype, device=stack_a.device)
            for j, (start, end, (r0, r1)) in enumerate(s for s in spans if s[2] is not None):
                b, s = getattr(self, f"B{j}"), getattr(self, f"scale{j}")  # scale folded in, rounded once
                flat_b[start:end, :, r0:r1] = (b.float() * s.float()[:, None, None]).to(dtype).transpose(0, 1)
            self.register_buffer("flat_B", flat_b.flatten(1, 2), persistent=False)  # (out, (n+1) R)
            cols = torch.arange(stack, device=stack_a.device).repeat_interleave(rank)
            self.register_buffer("column_adapter", cols, persistent=False)  # ((n+1) R,)

    def parts(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | int]:
        """The ``parts`` this was built from (to place them beside other projections' parts)."""
        out, j = [], 0
        for start, end, ranks in self.spans:
            if ranks is None:
                out.append(end - start)
            else:
                out.append((getattr(self, f"A{j}"), getattr(self, f"B{j}"), getattr(self, f"scale{j}")))
                j += 1
        return out

    def fold_into(self, weight: torch.Tensor, modules: list[nn.Module]) -> torch.Tensor:
        """For ``model.fused``: the fused projection's weight with every adapter's A below its rows, the modules'
        weights re-pointed into it (no memory added), so that one GEMM gives the output and x A_all^T (a kernel
        less a decode step); ``weight`` itself where that does not pay: many adapters, a bias, or A_all more than
        ``FOLD_MAX_SHARE`` of the rows."""
        rows = self.stack_A.shape[0] * self.stack_A.shape[1]
        biased = any(getattr(m, "bias", None) is not None for m in modules)
        if not (self.masked or self.kernel) or biased or rows > FOLD_MAX_SHARE * len(weight):
            return weight
        with torch.no_grad():
            both = torch.cat([weight.detach(), self.stack_A.flatten(0, 1)])
            start = 0
            for m in modules:
                m.weight.data = both[start : start + m.weight.shape[0]]
                start += m.weight.shape[0]
        self.stack_A = both[start:].view(self.stack_A.shape)
        return both

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (the projection of x, (B, T, out) or (B, out)) plus each row's adapter update. A y wider than the
        output brings x A_all^T after it (a weight from ``fold_into``, ``MultiLoRALinear``'s folded one)."""
        if self.uses_kernel(x):
            folded = y.shape[-1] != self.out_features
            layout = lora_bgmv.ExpandLayout(self.expand_b, self.expand_out_col, self.expand_rank0, self.expand_rank_n)
            offset = self.out_features if folded else None
            lora_bgmv.add_lora_update_(y, x, self.rows, self.stack_A, self.stack_scale, layout, offset)
            return y[..., : self.out_features] if folded else y
        low = None
        if y.shape[-1] != self.out_features:
            y, low = y[..., : self.out_features], y[..., self.out_features :]
        if self.uses_masked(x):
            return self._masked(x, y, low)
        return self._gathered(x, y)

    def uses_masked(self, x: torch.Tensor) -> bool:
        """Whether the update of x is computed for every adapter at once (few adapters, few tokens a row)."""
        return self.masked and (x.shape[1] if x.dim() == 3 else 1) <= MASKED_MAX_TOKENS

    def uses_kernel(self, x: torch.Tensor) -> bool:
        """Whether the update of x runs the Triton kernels (``kernel``, few tokens a row)."""
        return self.kernel and (x.shape[1] if x.dim() == 3 else 1) <= lora_bgmv.MAX_TOKENS

    def reads_fold(self, x: torch.Tensor) -> bool:
        """Whether the update of x reads every adapter's x A^T from beside y when a fold put it there."""
        return self.uses_masked(x) or self.uses_kernel(x)

    def _masked(self, x: torch.Tensor, y: torch.Tensor, low: torch.Tensor | None) -> torch.Tensor:
        idx = self.rows[: x.shape[0]].view(-1, *([1] * (x.dim() - 1)))  # (B, 1[, 1]): broadcast over T, columns
        if low is None:  # every adapter's down-projection: (B, [T,] (n+1) R)
            low = F.linear(x, self.stack_A.flatten(0, 1))
        compiled = torch.compiler.is_compiling() and low.numel() <= COMPILED_EXPAND_MAX_ELEMENTS
        if compiled and COMPILED_UPDATE == "own":
            return self._own_update(y, low)
        low = torch.where(idx == self.column_adapter, low, 0)  # a select, not a product: other adapters' inf stays out
        if compiled:
            # a decode step: written as a product and a sum, the compiler makes the select, the up-projection and
            # the add into y one kernel (an extern GEMM would need the select as a kernel of its own)
            return y + (low.unsqueeze(-2) * self.flat_B).sum(-1)
        flat_y = y.reshape(-1, y.shape[-1])
        return torch.addmm(flat_y, low.reshape(-1, low.shape[-1]), self.flat_B.t()).view(y.shape)

    def _own_update(self, y: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        """y + each row's update from x A_all^T (low, (B, [T,] (n+1) R)), written for the compiler: the row's own
        R columns and its adapter's rows of the stacked B (scale folded in) are indexed loads of one fused
        reduction that adds into y, so nothing is gathered into memory and no other adapter's B is read."""
        b, stack, rank = low.shape[0], self.stack_A.shape[0], self.stack_A.shape[1]
        idx = self.rows[:b]
        lead = low.shape[:-1]  # (B[, T])
        pick = idx.view(b, *([1] * len(lead))).expand(*lead, 1)[..., None].expand(*lead, 1, rank)
        own_low = low.reshape(*lead, stack, rank).gather(-2, pick).squeeze(-2)  # (B, [T,] R)
        own_b = self.flat_B.view(-1, stack, rank).transpose(0, 1)[idx]  # (B, out, R): row b's adapter's B
        own_b = own_b.view(b, *([1] * (len(lead) - 1)), *own_b.shape[1:])  # (B, [1,] out, R)
        return y + (own_low.unsqueeze(-2) * own_b).sum(-1)

    def _gathered(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        xs = x.reshape(n, -1, x.shape[-1])  # (B, T, in); the LM head sees (B, in)
        idx = self.rows[:n]
        low = torch.bmm(xs, self.stack_A[idx].transpose(1, 2)) * self.stack_scale[idx].to(x.dtype)[:, None, :]
        pieces, j = [], 0
        for start, end, ranks in self.spans:
            piece = y[..., start:end]
            if ranks is not None:
                b = getattr(self, f"B{j}")[idx]  # (B, out_j, r_j)
                piece = piece + torch.bmm(low[..., ranks[0] : ranks[1]], b.transpose(1, 2)).reshape(piece.shape)
                j += 1
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)


class MultiLoRALinear(nn.Module):
    """A projection plus, per row, the low-rank update of that row's adapter (see the module docstring)."""

    def __init__(
        self,
        base: nn.Module,
        a: torch.Tensor,
        b: torch.Tensor,
        scale: torch.Tensor,
        rows: torch.Tensor,
        masked: bool,
        fold: bool = False,
        kernel: bool = False,
    ):
        """masked, kernel: see ``LowRankDelta``. fold (masked or kernel, no bias, A at most ``FOLD_MAX_SHARE`` of the
        weight's rows): a projection ``model.fused`` never fuses (o, down): A's rows join the weight's in one tensor
        (the weight becomes a view of it: no memory added), so that a decode step's one GEMM gives y and every
        adapter's x A^T (a kernel less); a prefill multiplies by the weight's rows alone."""
        super().__init__()
        self.in_features, self.out_features = base.weight.shape[1], base.weight.shape[0]
        self.weight = base.weight
        self.bias = getattr(base, "bias", None)
        both = None
        small = a.shape[0] * a.shape[1] <= FOLD_MAX_SHARE * self.out_features
        if fold and (masked or kernel) and self.bias is None and small:
            with torch.no_grad():
                both = torch.cat([self.weight.detach(), a.flatten(0, 1)])
                self.weight.data = both[: self.out_features]
            a = both[self.out_features :].view(a.shape)
        self.register_buffer("weight_and_A", both, persistent=False)
        # not named lora_A/lora_B: those mark a trained LoRA layer, which fuse_projections must leave alone;
        # this one gives a fused projection its part of the update (fuse_adapters)
        self.delta = LowRankDelta([(a, b, scale)], rows, masked, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_and_A is not None and self.delta.reads_fold(x):
            return self.delta(x, F.linear(x, self.weight_and_A))
        return self.delta(x, F.linear(x, self.weight, self.bias))

    def fuse_adapters(self, modules: list[nn.Module]) -> LowRankDelta:
        """The update of the fused projection of ``modules`` (this one among them; ``model.fused`` calls it): each
        MultiLoRALinear's parts in its slice of the output, the other modules' slices untouched."""
        parts = []
        for m in modules:
            parts += m.delta.parts() if isinstance(m, MultiLoRALinear) else [m.weight.shape[0]]
        return LowRankDelta(parts, self.delta.rows, self.delta.masked, self.delta.kernel)

    def extra_repr(self) -> str:
        n, r = self.delta.A0.shape[0] - 1, self.delta.A0.shape[1]
        return f"in={self.in_features}, out={self.out_features}, adapters={n}, r_max={r}"


def resolve_update(update: str, device: torch.device, adapters: list[LoRAAdapter]) -> str:
    """What "auto" means for ``adapters`` on ``device``: "kernel" on CUDA with triton when every adapter's rank is
    at most ``lora_bgmv.MAX_RANK`` (on an H200, 0.87x the base model's decode speed with 4 adapters of rank 16,
    against 0.48x masked: ``bench/bench_multi_lora.py``), else "masked" up to ``MASKED_MAX_STACK`` adapters plus the
    base, else "gathered". Any other choice is returned as given."""
    if update != "auto":
        return update
    rank = max((a.shape[0] for adapter in adapters for a, _ in adapter.weights.values()), default=0)
    if device.type == "cuda" and lora_bgmv.kernel_available(device) and rank <= lora_bgmv.MAX_RANK:
        return "kernel"
    return "masked" if len(adapters) + 1 <= MASKED_MAX_STACK else "gathered"


def attach_adapters(model: nn.Module, adapters: list[LoRAAdapter], num_slots: int, update: str = "auto") -> AdapterRows:
    """Wrap every module some adapter targets in a ``MultiLoRALinear`` (in place; call before building the
    runner) and return the per-slot adapter table. Adapter i (1-based) is ``adapters[i - 1]``. update: how a
    decode step computes the rows' updates, "masked" (every adapter's, each row keeping its own; see
    ``LowRankDelta``), "gathered" (each row's pair gathered), "kernel" (the Triton kernels of
    ``kernels.lora_bgmv``, each row's own adapter; CUDA, or CPU under TRITON_INTERPRET=1) or "auto" (see
    ``resolve_update``); a prefill always gathers."""
    if update not in UPDATES:
        raise ValueError(f"update must be one of {', '.join(UPDATES)}, got {update!r}")
    weight = next(model.parameters())
    if update == "kernel" and not lora_bgmv.kernel_available(weight.device):
        raise ValueError(
            f"lora_update='kernel' runs Triton kernels: the model is on {weight.device}, not CUDA (on CPU set "
            "TRITON_INTERPRET=1 with triton installed, for tests); use lora_update='auto'"
        )
    update = resolve_update(update, weight.device, adapters)
    if any(isinstance(m, MultiLoRALinear) for m in model.modules()):
        raise ValueError("the model already serves LoRA adapters; attach every adapter in one call")
    if any(hasattr(m, "lora_A") for m in model.modules()):
        raise ValueError("the model carries trained LoRA layers; merge them (cookmind.model.lora.merged_copy) first")
    names = [a.name for a in adapters]
    if len(set(names)) != len(names):
        raise ValueError(f"adapter names must be unique, got {names}")
    masked = update == "masked"
    table = AdapterRows(names, num_slots, weight.device)
    modules = sorted({m for a in adapters for m in a.weights})
    for name in modules:
        base = model.get_submodule(name)
        w = base.weight
        pairs = [a.weights.get(name) for a in adapters]
        r_max = max(p[0].shape[0] for p in pairs if p is not None)
        stack_a = torch.zeros(len(adapters) + 1, r_max, w.shape[1], dtype=w.dtype, device=w.device)
        stack_b = torch.zeros(len(adapters) + 1, w.shape[0], r_max, dtype=w.dtype, device=w.device)
        scale = torch.zeros(len(adapters) + 1, dtype=torch.float32, device=w.device)
        for i, (adapter, pair) in enumerate(zip(adapters, pairs), start=1):
            if pair is not None:
                a, b = pair
                stack_a[i, : a.shape[0]] = a.to(w.dtype)
                stack_b[i, :, : b.shape[1]] = b.to(w.dtype)
                scale[i] = adapter.scaling
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        fold = child not in FUSED_PROJECTIONS
        wrapped = MultiLoRALinear(base, stack_a, stack_b, scale, table.rows, masked, fold, update == "kernel")
        setattr(parent, child, wrapped)
    return table
