"""Our DDP and ShardedOptimizer over gloo with 2 processes, against single-process full-batch training.

One spawn runs every scenario (process start-up dominates the cost); each rank checks itself
against a reference it computes alone on the whole batch, and the tests assert on what the
ranks report.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from gloo_fixtures import run_on_gloo_ranks
from torch import nn

WORLD = 2
BUCKET_SIZES_MB = {"one_param_per_bucket": 1e-9, "a_few_params": 3e-4, "one_bucket": 25.0}


class Toy(nn.Module):
    """Tied embedding/head, a frozen layer, a never-used layer, and a branch only some ranks use."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.hidden = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(8, 3)
        self.branch = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x, use_branch: bool = False):
        h = torch.tanh(self.hidden(self.emb(x)))
        if use_branch:
            h = h + self.branch(h)
        return self.head(self.frozen(h))


def _loss(model, x, use_branch=False):
    logits = model(x[:, :-1], use_branch)
    return nn.functional.cross_entropy(logits.reshape(-1, 16), x[:, 1:].reshape(-1))


def _data(steps, accum, per_rank):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 16, (steps, accum, WORLD * per_rank, 6), generator=g)


def _train_ddp(rank, bucket_mb, steps=3, accum=2, per_rank=2, set_to_none=True):
    """Our DDP, with accumulation, rank 0 alone using the branch; returns (model, reference)."""
    from cookmind.parallel import DDP

    torch.manual_seed(rank + 10)  # different init per rank: DDP must broadcast rank 0's
    model = Toy()
    torch.manual_seed(10)
    ref = Toy()  # rank 0's init
    ddp = DDP(model, bucket_size_mb=bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    data = _data(steps, accum, per_rank)
    grad_diff = 0.0
    for step in range(steps):
        for micro in range(accum):
            batch = data[step, micro]
            # reference: the full batch's mean loss = mean of the ranks' equal-sized shard means
            shards = [batch[r * per_rank : (r + 1) * per_rank] for r in range(WORLD)]
            ref_loss = sum(_loss(ref, s, use_branch=r == 0) for r, s in enumerate(shards)) / WORLD
            (ref_loss / accum).backward()
            mine = shards[rank]
            if micro < accum - 1:
                with ddp.no_sync():
                    (_loss(ddp, mine, use_branch=rank == 0) / accum).backward()
            else:
                (_loss(ddp, mine, use_branch=rank == 0) / accum).backward()
                ddp.finish_gradient_synchronization()
        for p, q in zip(model.parameters(), ref.parameters()):  # the averaged gradients themselves
            assert (p.grad is None) == (q.grad is None), "DDP and reference disagree on which grads exist"
            if p.grad is not None:
                grad_diff = max(grad_diff, (p.grad - q.grad).abs().max().item())
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=set_to_none)  # False: grads stay views of the buckets and accumulate there
        ref_opt.zero_grad(set_to_none=set_to_none)
    ddp.max_grad_diff = grad_diff
    return ddp, model, ref


def _max_param_diff(a, b):
    return max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


def _scenario_ddp(rank):
    out = {}
    runs = [(name, mb, True) for name, mb in BUCKET_SIZES_MB.items()] + [("grads_kept_as_bucket_views", 3e-4, False)]
    for name, mb, set_to_none in runs:
        ddp, model, ref = _train_ddp(rank, mb, set_to_none=set_to_none)
        out[name] = {
            "max_diff": _max_param_diff(model, ref),
            "max_grad_diff": ddp.max_grad_diff,
            "n_buckets": len(ddp.bucket_params),
            "n_params": sum(len(b) for b in ddp.bucket_params),
            "unused_grad_none": model.unused.weight.grad is None,
            "frozen_unchanged": torch.equal(model.frozen.weight, ref.frozen.weight),
        }
    # the branch is used on rank 0 only: after a synced backward both ranks hold the same averaged grad
    ddp, model, _ = _train_ddp(rank, 1e-9, steps=1, accum=1)
    x = _data(1, 1, 2)[0, 0][rank * 2 : (rank + 1) * 2]
    with ddp.no_sync():  # accumulation step: nothing sent, each rank keeps its own gradient
        _loss(ddp, x, use_branch=rank == 0).backward()
    local = model.hidden.weight.grad.clone()
    gathered = [torch.empty_like(local) for _ in range(WORLD)]
    dist.all_gather(gathered, local)
    out["no_sync_sends_nothing"] = all(b.work is None for b in ddp._buckets) and not torch.equal(*gathered)
    _loss(ddp, x, use_branch=rank == 0).backward()
    ddp.finish_gradient_synchronization()
    g = model.branch.weight.grad.clone()
    gathered = [torch.empty_like(g) for _ in range(WORLD)]
    dist.all_gather(gathered, g)
    out["branch_grad_equal_across_ranks"] = torch.equal(gathered[0], gathered[1]) and g.abs().sum().item() > 0
    return out


