"""The pre-norm Transformer block."""

from __future__ import annotations

import math

import torch
from torch import nn

from cookmind.model.attention import Attention
from cookmind.model.moe import MoE
from cookmind.model.rmsnorm import RMSNorm
from cookmind.model.swiglu import SwiGLU


class Block(nn.Module):
    """h = x + Attn(RMSNorm(x)); y = h + FFN(RMSNorm(h)). Names match HF decoder layers."""

    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        # residual-branch outputs start smaller so the residual stream's variance stays O(1) with depth (GPT-2)
        out_std = cfg.initializer_range / math.sqrt(2 * cfg.num_hidden_layers)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx, out_std=out_std)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.num_experts > 0:
            self.mlp = MoE(cfg, out_std=out_std)
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.initializer_range, out_std)
        self.is_moe = cfg.num_experts > 0

    # The serving engine's entry (infer/runner.py): the layer in two halves around attention over its own KV
    # cache. forward below is the same computation with the attention in between.
    def attention_inputs(
        self,
        x: torch.Tensor,
        qkv_weight: torch.Tensor | None = None,
        qkv_bias: torch.Tensor | None = None,
        qkv_delta=None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, T, heads, D) of RMSNorm(x), QK-normed, not yet rotated (see Attention.project_qkv)."""
        return self.self_attn.project_qkv(self.input_layernorm(x), qkv_weight, qkv_bias, qkv_delta)

    def after_attention(
        self, x: torch.Tensor, attn_out: torch.Tensor, gate_up_weight: torch.Tensor | None = None, gate_up_delta=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, f): h = x + o_proj(attention output (B, T, heads * D)), f = FFN(RMSNorm(h)) without the MoE balance
        loss; the layer's output is h + f (the engine may defer that add into the next layer).
        gate_up_weight: a dense FFN's fused [W_gate; W_up] (``model.fused.fuse_projections``), gate_up_delta its
        rows' LoRA updates."""
        h = x + self.self_attn.o_proj(attn_out)
        normed = self.post_attention_layernorm(h)
        return h, (self.mlp(normed)[0] if self.is_moe else self.mlp(normed, gate_up_weight, gate_up_delta))

    def forward(self, x, cos, sin, attention_mask=None, kv_cache=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (hidden states, MoE balance loss or None)."""
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, attention_mask, kv_cache)
        if self.is_moe:
            ffn, aux = self.mlp(self.post_attention_layernorm(h))
            return h + ffn, aux
        return h + self.mlp(self.post_attention_layernorm(h)), None
