"""ResumableDistributedSampler: equals torch's DistributedSampler, resumes mid-epoch exactly on every
rank, follows the global-sample-count rule when the world size changes, and stays exact with workers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler

from cookmind.data import DatasetFactory, ResumableDistributedSampler, build_dataloader
from cookmind.store import write_store


class Indices(Dataset):
    """Item i is {"input_ids": [i]}: batches show exactly which samples were served."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i])}


def _served(loader, batches=None):
    out = []
    for batch in itertools.islice(loader, batches):  # islice stops before pulling one batch too many
        out += batch["input_ids"][:, 0].tolist()
    return out


@pytest.mark.parametrize(
    "n,replicas,drop_last,shuffle",
    [(10, 1, False, True), (11, 2, False, True), (11, 2, True, True), (7, 3, False, False)],
)
def test_fresh_epoch_equals_torch_distributed_sampler(n, replicas, drop_last, shuffle):
    ds = Indices(n)
    for epoch in (0, 3):
        for rank in range(replicas):
            ours = ResumableDistributedSampler(ds, replicas, rank, shuffle=shuffle, seed=5, drop_last=drop_last)
            ref = DistributedSampler(ds, replicas, rank, shuffle=shuffle, seed=5, drop_last=drop_last)
            ours.set_epoch(epoch)
            ref.set_epoch(epoch)
            assert list(ours) == list(ref)
            assert len(ours) == len(ref)


@pytest.mark.parametrize("replicas", [1, 2])
def test_mid_epoch_resume_serves_exactly_what_an_uninterrupted_run_would(replicas):
    n, bs, cut = 23, 3, 2  # stop after 2 batches of epoch 1
    full, resumed = {}, {}
    for rank in range(replicas):
        loader = build_dataloader(Indices(n), "seq", bs, pad_id=0, num_replicas=replicas, rank=rank, seed=7)
        loader.sampler.set_epoch(1)
        batches = len(loader)
        full[rank] = _served(loader)
        first = build_dataloader(Indices(n), "seq", bs, pad_id=0, num_replicas=replicas, rank=rank, seed=7)
        first.sampler.set_epoch(1)
        head = _served(first, batches=cut)
        state = first.state_dict()
        assert state["consumed"] == cut * bs * replicas and state["epoch"] == 1
        again = build_dataloader(Indices(n), "seq", bs, pad_id=0, num_replicas=replicas, rank=rank, seed=7)
        again.load_state_dict(state)
        again.sampler.set_epoch(1)  # the trainer sets the epoch it resumes in; the position stays
        assert len(again) == batches - cut
        resumed[rank] = head + _served(again)
    assert resumed == full
    # and next epoch, a new order
    s = ResumableDistributedSampler(Indices(n), replicas, 0, seed=7)
    s.load_state_dict(state)
    s.set_epoch(2)
    assert s.consumed == 0 and list(s) != full[0]


@pytest.mark.parametrize("old,new", [(2, 1), (1, 2), (2, 3)])
def test_world_size_change_resumes_by_global_sample_count(old, new):
    n, per_rank = 20, 4
    samplers = [ResumableDistributedSampler(Indices(n), old, r, seed=1) for r in range(old)]
    seen = []
    for s in samplers:
        seen += list(s)[:per_rank]
        s.advance(per_rank)
    state = samplers[0].state_dict()
    assert state["consumed"] == per_rank * old
    after = []
    for r in range(new):
        s = ResumableDistributedSampler(Indices(n), new, r, seed=1)
        s.load_state_dict(state)
        after.append(list(s))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1)).tolist()  # epoch 0's order
    rest = perm[per_rank * old :]
    rest += perm[: (-len(rest)) % new]  # pad from the start of the epoch's order
    assert after == [rest[r::new] for r in range(new)]  # the documented rule, written out
    # nothing seen twice and nothing lost (apart from padding duplicates)
    flat = [i for part in after for i in part]
    assert sorted(set(seen) | set(flat)) == list(range(n))
    assert not set(seen) & set(perm[per_rank * old :])


def test_state_from_another_dataset_or_seed_is_refused():
    s = ResumableDistributedSampler(Indices(10), 1, 0, seed=0)
    with pytest.raises(ValueError, match="dataset of 10 samples, this one has 12"):
        ResumableDistributedSampler(Indices(12), 1, 0).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="order would differ"):
        ResumableDistributedSampler(Indices(10), 1, 0, seed=1).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="rank"):
        ResumableDistributedSampler(Indices(10), 2, 2)


@pytest.mark.parametrize("fmt", ["bin", "h5"])
def test_resume_is_exact_with_two_prefetching_workers(tmp_path, fmt):
    docs = [{"sequence": np.arange(k, k + 8) % 97} for k in range(12)]
    path = write_store(tmp_path / "s", "seq", docs, vocab_size=97, storage_type=fmt)
    ds = DatasetFactory.load("seq", path, window_size=4, stride=2)
    ref = build_dataloader(ds, "seq", 2, pad_id=0, seed=3)
    want = [b["input_ids"] for b in ref]
    loader = build_dataloader(ds, "seq", 2, pad_id=0, seed=3, num_workers=2, prefetch_factor=4)
    got = []
    for k, b in enumerate(loader):
        got.append(b["input_ids"])
        if k == 4:
            break  # the workers have fetched well past batch 4 by now
    state = loader.state_dict()
    assert state["consumed"] == 10
    again = build_dataloader(ds, "seq", 2, pad_id=0, seed=3)
    again.load_state_dict(state)
    got += [b["input_ids"] for b in again]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
