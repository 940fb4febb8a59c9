"""KVCache: preallocated per-layer key/value buffers for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every layer, preallocated to (batch, n_kv_heads, max_seq_len, head_dim).

    ``forward(kv_cache=cache)`` writes its T new keys/values at slots [seq_len, seq_len + T) of each layer and
    then advances ``seq_len`` by T. Nothing is reallocated while decoding.
    """

    def __init__(self, cfg, batch_size: int, max_seq_len: int, device=None, dtype: torch.dtype | None = None):
        dtype = dtype or torch.get_default_dtype()
        shape = (batch_size, cfg.num_key_value_heads, max_seq_len, cfg.resolved_head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.seq_len = 0

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, kv_len: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v (B, Hkv, T, D) at [seq_len, seq_len+T) of `layer`; return the first kv_len slots.

        kv_len defaults to seq_len + T; a caller passing a mask over more slots (a static-shape decode) reads
        that many, with the mask hiding the unwritten ones.
        """
        start, t = self.seq_len, k.shape[2]
        if start + t > self.max_seq_len:
            raise ValueError(
                f"KVCache: {start} cached + {t} new tokens exceed max_seq_len={self.max_seq_len}; "
                "allocate a larger cache"
            )
        if k.shape[0] != self.batch_size:
            raise ValueError(f"KVCache: batch {k.shape[0]} does not match the cache's batch_size={self.batch_size}")
        self.k[layer][:, :, start : start + t] = k
        self.v[layer][:, :, start : start + t] = v
        end = start + t if kv_len is None else kv_len
        if not start + t <= end <= self.max_seq_len:
            raise ValueError(
                f"KVCache: attention_mask covers {end} key slots but the cache holds {start + t} "
                f"tokens after this step (max {self.max_seq_len}); the mask's last dim must be "
                "between those"
            )
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n: int) -> None:
        """Mark n more tokens as stored (called by the model after all layers have written)."""
        self.seq_len += n

    def reset(self) -> None:
        """Forget every stored token (buffers are kept and overwritten)."""
        self.seq_len = 0

    def truncate(self, n: int) -> None:
        """Keep only the first n tokens (e.g. drop a rejected draft or roll back a stop string)."""
        if not 0 <= n <= self.seq_len:
            raise ValueError(f"KVCache.truncate({n}): must be between 0 and seq_len={self.seq_len}")
        self.seq_len = n
