"""Prefix caching for the paged KV cache: full blocks of prompt tokens, shared between requests.

Keys and values at position p depend only on tokens 0..p (attention is causal), so two prompts
that start with the same tokens have the same KV for that stretch. Requests that share a long
system prompt (or a chat history) can therefore point their block tables at the same physical
blocks instead of computing and storing the prefix again.

A full block of block_size prompt tokens is named by a hash chain over everything before it:

    key_i = hash((key_{i-1}, tokens of block i)),   key_{-1} = a fixed root

so equal keys mean equal prefixes up to a hash collision, and every hit is confirmed by
comparing the stored (key_{i-1}, tokens) exactly, which rules collisions out by induction.

Every block of the pool is in one of four states:
    free      in the allocator's free list;
    private   held by one request, not in the cache (its tail, its generated tokens);
    held      in the cache with refcount > 0 (one or more requests read it);
    idle      in the cache with refcount 0: nobody reads it, it stays for a later hit and is
              evicted (least recently used first) only when the pool needs a block.
A shared block is never written: a request computes from the first position after its hit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from cookmind.infer.paged_cache import BlockAllocator

ROOT_KEY = 0x636F6F6B6D696E64  # key_{-1}: the chain's fixed start ("cookmind")


@dataclass
class _Entry:
    """One cached block: its chain key, its parent's key and its tokens (for the exact check)."""

    key: int
    parent: int
    tokens: tuple[int, ...]
    refcount: int = 0
    forgotten: bool = False  # dropped by forget_all while held: freed, not kept, when its last holder ends


def chain_root(namespace: str | None) -> int:
    """key_{-1} of a chain: ROOT_KEY for the base model, another per LoRA adapter (its KV differs)."""
    return ROOT_KEY if namespace is None else hash((ROOT_KEY, namespace))


def chain_keys(
    tokens: list[int], block_size: int, num_blocks: int, root: int = ROOT_KEY
) -> list[tuple[int, int, tuple[int, ...]]]:
    """(key_i, key_{i-1}, tokens of block i) for the first num_blocks full blocks of tokens, chained from root."""
    out, parent = [], root
    for i in range(num_blocks):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        key = hash((parent, block))  # key_i = hash(key_{i-1}, block i)
        out.append((key, parent, block))
        parent = key
    return out


class PrefixCache:
    """Refcounted, hash-addressed full prompt blocks on top of a BlockAllocator, evicted LRU."""

    def __init__(self, allocator: BlockAllocator, block_size: int):
        self.allocator = allocator
        self.block_size = block_size
        self._by_key: dict[int, int] = {}  # chain key -> block id
        self._entries: dict[int, _Entry] = {}  # block id -> entry (held or idle)
        self._idle: OrderedDict[int, None] = OrderedDict()  # refcount-0 blocks, least recently used first
        self.num_held = 0  # cached blocks with refcount > 0
        # metrics
        self.queries = 0  # requests looked up
        self.query_tokens = 0  # prompt tokens of those requests
        self.hit_tokens = 0  # prompt tokens found in the cache (not computed again)
        self.evictions = 0

    # ---- lookup -------------------------------------------------------------------------------
    def match(self, prompt: list[int], root: int = ROOT_KEY) -> list[int]:
        """Block ids of the longest run of the prompt's leading full blocks found in the cache.

        At most (len(prompt) - 1) // block_size blocks: the last prompt token is always computed,
        so the request has logits to sample from (a fully cached prompt recomputes its last block). root: the
        chain's start (``chain_root``: one per LoRA adapter, whose keys and values differ from the base's)."""
        limit = (len(prompt) - 1) // self.block_size
        found = []
        for key, parent, block in chain_keys(prompt, self.block_size, limit, root):
            bid = self._by_key.get(key)
            if bid is None:
                break
            entry = self._entries[bid]
            if entry.parent != parent or entry.tokens != block:  # a hash collision, not this prefix
                break
            found.append(bid)
        return found

    def pinned_by(self, blocks: list[int]) -> int:
        """How many of these cached blocks are idle now (taking them removes them from the evictable set)."""
        return sum(self._entries[b].refcount == 0 for b in blocks)

    def acquire(self, blocks: list[int], prompt_len: int) -> None:
        """A request admitted with these hit blocks: refcount + 1 each; records the lookup's metrics."""
        for b in blocks:
            entry = self._entries[b]
            if entry.refcount == 0:
                del self._idle[b]
                self.num_held += 1
            entry.refcount += 1
        self.queries += 1
        self.query_tokens += prompt_len
        self.hit_tokens += len(blocks) * self.block_size

    # ---- blocks in and out --------------------------------------------------------------------
    def allocate(self) -> int:
        """A block for private use: a free one, else the least recently used idle cached one."""
        if self.allocator.num_free == 0:
            self.evict(1)
        return self.allocator.allocate()

    def evict(self, n: int) -> None:
        """Forget the n least recently used idle blocks and return them to the free list."""
        for _ in range(n):
            if not self._idle:
                raise RuntimeError(
                    "the KV block pool is empty and nothing cached can be evicted: the engine "
                    "should have kept this request waiting"
                )
            bid, _ = self._idle.popitem(last=False)
            entry = self._entries.pop(bid)
            if self._by_key.get(entry.key) == bid:
                del self._by_key[entry.key]
            self.allocator.free([bid])
            self.evictions += 1

    def register(self, block: int, key: int, parent: int, tokens: tuple[int, ...]) -> bool:
        """Make a request's freshly computed private block a cached one (held by that request, refcount 1).
        False when the key is already cached (another request computed the same prefix): it stays private."""
        if key in self._by_key or block in self._entries:
            return False
        self._by_key[key] = block
        self._entries[block] = _Entry(key, parent, tokens, refcount=1)
        self.num_held += 1
        return True

    def is_cached(self, block: int) -> bool:
        return block in self._entries

    def release(self, blocks: list[int]) -> int:
        """A request ends: cached blocks lose one reference (idle at zero, kept for later hits), private
        blocks go back to the free list. Returns how many cached blocks nobody holds any more.
        The tail goes into the LRU order first, so a chain is evicted from its end, never its start."""
        became_idle, private = 0, []
        for b in reversed(blocks):
            entry = self._entries.get(b)
            if entry is None:
                private.append(b)
                continue
            entry.refcount -= 1
            if entry.refcount == 0:
                self.num_held -= 1
                became_idle += 1
                if entry.forgotten:
                    del self._entries[b]
                    private.append(b)
                else:
                    self._idle[b] = None
        if private:
            self.allocator.free(private[::-1])
        return became_idle

    def forget_all(self) -> None:
        """Drop every cached entry (after a failed step the cached contents are not trusted): nothing can
        be hit any more, idle blocks go back to the free list, held ones when their last holder ends."""
        idle = list(self._idle)
        self._idle.clear()
        self._by_key.clear()
        for b in idle:
            del self._entries[b]
        for entry in self._entries.values():
            entry.forgotten = True
        if idle:
            self.allocator.free(idle)

    @property
    def num_idle(self) -> int:
        """Cached blocks nobody holds: evictable, so they count as free for admission."""
        return len(self._idle)

    def metrics(self) -> dict:
        return {
            "prefix_cache_queries": self.queries,
            "prefix_cache_query_tokens": self.query_tokens,
            "prefix_cache_hit_tokens": self.hit_tokens,
            "prefix_cache_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "prefix_cache_evictions": self.evictions,
            "kv_blocks_cached": self.num_idle,
            "kv_blocks_cached_in_use": self.num_held,
        }
