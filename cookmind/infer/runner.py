"""ModelRunner: the forward pass of a CookMindLM over a slot KV cache, for serving.

It reuses the model's own modules (embedding, norms, projections, MLP, RoPE math) and only
changes where keys and values live: each request's slot in a ``SlotKVCache``, at its own
positions. That lets one decode step serve requests of different lengths, lets a finished
request leave without touching the others, and keeps every shape static for CUDA graphs.
Tests check its logits against the model's plain forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cookmind.infer.slot_cache import SlotKVCache
from cookmind.model.rope import apply_rope


class ModelRunner:
    """Prefill one slot or decode a contiguous run of slots; returns float32 logits."""

    def __init__(self, model, num_slots: int, max_seq_len: int | None = None, device=None, dtype=None):
        cfg = model.config
        self.model = model.eval()
        self.config = cfg
        param = next(model.parameters())
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = dtype or param.dtype
        self.max_seq_len = int(max_seq_len or cfg.max_position_embeddings)
        inner = model.model
        self.embed, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.lm_head_weight = model.lm_head.weight  # the embedding itself when tied
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.resolved_head_dim
        self.rope = inner.rotary_emb  # the model's own cos/sin (YaRN included)
        # one extra column: rows that only fill a batch (padding, idle slots) write there, never read
        self.scratch_col = self.max_seq_len
        self.cache = SlotKVCache(len(self.layers), num_slots, self.n_kv, self.max_seq_len + 1, self.head_dim,
                                 self.device, self.dtype)

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slot_start: int, attn_len: int,
                last_only: bool = True, write_cols: torch.Tensor | None = None,
                last_index: torch.Tensor | None = None) -> torch.Tensor:
        """tokens, positions: (B, T) for slots slot_start.. slot_start+B-1; each row attends to its
        slot's columns 0..position. Writes the new keys/values at write_cols (default: positions;
        padding rows pass ``scratch_col``). Returns logits (B, V) of each row's last token (or of
        ``last_index`` (B,)), or (B, T, V) when last_only is False."""
        b, t = tokens.shape
        write_cols = positions if write_cols is None else write_cols
        h = self.embed(tokens)
        cos, sin = self.rope(positions, h.dtype)
        cols = torch.arange(attn_len, device=tokens.device)
        mask = (cols[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, L): causal per slot
        for i, layer in enumerate(self.layers):
            h = h + self._attention(layer.self_attn, layer.input_layernorm(h), cos, sin, write_cols, mask,
                                    i, slot_start, attn_len)
            h = h + self._mlp(layer.mlp, layer.post_attention_layernorm(h))
        if last_only:
            h = h[:, -1] if last_index is None else h[torch.arange(b, device=h.device), last_index]
        h = self.norm(h)
        return (h @ self.lm_head_weight.t()).float()

    def _attention(self, attn, x, cos, sin, write_cols, mask, layer_idx, slot_start, attn_len):
        b, t, _ = x.shape
        q = _linear(attn.q_proj, x).view(b, t, self.n_heads, self.head_dim)
        k = _linear(attn.k_proj, x).view(b, t, self.n_kv, self.head_dim)
        v = _linear(attn.v_proj, x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)  # QK-norm: per head, over head_dim
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
        self.cache.write(layer_idx, slot_start, write_cols, k, v)
        keys, values = self.cache.view(layer_idx, slot_start, b, attn_len)
        group = self.n_heads // self.n_kv
        if t == 1 and group > 1:
            # decode with grouped-query attention: the group's heads become G queries of one kv head
            q = q.reshape(b, self.n_kv, group, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, Hkv, G, D)
            out = out.reshape(b, self.n_heads, 1, self.head_dim)
        else:
            if group > 1:
                keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return _linear(attn.o_proj, out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    @staticmethod
    def _mlp(mlp, x):
        if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            # SwiGLU: W_down (silu(W_gate x) * W_up x)
            return _linear(mlp.down_proj, F.silu(_linear(mlp.gate_proj, x)) * _linear(mlp.up_proj, x))
        out = mlp(x)  # mixture of experts: (output, aux loss)
        return out[0] if isinstance(out, tuple) else out


def _linear(module, x):
    """y = x W^T (+ b) with the module's own weights, through F.linear (one fused GEMM call)."""
    return F.linear(x, module.weight, getattr(module, "bias", None))