def _scenario_sharded(rank):  # noqa: C901 - one training run with checks at fixed steps
    from cookmind.parallel import ShardedOptimizer

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 12), nn.Linear(12, 4))
    ref = copy.deepcopy(net)
    kw = dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    opt = ShardedOptimizer(net.parameters(), torch.optim.AdamW, **kw)
    ref_opt = torch.optim.AdamW(ref.parameters(), **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(12, 8, 12, generator=g)
    for step in range(12):
        if step == 10:  # checkpoint round trip: a fresh sharded optimizer resumes from the full state
            opt.consolidate_state_dict()  # collective; then state_dict() on one rank alone needs no peers
            full = opt.state_dict() if rank == 0 else None
            consolidated_cached = rank != 0 or opt.state_dict() is full
            full = opt.state_dict()
            ref_full = ref_opt.state_dict()
            state_match = all(
                torch.allclose(full["state"][i][k].float(), ref_full["state"][i][k].float(), atol=1e-6)
                for i in ref_full["state"]
                for k in ("exp_avg", "exp_avg_sq")
            )
            opt = ShardedOptimizer(net.parameters(), torch.optim.AdamW, **kw)
            opt.load_state_dict(full)
        for model, o in ((net, opt), (ref, ref_opt)):
            loss = model(xs[step]).pow(2).mean()  # same full batch on both ranks: grads already "averaged"
            loss.backward()
            o.step()
            o.zero_grad()
        if step < 10:
            sched.step()
            ref_sched.step()
        if step == 9:
            diff_after_10 = _max_param_diff(net, ref)
            local = sum(
                t.numel()
                for s in opt.local_optimizer.state.values()
                for t in s.values()
                if torch.is_tensor(t) and t.numel() > 1
            )
            total = sum(
                t.numel() for s in ref_opt.state.values() for t in s.values() if torch.is_tensor(t) and t.numel() > 1
            )
            largest = max(p.numel() for p in net.parameters())
    return {
        "diff_after_10": diff_after_10,
        "diff_after_resume": _max_param_diff(net, ref),
        "local_state_numel": local,
        "total_state_numel": total,
        "largest_param": largest,
        "state_dict_matches_unsharded": state_match,
        "consolidated_cached": consolidated_cached,
        "full_state_entries": len(full["state"]),
        "n_params": len(list(net.parameters())),
    }


def _scenario_sharded_groups(rank):
    """cookmind's own AdamW with decay / no-decay groups, as the trainer builds it."""
    from cookmind.optim import AdamW, param_groups
    from cookmind.parallel import ShardedOptimizer

    torch.manual_seed(4)
    net = Toy()
    ref = copy.deepcopy(net)
    kw = dict(lr=0.02, betas=(0.9, 0.95), weight_decay=0.1)
    opt = ShardedOptimizer(param_groups(net, 0.1), AdamW, **kw)
    ref_opt = AdamW(param_groups(ref, 0.1), **kw)
    x = _data(1, 1, 4)[0, 0]
    for _ in range(3):
        for model, o in ((net, opt), (ref, ref_opt)):
            _loss(model, x, use_branch=True).backward()
            o.step()
            o.zero_grad()
    return {"diff": _max_param_diff(net, ref), "groups": len(opt.param_groups)}


def _scenario_parallelize(rank):
    """parallelize with activation checkpointing and each DDP: the wrappers' order, and one step's averaged
    gradients against the plain model's on the full batch."""
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.parallel import DDP, finish_gradient_sync, parallelize, unwrap
    from cookmind.train import TrainConfig

    shape = CookMindConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    ref = CookMindLM(shape)  # rank 0's init, which DDP broadcasts
    batch = torch.randint(0, 32, (WORLD * 2, 8), generator=torch.Generator().manual_seed(6))
    ref(batch, labels=batch).loss.backward()  # equal-sized shards: the full-batch mean is the mean of shard means
    out = {}
    for kind in ("ours", "torch"):
        torch.manual_seed(rank)
        model = CookMindLM(shape)
        cfg = TrainConfig.from_dict(
            {"train": {"device": "cpu", "activation_checkpointing": True}, "parallel": {"ddp": kind}}
        )
        wrapped = parallelize(model, cfg)
        mine = batch[rank * 2 : (rank + 1) * 2]
        wrapped(mine, labels=mine).loss.backward()
        finish_gradient_sync(wrapped)
        out[kind] = {
            "outer_is_ddp": isinstance(wrapped, DDP if kind == "ours" else nn.parallel.DistributedDataParallel),
            "unwrap": unwrap(wrapped) is model and unwrap(wrapped, data_parallel_only=True) is model,
            "blocks_checkpointed": all(type(b).__name__ == "CheckpointWrapper" for b in model.model.layers),
            "max_grad_diff": max(
                (p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters(), strict=True)
            ),
        }
        if kind == "ours":
            wrapped.remove_hooks()
    # with compile: data parallelism outside the compiled model, checkpointing inside (compiles lazily: not run)
    model = CookMindLM(shape)
    cfg = TrainConfig.from_dict(
        {"train": {"device": "cpu", "activation_checkpointing": True, "compile": True}, "parallel": {"ddp": "ours"}}
    )
    wrapped = parallelize(model, cfg)
    out["compiled_order"] = (
        isinstance(wrapped, DDP)
        and wrapped.module._orig_mod is model
        and unwrap(wrapped, data_parallel_only=True) is wrapped.module
        and unwrap(wrapped) is model
    )
    wrapped.remove_hooks()
    return out


def _scenarios(rank):
    return {
        "ddp": _scenario_ddp(rank),
        "sharded": _scenario_sharded(rank),
        "sharded_groups": _scenario_sharded_groups(rank),
        "parallelize": _scenario_parallelize(rank),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_on_gloo_ranks(_scenarios, WORLD, tmp_path_factory.mktemp("parallel"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bucketing", list(BUCKET_SIZES_MB) + ["grads_kept_as_bucket_views"])
def test_ddp_equals_single_process_full_batch(results, bucketing):
    for rank in range(WORLD):
        r = results[rank]["ddp"][bucketing]
        assert r["max_grad_diff"] < 1e-6, f"rank {rank}: grads differ from full-batch grads by {r['max_grad_diff']}"
        assert r["max_diff"] < 1e-5, f"rank {rank}: params differ from full-batch training by {r['max_diff']}"
        assert r["unused_grad_none"] and r["frozen_unchanged"]


def test_ddp_bucket_counts(results):
    r = results[0]["ddp"]
    n = r["one_bucket"]["n_params"]  # params that need grads, tied weight once: emb, hidden x2, unused x2, branch x2
    assert n == 7
    assert r["one_param_per_bucket"]["n_buckets"] == n
    assert r["one_bucket"]["n_buckets"] == 1
    assert 1 < r["a_few_params"]["n_buckets"] < n


def test_ddp_param_used_on_one_rank_only(results):
    assert all(results[r]["ddp"]["branch_grad_equal_across_ranks"] for r in range(WORLD))


def test_sharded_optimizer_equals_unsharded_adamw(results):
    for rank in range(WORLD):
        r = results[rank]["sharded"]
        assert r["diff_after_10"] < 1e-6, f"rank {rank}: {r['diff_after_10']}"


def test_sharded_optimizer_state_dict_and_resume(results):
    for rank in range(WORLD):
        r = results[rank]["sharded"]
        assert r["state_dict_matches_unsharded"]
        assert r["consolidated_cached"]
        assert r["full_state_entries"] == r["n_params"]
        assert r["diff_after_resume"] < 1e-6


def test_sharded_optimizer_holds_about_one_nth_of_state(results):
    locals_ = [results[r]["sharded"]["local_state_numel"] for r in range(WORLD)]
    total = results[0]["sharded"]["total_state_numel"]
    assert sum(locals_) == total  # every state tensor lives on exactly one rank
    for n in locals_:
        assert abs(n - total / WORLD) <= 2 * results[0]["sharded"]["largest_param"]  # 2 moments per param
        assert n < total


def test_sharded_optimizer_with_param_groups_and_cookmind_adamw(results):
    for rank in range(WORLD):
        r = results[rank]["sharded_groups"]
        assert r["groups"] == 2
        assert r["diff"] < 1e-6, f"rank {rank}: {r['diff']}"


def test_ddp_no_sync_keeps_local_gradients(results):
    assert all(results[r]["ddp"]["no_sync_sends_nothing"] for r in range(WORLD))


@pytest.mark.parametrize("kind", ["ours", "torch"])
def test_parallelize_checkpointing_and_ddp_equal_the_plain_model_on_the_full_batch(results, kind):
    for rank in range(WORLD):
        r = results[rank]["parallelize"][kind]
        assert r["outer_is_ddp"] and r["unwrap"] and r["blocks_checkpointed"]
        assert r["max_grad_diff"] < 1e-6, f"rank {rank}: {r['max_grad_diff']}"


def test_parallelize_puts_data_parallelism_outside_compile(results):
    assert all(results[r]["parallelize"]["compiled_order"] for r in range(WORLD))
