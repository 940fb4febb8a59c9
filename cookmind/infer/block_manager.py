"""The engine's KV-block bookkeeping for a paged cache: which blocks each request holds, and how many the pool
has promised.

Admission control: a request is admitted when the pool can set aside every block its prompt plus its
max_new_tokens can fill (so it never runs out mid-way and nobody is preempted). It takes blocks from that
reservation one at a time as it grows and returns them all when it ends. With the prefix cache
(prefix_cache.py) full prompt blocks outlive their request and are shared by later requests that start with
the same tokens; cached blocks nobody holds count as free and are evicted LRU when needed.
"""

from __future__ import annotations

from cookmind.infer.paged_cache import PagedKVCache
from cookmind.infer.prefix_cache import PrefixCache, chain_keys, chain_root


class BlockManager:
    """Reserve, grow and release the blocks of requests over one ``PagedKVCache`` (``prefix_cache``: share full
    prompt blocks between requests). Requests carry their own state: ``blocks``, ``reserved_blocks``,
    ``prefilled``, ``cached_tokens``, ``block_keys``, ``slot``, ``adapter``."""

    def __init__(self, cache: PagedKVCache, max_seq_len: int, prefix_cache: bool = False):
        self.cache = cache
        self.block_size = cache.block_size
        self.max_seq_len = max_seq_len
        self.unreserved = cache.allocator.capacity  # blocks free to promise
        self.prefix = PrefixCache(cache.allocator, self.block_size) if prefix_cache else None

    @property
    def capacity(self) -> int:
        return self.cache.allocator.capacity

    def blocks_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """Blocks a request can fill: its prompt plus every token it may generate, within the context."""
        positions = min(prompt_len + max_new_tokens, self.max_seq_len)
        return -(-positions // self.block_size)  # ceil

    def check_fits(self, req) -> None:
        """Set the request's reservation; ValueError when even an empty pool could not hold it."""
        req.reserved_blocks = self.blocks_needed(len(req.prompt_ids), req.max_new_tokens)
        if req.reserved_blocks > self.capacity:
            raise ValueError(
                f"the request can fill {req.reserved_blocks} KV blocks but the pool holds "
                f"{self.capacity}; lower max_tokens or raise the KV cache budget"
            )

    def try_reserve(self, req) -> bool:
        """Set aside the request's blocks if the pool can hold them now (first come, first served: the caller
        keeps it waiting otherwise). With the prefix cache it shares its longest cached prefix."""
        if self.prefix is None:
            if req.reserved_blocks > self.unreserved:
                return False
            self.unreserved -= req.reserved_blocks
            return True
        # it needs its private blocks (all it can fill minus the hit) plus the hit blocks that are idle now
        # (holding them takes them out of the evictable set); prompt-logprob requests look nothing up: every
        # prompt place needs its logits
        # blocks are shared within one LoRA adapter only: the chain starts from the adapter's own root
        root = chain_root(req.adapter)
        hits = self.prefix.match(req.prompt_ids, root) if req.prompt_logprobs is None else []
        private = self.blocks_needed(len(req.prompt_ids), req.max_new_tokens) - len(hits)
        cost = private + self.prefix.pinned_by(hits)
        if cost > self.unreserved:
            return False
        self.unreserved -= cost
        self.prefix.acquire(hits, len(req.prompt_ids))
        req.reserved_blocks = private  # from here on, the blocks it will take from the pool
        req.blocks = list(hits)
        req.prefilled = req.cached_tokens = len(hits) * self.block_size
        req.block_keys = chain_keys(req.prompt_ids, self.block_size, len(req.prompt_ids) // self.block_size, root)
        return True

    def grow(self, req, last_position: int) -> None:
        """Take blocks (from the request's reservation) until position last_position has a place."""
        if len(req.blocks) * self.block_size > last_position:
            return
        allocate = self.cache.allocator.allocate if self.prefix is None else self.prefix.allocate  # may evict
        while len(req.blocks) * self.block_size <= last_position:
            req.blocks.append(allocate())
        self.cache.set_row(req.slot, req.blocks)

    def register_prompt_blocks(self, req, before: int) -> None:
        """Prefix cache: the full prompt blocks a prefill chunk completed (positions before..prefilled-1) become
        cached blocks; each one registered moves from the request's reservation to the cache's held count."""
        if self.prefix is None:
            return
        for i in range(before // self.block_size, min(req.prefilled // self.block_size, len(req.block_keys))):
            key, parent, tokens = req.block_keys[i]
            if self.prefix.register(req.blocks[i], key, parent, tokens):
                req.reserved_blocks -= 1

    def release(self, req) -> None:
        """The request ended: its blocks go back (cached ones lose a reference and stay for later hits) and what
        it had promised becomes free to promise again. A step in flight may still write its old row, but
        stream order puts that before any later owner's writes."""
        if self.prefix is not None:
            self.unreserved += self.prefix.release(req.blocks)  # cached blocks that became idle
        else:
            self.cache.allocator.free(req.blocks)
        self.cache.set_row(req.slot, [])
        req.blocks = []
        self.unreserved += req.reserved_blocks

    def forget_cached(self) -> None:
        """After a failed step: what it wrote is not trusted, so no cached block is shared again."""
        if self.prefix is not None:
            self.prefix.forget_all()

    def accounting(self) -> dict:
        """Pool size, blocks free, blocks promised to running requests (and cached ones with the prefix cache)."""
        alloc = self.cache.allocator
        out = {
            "kv_blocks_total": alloc.capacity,
            "kv_blocks_free": alloc.num_free,
            "kv_blocks_unreserved": self.unreserved,
            "kv_block_size": self.block_size,
        }
        if self.prefix is not None:  # free + cached (idle) + used == total
            out["kv_blocks_cached"] = self.prefix.num_idle
            out["kv_blocks_used"] = alloc.capacity - alloc.num_free - self.prefix.num_idle
        return out
