"""``ResumableDistributedSampler``: a distributed sampler that resumes mid-epoch exactly.

Epoch e's global order is ``perm_e`` = ``torch.randperm(n)`` from a generator seeded with
``seed + e`` (``arange(n)`` without shuffle). The sampler keeps ``consumed``: how many entries
of ``perm_e`` the whole job has used this epoch. Every iteration serves

    rest = perm_e[consumed:]                          # what is still unseen
    rest = rest + perm_e[:pad]   or   rest[:len - len % R]   # pad (or drop) to divide by R
    rank r takes rest[r::R]                            # R = num_replicas

With an unchanged world size this is exactly the tail an uninterrupted run would serve on
every rank. **World-size rule:** ``consumed`` counts global samples, so a run saved with R
replicas and resumed with R' continues from the same place of the same permutation: every
unseen sample is served once, now dealt round-robin over R' ranks.

Consumption is counted by ``advance(samples_on_this_rank)``; ``build_dataloader`` calls it
for each batch it hands out, which stays exact however far the DataLoader prefetches.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler


class ResumableDistributedSampler(Sampler[int]):
    """Shuffle, pad or drop to divide evenly, slice per rank; ``state_dict`` holds epoch + consumed."""

    def __init__(
        self,
        dataset,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}")
        self.num_samples_total = len(dataset)
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.consumed = 0  # global samples of this epoch's order already used

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's global order (the same on every rank and every world size)."""
        n = self.num_samples_total
        if not self.shuffle:
            return torch.arange(n)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(n, generator=g)

    def _remaining(self) -> torch.Tensor:
        perm = self.permutation(self.epoch)
        n, r = len(perm), self.num_replicas
        rest = perm[min(self.consumed, n) :]
        if self.drop_last:
            return rest[: len(rest) - len(rest) % r]
        pad = (-len(rest)) % r
        if pad and n:
            rest = torch.cat([rest, perm.repeat(math.ceil(pad / n))[:pad]])
        return rest

    def _count(self, consumed: int) -> int:
        """Samples each rank gets from position ``consumed``: ceil(rest / R) padded, floor(rest / R) dropped."""
        rest = max(self.num_samples_total - consumed, 0)
        return rest // self.num_replicas if self.drop_last else math.ceil(rest / self.num_replicas)

    def _restart_if_finished(self) -> None:
        # a finished epoch iterated again (without set_epoch) starts over, as torch's sampler does
        if self.consumed > 0 and self._count(self.consumed) == 0:
            self.consumed = 0

    def __iter__(self):
        self._restart_if_finished()
        return iter(self._remaining()[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        consumed = self.consumed if self._count(self.consumed) > 0 else 0
        return self._count(consumed)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; setting the epoch a resumed state is in keeps its position."""
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def advance(self, samples_on_this_rank: int) -> None:
        """Record that this rank used ``samples_on_this_rank`` more samples (all ranks move in step)."""
        self.consumed += samples_on_this_rank * self.num_replicas

    def state_dict(self) -> dict:
        """Epoch, global samples consumed this epoch, and what fixes the order."""
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples_total,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``; a different dataset size or seed is refused."""
        if state["num_samples"] != self.num_samples_total:
            raise ValueError(
                f"sampler state is for a dataset of {state['num_samples']} samples, this one has "
                f"{self.num_samples_total}; resume with the same data and window settings"
            )
        if state["seed"] != self.seed or state["shuffle"] != self.shuffle:
            raise ValueError(
                f"sampler state has seed={state['seed']} shuffle={state['shuffle']}, this sampler "
                f"seed={self.seed} shuffle={self.shuffle}; the order would differ"
            )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
