"""ModelRunner: the forward pass of a CookMindLM over a serving KV cache (slots or paged blocks).

It runs the model's own code: the embedding, each layer's ``Block.attention_inputs`` and
``Block.after_attention`` (norms, projections, FFN; LoRA-wrapped projections included), the RoPE
tables and ``apply_rope``, the final norm and LM head. It only changes where keys and values
live: each request's row of a ``SlotKVCache`` (a slot of the whole context) or of a
``PagedKVCache`` (blocks found through the row's block table), at its own positions. That lets
one decode step serve requests of different lengths, lets a finished request leave without
touching the others, and keeps every shape static for CUDA graphs.
Tests check its logits against the model's plain forward.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.fx.experimental import _config as fx_config

from cookmind.infer.paged_cache import PagedKVCache
from cookmind.infer.slot_cache import SlotKVCache
from cookmind.kernels.paged_decode import kernel_available, paged_decode_attention, self_check
from cookmind.model.fused import fuse_projections as fuse_projections_of
from cookmind.model.rope import apply_rope

DECODE_ATTENTION = ("auto", "kernel", "gather")


class ModelRunner:
    """Prefill or decode a contiguous run of rows (slots); returns float32 logits.

    kv_cache="slots": every row owns max_seq_len columns. kv_cache="paged": rows own blocks of
    block_size positions from a pool of num_blocks (see paged_cache.py); the caller assigns them.

    decode_attention (paged cache, one new token per row): "kernel" runs each layer as two fused
    halves around ``paged_decode_attention``, which applies RoPE, stores the new key/value and
    attends over the rows' blocks in place (the Triton kernel on CUDA, its PyTorch twin elsewhere);
    the halves use one QKV and one gate/up projection (``model.fused.fuse_projections``: the model's
    weights become views into them; fuse_projections=False keeps separate GEMMs and leaves the weights
    alone), and each
    layer's last residual add joins the next layer's norm. "gather" copies the
    rows' keys into a contiguous tensor and runs SDPA under a length mask, as prefill does.
    "auto": "kernel" where the Triton kernel runs (CUDA, a power-of-two head dim of 16..256) and
    passes a self-check against its reference on this device, else "gather".

    adapters (``multi_lora.AdapterRows``): the model serves LoRA adapters per row (``multi_lora.attach_adapters``,
    done before this runner fuses the projections: a fused projection carries its parts' adapters, each added into
    its slice of the one GEMM's output); each forward selects its rows' adapters first.

    With "kernel", forwards of 2..KERNEL_MAX_TOKENS tokens per row (speculative decoding's verify step, a draft
    model's feed, short prefill chunks) use the kernel too, one query per token (``kernel_reads``).
    """

    # the most tokens per row a forward sends through the decode kernel: a verify step (k + 1) and short chunks
    KERNEL_MAX_TOKENS = 16

    def __init__(
        self,
        model,
        num_slots: int,
        max_seq_len: int | None = None,
        device=None,
        dtype=None,
        kv_cache: str = "slots",
        num_blocks: int | None = None,
        block_size: int = 16,
        decode_attention: str = "auto",
        fuse_projections: bool = True,
        adapters=None,
    ):
        cfg = model.config
        self.model = model.eval()
        self.config = cfg
        param = next(model.parameters())
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = dtype or param.dtype
        self.max_seq_len = int(max_seq_len or cfg.max_position_embeddings)
        inner = model.model
        self.embed, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.lm_head = model.lm_head  # its weight is the embedding itself when tied
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.resolved_head_dim
        self.rope = inner.rotary_emb  # the model's own cos/sin (YaRN included)
        # one extra column: rows that only fill a batch (padding, idle slots) write there, never read
        self.scratch_col = self.max_seq_len
        if kv_cache == "slots":
            self.cache = SlotKVCache(
                len(self.layers), num_slots, self.n_kv, self.max_seq_len + 1, self.head_dim, self.device, self.dtype
            )
        elif kv_cache == "paged":
            if num_blocks is None:
                raise ValueError("kv_cache='paged' needs num_blocks (see paged_cache.blocks_for_budget)")
            self.cache = PagedKVCache(
                len(self.layers),
                num_blocks,
                block_size,
                self.n_kv,
                self.head_dim,
                num_slots,
                self.max_seq_len,
                self.device,
                self.dtype,
            )
        else:
            raise ValueError(f"kv_cache must be 'slots' or 'paged', got {kv_cache!r}")
        self.paged = kv_cache == "paged"
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {', '.join(DECODE_ATTENTION)}, got {decode_attention!r}")
        requested = decode_attention
        if decode_attention == "auto":
            decode_attention = "kernel" if self.paged and kernel_available(self.device, self.head_dim) else "gather"
        if decode_attention == "kernel" and not self.paged:
            raise ValueError("decode_attention='kernel' reads paged blocks: it needs kv_cache='paged'")
        if (
            decode_attention == "kernel"
            and self.device.type == "cuda"
            and not kernel_available(self.device, self.head_dim)
        ):
            # the PyTorch reference it would fall back to reads lengths on the host: no CUDA graph can hold it
            raise ValueError(
                f"decode_attention='kernel': the paged decode kernel takes a power-of-two head dim from 16 to 256 "
                f"(with triton installed); this model's is {self.head_dim}; use decode_attention='auto'"
            )
        if decode_attention == "kernel" and kernel_available(self.device, self.head_dim):
            problem = self_check(self.device, self.dtype, self.n_heads, self.n_kv, self.head_dim, block_size)
            if problem is not None and requested == "kernel":
                raise RuntimeError(f"the paged decode kernel failed its self-check on {self.device}: {problem}")
            if problem is not None:  # auto: serve correctly on the slower path rather than not at all
                warnings.warn(
                    f"the paged decode kernel failed its self-check ({problem}); decoding with "
                    "decode_attention='gather'",
                    stacklevel=2,
                )
                decode_attention = "gather"
        self.decode_attention = decode_attention
        self.adapters = adapters  # multi_lora.AdapterRows when the model serves LoRA adapters per row
        self.fused = None
        if decode_attention == "kernel" and fuse_projections:  # False: a model under training keeps its storage
            self.fused = fuse_projections_of(model)
        self.compiled = False
        self.compile_attention = False
        self._layer_fn, self._pre_fn, self._post_fn, self._head_fn = self._layer, self._pre, self._post, self._head
        self._dpre_fn, self._dpost_fn = self._decode_pre, self._decode_post
        self.compile_error: str | None = None

    def kernel_reads(self, tokens: int) -> bool:
        """Whether a forward of ``tokens`` new tokens per row attends through the paged decode kernel (reading each
        row's blocks in place, any length: one CUDA graph serves all) rather than gathering keys for SDPA: with the
        kernel, for up to KERNEL_MAX_TOKENS tokens (a decode step, a verify step of speculative decoding, a short
        prefill). Each token is a query of its own that reads its row's whole prefix, so long prompts gather."""
        return self.decode_attention == "kernel" and tokens <= self.KERNEL_MAX_TOKENS

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots

    def set_compiled(self, enabled: bool, attention: bool = False) -> None:
        """Run the decoder layers through torch.compile: inductor fuses the norms, projections' neighbours,
        RoPE, SwiGLU's gate and the residual adds. Every layer has the same code and shapes, so one
        compiled function serves them all: compile time is one layer's, not the model's. dynamic: batch,
        length and positions vary without recompiling (sizes 1 get their own specialisation).

        attention=False (default): the cache write, the cache read and SDPA between the two compiled
        halves of a layer stay eager. On the H200 (bench_decode, 2026-11-29) attention inside the
        compiled graph made a batch-64 step slower than the whole eager step (1.82 vs 1.63 ms at
        length 256), while compiling the rest took batch 1 from 1.30 to 0.77 ms; attention=True is
        kept for that comparison."""
        self.compiled = bool(enabled)
        self.compile_attention = bool(attention)
        if enabled:  # a few specialisations per runner (prefill/decode, batch 1/more, each cache layout);
            # past dynamo's limit (8) it would silently run the layer uncompiled
            import torch._dynamo  # here, not at the top: importing the compiler costs a CLI's start ~2 s

            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # older torch
            setattr(cfg, name, max(getattr(cfg, name), 64))

        def fast(fn):
            return torch.compile(fn, dynamic=True) if enabled else fn

        self._layer_fn, self._pre_fn, self._post_fn = fast(self._layer), fast(self._pre), fast(self._post)
        self._head_fn = fast(self._head)
        self._dpre_fn, self._dpost_fn = fast(self._decode_pre), fast(self._decode_post)

    @torch.inference_mode()
    def forward(self, *args, **kwargs) -> torch.Tensor:
        """See ``compute``; runs it under inference mode."""
        return self.compute(*args, **kwargs)

    def compute(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slot_start: int,
        attn_len: int,
        last_only: bool = True,
        write_cols: torch.Tensor | None = None,
        last_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens, positions: (B, T) for slots slot_start.. slot_start+B-1; each row attends to its
        slot's columns 0..position. Writes the new keys/values at write_cols (default: positions;
        padding rows pass ``scratch_col``). Returns logits (B, V) of each row's last token (or of
        ``last_index`` (B,)), or (B, T, V) when last_only is False."""
        b, t = tokens.shape
        write_cols = positions if write_cols is None else write_cols
        if self.adapters is not None:  # the rows' adapters, read on the device by every LowRankDelta
            self.adapters.select(slot_start, b)
        h = self.embed(tokens)
        cos, sin = self.rope(positions, h.dtype)
        if t == 1 and self.decode_attention == "kernel":  # the kernel reads positions without strides: contiguous
            pos = positions[:, 0].contiguous()  # (a column of a wider input buffer is not; the decoder's row is)
            return self._decode_kernel_layers(h, pos, cos[:, 0], sin[:, 0], slot_start, write_cols)
        in_place = self.kernel_reads(t)  # reads: what attention needs besides the cache, built once a forward
        if in_place:  # one query of the decode kernel per (row, token): its position, and its row's block table
            step = self.cache.step(slot_start, b, write_cols, attn_len, read=False)  # shared by every layer
            reads = (positions.reshape(-1).contiguous(), step.table[:, None].expand(-1, t, -1).reshape(b * t, -1))
        else:
            step = self.cache.step(slot_start, b, write_cols, attn_len)
            # several tokens per row: the group's heads become G * T queries of one kv head, so the mask is repeated
            # G times here, once a forward (one token: its row broadcasts over the group)
            reads = self._attention_bias(positions, attn_len, h.dtype, self.n_heads // self.n_kv if t > 1 else 1)
        for i, layer in enumerate(self.layers):
            keys, values = self.cache.keys[i], self.cache.values[i]
            # fused projections (when the runner made them) are passed as tensors: a compiled function that read
            # the layer's q/k/v weights, views of one tensor, would get aliased inputs and slow wrappers
            qkv_w, qkv_b, qkv_d, gate_up, gate_up_d = self._fused_weights(i)
            if in_place or (self.compiled and not self.compile_attention):  # compiled halves around eager attention
                q, k, v = self._compiled(self._pre_fn, self._pre, layer, h, cos, sin, qkv_w, qkv_b, qkv_d)
                attend = self._attend_in_place if in_place else self._attend
                out = attend(q, k, v, reads, keys, values, step)
                h = self._compiled(self._post_fn, self._post, layer, h, out, gate_up, gate_up_d)
            else:
                fused = (qkv_w, qkv_b, qkv_d, gate_up, gate_up_d)
                h = self._compiled(self._layer_fn, self._layer, layer, h, cos, sin, reads, keys, values, step, *fused)
        if last_only:
            h = h[:, -1] if last_index is None else h[torch.arange(b, device=h.device), last_index]
        return self._compiled(self._head_fn, self._head, h)

    def _head(self, h: torch.Tensor, delta: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm (of h + delta: the last layer's pending residual) and the LM head: float32 logits."""
        if delta is not None:
            h = h + delta
        return self.lm_head(self.norm(h)).float()

    def _decode_kernel_layers(self, h, positions, cos, sin, slot_start, write_cols) -> torch.Tensor:
        """One new token per row through every layer with the paged decode kernel; logits (B, V)."""
        b = h.shape[0]
        step = self.cache.step(slot_start, b, write_cols, 0, read=False)
        delta = None
        for i, layer in enumerate(self.layers):
            qkv_w, qkv_b, qkv_d, gate_up, gate_up_d = self._fused_weights(i)
            h, q, k, v = self._compiled(self._dpre_fn, self._decode_pre, layer, qkv_w, qkv_b, qkv_d, h, delta)
            out = paged_decode_attention(
                q,
                k,
                v,
                self.cache.keys[i],
                self.cache.values[i],
                step.table,
                positions,
                step.write_index,
                self.cache.block_size,
                cos,
                sin,
            )
            h, delta = self._compiled(self._dpost_fn, self._decode_post, layer, gate_up, gate_up_d, h, out)
        return self._compiled(self._head_fn, self._head, h[:, 0], delta[:, 0])

    def _decode_pre(self, layer, qkv_weight, qkv_bias, qkv_delta, h, delta):
        """h + delta (the previous layer's MLP output), then q, k, v (B, heads, D) of its norm, QK-normed
        but not yet rotated (the kernel applies RoPE); returns (h, q, k, v)."""
        if delta is not None:
            h = h + delta
        q, k, v = layer.attention_inputs(h, qkv_weight, qkv_bias, qkv_delta)  # (B, 1, heads, D)
        return h, q[:, 0], k[:, 0], v[:, 0]

    def _decode_post(self, layer, gate_up_weight, gate_up_delta, h, attn_out):
        """h + o_proj(attention output); returns (h, ffn(norm(h))), the FFN output added by the next layer."""
        return layer.after_attention(h, attn_out.reshape(h.shape[0], 1, -1), gate_up_weight, gate_up_delta)

    @staticmethod
    def _attention_bias(positions: torch.Tensor, length: int, dtype: torch.dtype, repeats: int = 1) -> torch.Tensor:
        """Additive mask (B, 1, repeats * T, L): 0 where column <= the query's position (causal per row), -inf
        after; its T rows repeated ``repeats`` times (grouped-query heads as queries, see ``_attend``).
        Built once per forward; its rows are padded to a multiple of 16 elements, the alignment the
        memory-efficient attention kernel needs, so no layer copies it again. The padding is never
        zero, so the mask is always a strided view (one compiled layer serves every length)."""
        b, t = positions.shape
        padded = (length // 16 + 1) * 16
        cols = torch.arange(padded, device=positions.device)
        bias = torch.zeros((b, 1, repeats, t, padded), dtype=dtype, device=positions.device)
        bias.masked_fill_((cols[None, None, :] > positions[:, :, None])[:, None, None], float("-inf"))
        return bias.view(b, 1, repeats * t, padded)[..., :length]

    def _compiled(self, fast, plain, *args):
        """fast(*args) when compiled, else plain(*args); a compile failure turns compilation off for good."""
        if self.compiled:
            try:
                # no duck sizing: a batch, length or stride that happens to equal another size must not
                # become a guard (each coincidence would cost a recompile)
                with fx_config.patch(use_duck_shape=False):
                    return fast(*args)
            except Exception as exc:  # the compiler could not take this model: stay correct, run eagerly
                self.compile_error = f"{type(exc).__name__}: {exc}"[:500]
                warnings.warn(
                    f"torch.compile of the serving forward failed ({self.compile_error}); running eagerly", stacklevel=2
                )
                self.set_compiled(False)
        return plain(*args)

    def _fused_weights(self, i: int) -> tuple:
        """Layer i's fused QKV weight, bias and LoRA update, and gate/up weight and LoRA update (Nones where there
        are none)."""
        if self.fused is None:
            return None, None, None, None, None
        f = self.fused[i]
        return f.qkv, f.qkv_bias, f.qkv_delta, f.gate_up, f.gate_up_delta

    def _layer(
        self,
        layer,
        h,
        cos,
        sin,
        mask,
        keys,
        values,
        step,
        qkv_weight=None,
        qkv_bias=None,
        qkv_delta=None,
        gate_up=None,
        gate_up_delta=None,
    ):
        """One decoder layer: h + attn(norm(h)), then + mlp(norm(h)); keys/values are this layer's cache."""
        q, k, v = self._pre(layer, h, cos, sin, qkv_weight, qkv_bias, qkv_delta)
        return self._post(layer, h, self._attend(q, k, v, mask, keys, values, step), gate_up, gate_up_delta)

    def _pre(self, layer, h, cos, sin, qkv_weight=None, qkv_bias=None, qkv_delta=None):
        """The attention's inputs: q, k, v (B, heads, T, D) from norm(h), with QK-norm and RoPE."""
        q, k, v = layer.attention_inputs(h, qkv_weight, qkv_bias, qkv_delta)
        return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def _attend(self, q, k, v, mask, cache_k, cache_v, step):
        """Store k, v in the cache, attend q to the row's cached keys; (B, T, heads * D)."""
        b, _, t, _ = q.shape
        self.cache.write(cache_k, cache_v, step, k, v)
        keys, values = self.cache.view(cache_k, cache_v, step)
        if self.n_heads > self.n_kv:
            # grouped-query attention: the group's heads (h = kv * G + g) become G * T queries of their kv head, so
            # keys and values are never repeated per head; the mask's rows were repeated to match (compute)
            q = q.reshape(b, self.n_kv, -1, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, Hkv, G * T, D)
            out = out.reshape(b, self.n_heads, t, self.head_dim)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)

    def _attend_in_place(self, q, k, v, rows, cache_k, cache_v, step):
        """As ``_attend`` for a few tokens per row through the paged decode kernel: the new keys and values are
        stored first (so each token sees the ones before it in this forward), then every (row, token) attends as
        one decode query to its row's blocks up to its position; rows: (positions (B*T,), tables (B*T, blocks)).
        q, k, v come rotated. Nothing is gathered, repeated for grouped-query heads or masked."""
        b, _, t, _ = q.shape
        self.cache.write(cache_k, cache_v, step, k, v)
        positions, tables = rows
        flat = [x.transpose(1, 2).reshape(b * t, x.shape[1], self.head_dim) for x in (q, k, v)]
        out = paged_decode_attention(
            *flat, cache_k, cache_v, tables, positions, step.write_index, self.cache.block_size
        )  # (B*T, heads, D)
        return out.reshape(b, t, self.n_heads * self.head_dim)

    def _post(self, layer, h, attn_out, gate_up=None, gate_up_delta=None):
        """h + o_proj(attention output), then + ffn(norm(h))."""
        h, ffn = layer.after_attention(h, attn_out, gate_up, gate_up_delta)
        return h + ffn
