"""Greedy merge replay: the reference BPE encoder for one pre-token."""

from __future__ import annotations

Ranks = dict[tuple[int, int], tuple[int, int]]  # (id_a, id_b) -> (merge rank, merged id)


def bpe_merge(ids: list[int], ranks: Ranks) -> list[int]:
    """Apply merges to a pre-token's byte ids: repeatedly merge every occurrence of the earliest-learned pair.

    rank(pair) = its index in the merge list; lower merges first, as in training.
    """
    while len(ids) > 1:
        best = None
        for p in zip(ids, ids[1:]):
            r = ranks.get(p)
            if r is not None and (best is None or r[0] < best[0]):
                best, pair = r, p
        if best is None:
            break
        a, b = pair
        new_id = best[1]
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:
            if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                out.append(new_id)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids
