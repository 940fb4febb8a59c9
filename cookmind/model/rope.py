"""Rotary position embedding (RoPE) with explicit positions, in Hugging Face's rotate-half layout, and YaRN.

Each head vector x of width D is split into halves (x1, x2); pair i = (x1[i], x2[i]) is rotated by angle
pos * inv_freq[i], inv_freq[i] = theta^(-2i/D). This "rotate-half" pairing is the one HF Llama/Qwen use, so
q_proj/k_proj weights copy across with no permutation.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    """inv_freq[i] = theta^(-2i/dim), i = 0..dim/2-1."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def yarn_inv_freq(dim: int, theta: float, rs: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies by 1/factor, keep high ones, ramp between.

    A dimension pair that turns fewer than beta_slow times over the original context is interpolated
    (divided by factor); more than beta_fast times, extrapolated (kept). Returns (inv_freq, attention_factor),
    where attention_factor = 0.1 ln(factor) + 1 scales cos/sin (so q.k scales by its square: the paper's
    temperature sqrt(1/t)).
    """
    factor = float(rs["factor"])
    orig = int(rs["original_max_position_embeddings"])
    beta_fast = float(rs.get("beta_fast") or 32)
    beta_slow = float(rs.get("beta_slow") or 1)
    truncate = bool(rs.get("truncate", True))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            attention_factor = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    # dimension index d whose wavelength turns `rotations` times over the original context:
    # orig / (2 pi theta^(2d/dim)) = rotations  ->  d = dim ln(orig / (2 pi rotations)) / (2 ln theta)
    def dim_for(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 0 = keep, 1 = interp
    extrap = default_inv_freq(dim, theta)
    interp = extrap / factor
    inv_freq = extrap * (1 - ramp) + interp * ramp
    return inv_freq, float(attention_factor)


def llama3_inv_freq(dim: int, theta: float, rs: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: wavelengths shorter than orig/high_freq_factor are kept, longer than
    orig/low_freq_factor divided by factor, and those between blended linearly in orig/wavelength."""
    factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    orig = float(rs["original_max_position_embeddings"])
    inv_freq = default_inv_freq(dim, theta)
    wavelen = 2 * math.pi / inv_freq
    smooth = ((orig / wavelen - low) / (high - low)).clamp(0, 1)  # 0 -> fully scaled, 1 -> kept
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def rope_inv_freq(head_dim: int, theta: float, rope_scaling: dict[str, Any] | None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_factor) for a config's rope_scaling (None = plain RoPE)."""
    rs = rope_scaling or {}
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type == "default":
        return default_inv_freq(head_dim, theta), 1.0
    if rope_type == "linear":  # position interpolation: pos / factor
        return default_inv_freq(head_dim, theta) / float(rs["factor"]), 1.0
    if rope_type == "llama3":
        return llama3_inv_freq(head_dim, theta, rs), 1.0
    if rope_type == "yarn":
        return yarn_inv_freq(head_dim, theta, rs)
    raise ValueError(f"RotaryEmbedding: unsupported rope_type {rope_type!r} (supported: default, linear, llama3, yarn)")


class RotaryEmbedding(nn.Module):
    """Produces cos/sin for explicit positions: position_ids (B, T) -> cos, sin (B, T, D).

    With ``max_positions``, cos/sin of positions 0..max_positions-1 are also kept as fp32 tables (derived,
    unsaved buffers) that ``prefix`` slices for the common case of consecutive positions. Under
    torch.compile this matters: inductor fuses a cos/sin computed in the forward into every kernel that
    reads it, so each layer's RoPE (forward and backward, q and k) recomputed two transcendentals per
    element; on the H200 GPT-2-small step that was 1.3 ms of 25.8. A table slice is a plain load.
    """

    TABLE_LIMIT = 1 << 22  # elements per table (16 MB in fp32: 32k positions at D=128); past it, computed per call

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
        max_positions: int | None = None,
    ):
        super().__init__()
        # built on the meta device (a model about to be loaded), computed on the CPU instead: meta arithmetic goes
        # through torch's reference ops, which import the compiler (~2 s of an inference command's start)
        on_meta = torch.get_default_device().type == "meta"
        with torch.device("cpu") if on_meta else contextlib.nullcontext():
            inv_freq, self.attention_factor = rope_inv_freq(head_dim, theta, rope_scaling)
            self.register_buffer("inv_freq", inv_freq, persistent=False)  # derived from config, never saved
            cos = sin = None
            if max_positions and max_positions * head_dim <= self.TABLE_LIMIT:
                cos, sin = (x[0] for x in self._compute(torch.arange(max_positions)[None], torch.float32))
        self.register_buffer("cos_table", cos, persistent=False)  # (max_positions, D), or None
        self.register_buffer("sin_table", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) casts every floating buffer with the weights. These stay fp32, moved but not cast: a
        # bf16 inv_freq is off by up to 2^-9 of itself, which puts the angle of position 2000 up to 2.4 radians
        # off (at head_dim 128, theta 1e4). Outputs are cast to the compute dtype where they are used.
        kept = {n: b for n, b in self._buffers.items() if b is not None and b.dtype == torch.float32}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if after.dtype != torch.float32:
                self._buffers[name] = before.to(after.device)
        return self

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B, T, D) of each position's angles, scaled by the attention factor, in `dtype`."""
        return self._compute(position_ids, dtype)

    def prefix(
        self, start: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (1, length, D) of positions start..start+length-1: from the tables when they cover
        them, else computed as ``forward`` does."""
        table = self.cos_table
        if table is not None and table.dtype == torch.float32 and start + length <= table.shape[0]:
            end = start + length
            return self.cos_table[None, start:end].to(dtype), self.sin_table[None, start:end].to(dtype)
        return self._compute(torch.arange(start, start + length, device=device)[None], dtype)

    def _compute(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # angle[b, t, i] = pos[b, t] * inv_freq[i], in fp32: bf16 positions lose integer precision past 256
        angles = position_ids.float()[..., None] * self.inv_freq.float()
        emb = torch.cat((angles, angles), dim=-1)  # rotate-half layout: the same angle for i and i + D/2
        cos, sin = emb.cos() * self.attention_factor, emb.sin() * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim's halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by per-position angles: x cos + rotate_half(x) sin; cos/sin (B, T, D)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
    return x * cos + rotate_half(x) * sin
