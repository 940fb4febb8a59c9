"""Causal grouped-query self-attention with RoPE, optional QK-norm, KV cache and four backends."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from cookmind.model.linear import Linear
from cookmind.model.rmsnorm import RMSNorm
from cookmind.model.rope import apply_rope
from cookmind.model.sdpa import causal_mask, scaled_dot_product_attention


class Attention(nn.Module):
    """Multi-head attention; n_kv_heads groups of n_heads / n_kv_heads query heads share one key/value head.

    Names match HF Llama/Qwen3: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm.
    """

    def __init__(self, cfg, layer_idx: int, out_std: float | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.resolved_head_dim
        self.backend = cfg.attn_backend
        std, bias = cfg.initializer_range, cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias, std=std)
        self.k_proj = Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=bias, std=std)
        self.v_proj = Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=bias, std=std)
        self.o_proj = Linear(self.n_heads * self.head_dim, cfg.hidden_size, std=std if out_std is None else out_std)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's vector before RoPE keeps logits bounded
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project_qkv(
        self,
        x: torch.Tensor,
        qkv_weight: torch.Tensor | None = None,
        qkv_bias: torch.Tensor | None = None,
        qkv_delta=None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, T, heads, D), k and v (B, T, kv heads, D) of x (B, T, C), QK-normed, not yet rotated.

        The entry the serving engine shares with ``forward``: through the projection modules (LoRA-wrapped
        ones too), or one GEMM with ``qkv_weight`` = [W_q; W_k; W_v] from ``model.fused.fuse_projections``,
        whose ``qkv_delta`` (x, qkv) -> qkv adds the rows' LoRA adapter updates when it has one.
        """
        b, t, _ = x.shape
        if qkv_weight is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            nq, nkv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            qkv = F.linear(x, qkv_weight, qkv_bias)
            if qkv_delta is not None:
                qkv = qkv_delta(x, qkv)
            q, k, v = qkv[..., :nq], qkv[..., nq : nq + nkv], qkv[..., nq + nkv :]
        q = q.reshape(b, t, self.n_heads, self.head_dim)
        k = k.reshape(b, t, self.n_kv_heads, self.head_dim)
        v = v.reshape(b, t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:  # QK-norm: per head, over head_dim
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        kv_cache=None,
    ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). attention_mask: bool (B, 1, T, S), True = may attend; else causal."""
        b, t, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        start = 0
        if kv_cache is not None:
            start = kv_cache.seq_len
            kv_len = attention_mask.shape[-1] if attention_mask is not None else None
            k, v = kv_cache.update(self.layer_idx, k, v, kv_len)

        if self.backend == "naive":
            y = self._naive(q, k, v, attention_mask, start)
        elif self.backend == "flash-triton" and attention_mask is None and start == 0:
            y = _flash_triton(q, k, v)
        else:  # "sdpa", and flash-triton's cached / masked calls (the kernel is for training shapes)
            y = self._sdpa(q, k, v, attention_mask, start)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    def _naive(self, q, k, v, mask, start):
        b, h, t, d = q.shape
        s = k.shape[2]
        if mask is None:
            mask = causal_mask(t, s, offset=start, device=q.device)  # (T, S)
        elif mask.dim() == 4:
            mask = mask.unsqueeze(2)  # (B, 1, T, S) -> (B, 1, 1, T, S) over (B, Hkv, G, T, S)
        g = h // self.n_kv_heads
        q = q.view(b, self.n_kv_heads, g, t, d)  # query heads grouped under their shared kv head
        y = scaled_dot_product_attention(q, k.unsqueeze(2), v.unsqueeze(2), mask)
        return y.reshape(b, h, t, d)

    def _sdpa(self, q, k, v, mask, start):
        t, s = q.shape[2], k.shape[2]
        gqa = self.n_heads != self.n_kv_heads
        if mask is None and start == 0 and s == t:
            # plain causal: is_causal lets PyTorch pick its flash kernel (or cuDNN's first, backend "cudnn")
            if self.backend == "cudnn":
                with sdpa_kernel(_CUDNN_FIRST, set_priority=True):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if mask is None and t == 1:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)  # one new token sees every key
        if mask is None:
            mask = causal_mask(t, s, offset=start, device=q.device)
        if gqa:  # the masked kernels do not all take enable_gqa; expand kv heads instead
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# backend "cudnn": SDPA tries cuDNN's fused attention first (faster than the flash backend on Hopper,
# docs/BENCHMARKS.md "Attention"), then PyTorch's usual order for calls cuDNN cannot take (CPU, unsupported shapes)
_CUDNN_FIRST = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _flash_triton(q, k, v):
    if not q.is_cuda:
        raise RuntimeError("attn_backend='flash-triton' needs a CUDA device; use 'sdpa' or 'naive' on CPU")
    from cookmind.kernels import FlashAttentionTriton  # raises a clear error itself where Triton is missing

    return FlashAttentionTriton.apply(q, k, v, True)
