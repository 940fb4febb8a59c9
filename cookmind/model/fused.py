"""Fused projection weights for serving.

q_proj(x), k_proj(x), v_proj(x) (and gate_proj(x), up_proj(x)) read the same input; with
their weights stacked, x [W_q; W_k; W_v]^T = [x W_q^T, x W_k^T, x W_v^T] is one wider GEMM. ``fuse_projections``
stacks them without adding memory: it moves each layer's weights into one tensor and re-points every module's
weight at its rows of it, so the modules compute exactly what they did (names, checkpoints, HF export
unchanged) and ``Attention.project_qkv`` / ``SwiGLU.forward`` take the fused tensor for one GEMM. The serving
engine fuses the model it serves (a decode step at batch 1 is many small GEMMs). Training does not fuse: on the
H200 (2026-11-29, bench/bench_train.py --device cuda --variants fast, before that variant went) the Trainer with a
fused QKV / gate-up
GEMM ran at 418.2k tokens/s against 417.5k without it, in the same run: nothing once torch.compile has fused
the step, so that training path went away. Measured again at #18's shapes (H200, 2026-12-01): the GEMMs alone
gain over weights stored stacked (``bench/probe_fused_proj.py``, forward and backward at 16384 rows: QKV 1.10x
at 1.3B and 1.21x at Qwen3-0.6B, gate/up 1.06x and 1.07x; concatenating the weights each step eats it), but a
training path that keeps the parameters as views of the stacks (branch ``fusetrain``: a custom autograd function,
one GEMM forward, dx and one stacked weight gradient backward) made the Trainer slower (``bench_train.py
--batch 8``: 1.3B 66.2k against 66.4k tokens/s, and 65.7k against 66.9k with master weights and the CUDA graph;
Qwen3-0.6B 104.2k against 106.8k, 101.9k against 102.3k; the pairs with the graph timed its capture, as every
``--warmup 3`` graph figure before b23ff35 did, so only the pairs without it are clean, and they say the same).
A model under training keeps its weights' storage (an optimizer or DDP may hold it), so rollouts serve it
unfused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class FusedWeights:
    """One layer's fused projections: [W_q; W_k; W_v] (and its bias) and [W_gate; W_up]; None where the layer's
    modules cannot share one GEMM (a trained LoRA layer, mixed biases, an MoE feed-forward). ``qkv_delta`` /
    ``gate_up_delta``: where the parts serve LoRA adapters per row (``infer.multi_lora``), a callable
    (x, fused output) -> fused output plus each row's update in its parts' slices; else None. With one, the fused
    weight may carry rows past the parts' (``LowRankDelta.fold_into``), which the callable strips."""

    qkv: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    gate_up: torch.Tensor | None = None
    qkv_delta: Callable | None = None
    gate_up_delta: Callable | None = None


def fuse_projections(model) -> list[FusedWeights]:
    """Each decoder layer's fused projection weights (see the module docstring); the modules' weights become
    views into them. Fusing a model twice shares the first fusion's memory (a copy would go stale)."""
    out = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_parts = [attn.q_proj, attn.k_proj, attn.v_proj]
        qkv, qkv_bias = _fuse_rows(qkv_parts)
        gate_up = gate_up_delta = None
        if (
            all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))
            and getattr(mlp.gate_proj, "bias", None) is None
        ):
            gate_up, _ = _fuse_rows([mlp.gate_proj, mlp.up_proj])
            gate_up_delta = None if gate_up is None else _adapters_of([mlp.gate_proj, mlp.up_proj])
            if gate_up_delta is not None:  # every adapter's A joins the GEMM where that pays
                gate_up = gate_up_delta.fold_into(gate_up, [mlp.gate_proj, mlp.up_proj])
        qkv_delta = None if qkv is None else _adapters_of(qkv_parts)
        if qkv_delta is not None:
            qkv = qkv_delta.fold_into(qkv, qkv_parts)
        out.append(FusedWeights(qkv, qkv_bias, gate_up, qkv_delta, gate_up_delta))
    return out


def _adapters_of(modules) -> Callable | None:
    """The per-row LoRA update of the fused projection of `modules` when some of them serve adapters
    (``infer.multi_lora.MultiLoRALinear.fuse_adapters``), else None."""
    carrier = next((m for m in modules if hasattr(m, "fuse_adapters")), None)
    return None if carrier is None else carrier.fuse_adapters(modules)


def _fuse_rows(modules) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Stack the modules' weights (and biases) into one tensor each and re-point every module's weight at its
    rows of it: no memory is added, and the Parameters keep their identity. (None, None) when they cannot share
    one GEMM (not plain linear weights, a trained LoRA layer, mixed biases, dtypes or widths). Modules that serve
    adapters per row (``fuse_adapters``) fuse: their update is the fused projection's ``_adapters_of``."""
    weights = [getattr(m, "weight", None) for m in modules]
    biases = [getattr(m, "bias", None) for m in modules]
    if any(w is None or w.dim() != 2 for w in weights) or len({(w.dtype, w.device, w.shape[1]) for w in weights}) > 1:
        return None, None
    if any(hasattr(m, "lora_A") for m in modules) or len({b is None for b in biases}) > 1:
        return None, None
    fused = _rows_in_place([w.detach() for w in weights])
    if fused is not None:  # fused already: share that memory
        fused_bias = None if biases[0] is None else _rows_in_place([b.detach() for b in biases])
        if biases[0] is None or fused_bias is not None:
            return fused, fused_bias
    with torch.no_grad():
        fused = torch.cat([w.detach() for w in weights])
        fused_bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        start = 0
        for w, b in zip(weights, biases):
            n = w.shape[0]
            w.data = fused[start : start + n]
            if b is not None:
                b.data = fused_bias[start : start + n]
            start += n
    return fused, fused_bias


def _rows_in_place(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """One tensor over the memory of `parts` when they already lie back to back in one storage (in order,
    contiguous), else None."""
    first = parts[0]
    storage, offset = first.untyped_storage(), first.storage_offset()
    rows = 0
    for p in parts:
        if (
            p.untyped_storage().data_ptr() != storage.data_ptr()
            or not p.is_contiguous()
            or p.storage_offset() != offset + rows * (p[0].numel() if p.dim() > 1 else 1)
        ):
            return None
        rows += p.shape[0]
    shape = (rows, *first.shape[1:])
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(
        storage, offset, shape, torch.empty(shape, device="meta").stride()
    )
