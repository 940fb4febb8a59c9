"""One seeded random source per generator, so every data set is reproducible from its seed."""

import random


def make_rng(seed: int, stream: str) -> random.Random:
    """A ``random.Random`` for ``stream`` under ``seed``; different streams never share draws."""
    # str seeds are hashed deterministically by random.Random (not by PYTHONHASHSEED).
    return random.Random(f"cookmind-synthetic:{stream}:{seed}")
