"""The unbiased pass@k estimator (Chen et al. 2021)."""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n samples is correct) = 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: correct count {c} must be between 0 and n={n}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds the {n} samples drawn; draw at least k samples per problem")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
