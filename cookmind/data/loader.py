"""``build_dataloader``: a DataLoader whose sampler position is exact at every batch boundary."""

from __future__ import annotations

import signal

import torch
from torch.utils.data import DataLoader

from cookmind.data.collate import collate_for
from cookmind.data.sampler import ResumableDistributedSampler


class ResumableDataLoader:
    """Iterate a DataLoader and advance the sampler by each batch as it is handed out.

    Counting delivered batches (not indices the workers pulled ahead) keeps
    ``sampler.state_dict()`` exact with any number of workers and any prefetch depth.
    """

    def __init__(self, loader: DataLoader, sampler: ResumableDistributedSampler):
        self.loader, self.sampler = loader, sampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.sampler.advance(_batch_size(batch))
            yield batch

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def _batch_size(batch: dict) -> int:
    for v in batch.values():
        return len(v)
    return 0


def leave_stop_signals_to_the_main_process(_worker_id: int) -> None:
    """A DataLoader worker ignores SIGTERM and SIGINT. A stop sent to the whole process group (a scheduler's or
    ``timeout``'s SIGTERM, Ctrl-C) reaches the workers too; one that died of it made the next batch, or the stop's
    own checkpoint save, raise "DataLoader worker is killed by signal", and the run ended with no checkpoint. The main
    process finishes its step, saves and exits, and shuts the workers down (they also leave when it dies)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_dataloader(
    dataset,
    train_type: str,
    batch_size: int,
    pad_id: int,
    num_replicas: int = 1,
    rank: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    doc_mask: bool = False,
) -> ResumableDataLoader:
    """A resumable loader over ``dataset`` for one rank: sampler + collate + DataLoader settings.

    An h5-backed dataset is moved to shared memory first when workers are used.
    """
    sampler = ResumableDistributedSampler(dataset, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    store = getattr(dataset, "store", None)
    if num_workers > 0 and store is not None:
        store.share_memory()
    kwargs = {}
    if num_workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor or 2
        kwargs["persistent_workers"] = persistent_workers
        kwargs["worker_init_fn"] = leave_stop_signals_to_the_main_process
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        collate_fn=collate_for(train_type, pad_id, doc_mask=doc_mask),
        drop_last=drop_last,
        **kwargs,
    )
    return ResumableDataLoader(loader, sampler)
