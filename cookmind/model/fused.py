"""Fast paths beside the readable math: one switch, and one matmul for several projections of the same input.

The readable model computes q_proj(x), k_proj(x), v_proj(x) (and gate_proj(x), up_proj(x)) as separate
matmuls. Concatenating their weights gives one wider matmul with the same columns,
x [W_q; W_k; W_v]^T = [x W_q^T, x W_k^T, x W_v^T]: the input is read once, the GPU gets one large GEMM
instead of three small ones, and the backward's dX is one GEMM instead of three plus a sum. The weights stay
separate parameters, so names, checkpoints, HF export and LoRA (which swaps the modules) are untouched.
tests/test_model_fast.py checks every fast path equals the readable one.

Off by default: on the H200 (2026-11-29, bench/bench_train.py --device cuda --variants fast) the Trainer
with these paths on ran at 418.2k tokens/s against 417.5k with them off in the same run: no measurable gain
once torch.compile has fused the step, so the readable paths stay the default.
"""

from __future__ import annotations

import torch

from cookmind.model.linear import Linear

_enabled = False  # see the module docstring: not yet shown faster on the GPU


def fast_paths_enabled() -> bool:
    """Whether the model uses its fast paths (default False); the readable paths otherwise."""
    return _enabled


def set_fast_paths(enabled: bool) -> None:
    """Turn the model's fast paths on or off (for tests and before/after benchmarks). Process-wide."""
    global _enabled
    _enabled = bool(enabled)


def fused_linear(x: torch.Tensor, layers: list) -> list[torch.Tensor] | None:
    """[layer(x) for layer in layers] as one matmul, or None when the fast path does not apply.

    Applies only to plain cookmind Linear layers (a LoRA-wrapped or other module keeps its own forward),
    all with a bias or all without.
    """
    if not _enabled or any(type(layer) is not Linear for layer in layers):
        return None
    has_bias = [layer.bias is not None for layer in layers]
    if any(has_bias) and not all(has_bias):
        return None
    w = torch.cat([layer.weight for layer in layers])  # (sum out, in): the rows of each weight in turn
    y = x @ w.t()  # (..., sum out); same formula as Linear.forward
    if all(has_bias):
        y = y + torch.cat([layer.bias for layer in layers])
    return list(y.split([layer.out_features for layer in layers], dim=-1))
