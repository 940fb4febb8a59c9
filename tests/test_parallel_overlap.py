"""Our DDP's overlap machinery over gloo with 2 processes: buckets launched during backward, buckets
rebuilt in the observed gradient-ready order, bf16 reduction, gradients as views of the buckets;
plus the bucket planner and block finder on their own (no processes).
"""

from __future__ import annotations

import pytest
import torch
from gloo_fixtures import run_on_gloo_ranks
from lm_fixtures import tiny_config, tiny_lm
from torch import nn

from cookmind.parallel import find_blocks, plan_buckets

WORLD = 2
# half of TINY's width and heads, a 16-token context: compiling block by block stays quick
SMALL = {
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "max_position_embeddings": 16,
}


class Chain(nn.Module):
    """Layers registered in an order other than the one the forward uses them in."""

    def __init__(self):
        super().__init__()
        self.last = nn.Linear(8, 8)  # registered first, used last: its gradient is ready first
        self.mid = nn.Linear(8, 8)
        self.first = nn.Linear(8, 8)

    def forward(self, x):
        return self.last(torch.tanh(self.mid(torch.tanh(self.first(x)))))


def _batch(step, per_rank):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(WORLD * per_rank, 8, generator=g), torch.randn(WORLD * per_rank, 8, generator=g)


def _train(rank, reduce_dtype=None, steps=3, per_rank=3):
    """Our DDP (one parameter per bucket) against one process on the full batch; records overlap and order."""
    from cookmind.parallel import DDP

    torch.manual_seed(7)
    ref = Chain()
    torch.manual_seed(7 + rank)  # other ranks start elsewhere: DDP broadcasts rank 0's weights
    model = Chain()
    launched_before_last_grad = []
    # registered before DDP's hooks, so it runs first: counts the buckets already sent when the
    # gradient backward produces last (the first layer's weight) is ready
    model.first.weight.register_post_accumulate_grad_hook(
        lambda p: launched_before_last_grad.append(sum(b.work is not None for b in ddp._buckets))
    )
    ddp = DDP(model, bucket_size_mb=1e-9, reduce_dtype=reduce_dtype)
    initial_order = [[n for n, q in model.named_parameters() if q is b[0]][0] for b in ddp.bucket_params]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    grad_diff, views_ok = 0.0, True
    for step in range(steps):
        x, y = _batch(step, per_rank)
        nn.functional.mse_loss(ref(x), y).backward()
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
        ddp.finish_gradient_synchronization()
        for p, q in zip(model.parameters(), ref.parameters()):
            grad_diff = max(grad_diff, ((p.grad - q.grad).abs().max() / q.grad.abs().max()).item())
        for b in ddp._buckets:  # each .grad is a view of its bucket's flat buffer, in the param dtype
            base = b.grad_buffer.untyped_storage().data_ptr()
            views_ok &= all(p.grad.untyped_storage().data_ptr() == base and p.grad.dtype == p.dtype for p in b.params)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    names = {id(q): n for n, q in model.named_parameters()}
    return {
        "grad_rel_diff": grad_diff,
        "param_diff": max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())),
        "launched_before_last_grad": launched_before_last_grad,
        "n_buckets": len(ddp._buckets),
        "initial_order": initial_order,
        "order": [names[id(b[0])] for b in ddp.bucket_params],
        "views_ok": views_ok,
        "comm_dtypes": sorted({str(b.comm_buffer.dtype) for b in ddp._buckets}),
    }


def _train_compiled_blocks(rank, per_rank=2):
    """A CookMindLM compiled block by block (aot_eager: same autograd structure as Inductor, no codegen)."""
    from cookmind.model import CookMindLM
    from cookmind.parallel import DDP, compile_blocks

    cfg = tiny_config(**SMALL, tie_word_embeddings=True)
    torch.manual_seed(3)
    ref = CookMindLM(cfg)
    torch.manual_seed(3)
    model = CookMindLM(cfg)
    compile_blocks(model, backend="aot_eager")
    ddp = DDP(model, bucket_size_mb=1e-9)
    ids = torch.randint(0, 32, (WORLD * per_rank, 8), generator=torch.Generator().manual_seed(9))
    ref(ids, labels=ids).loss.backward()
    mine = ids[rank * per_rank : (rank + 1) * per_rank]
    ddp(mine, labels=mine).loss.backward()
    ddp.finish_gradient_synchronization()
    return max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def _scenarios(rank):
    return {
        "fp32": _train(rank),
        "bf16": _train(rank, torch.bfloat16),
        "compiled_blocks_grad_diff": _train_compiled_blocks(rank),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_on_gloo_ranks(_scenarios, WORLD, tmp_path_factory.mktemp("overlap"))


@pytest.mark.timeout(120)
def test_buckets_launch_while_backward_runs(results):
    for r in results:
        counts = r["fp32"]["launched_before_last_grad"]
        # 6 single-parameter buckets. Step 1 uses reverse registration order, which puts the first
        # layer's buckets first: little can go before its weight's gradient is in. From step 2 on
        # (ready order) the last and middle layers' 4 buckets are on the wire by then.
        assert len(counts) == 3 and counts[0] <= 1 and counts[1] >= 4 and counts[2] >= 4, counts


def test_buckets_rebuilt_in_gradient_ready_order(results):
    r = results[0]["fp32"]
    assert r["initial_order"][0] == "first.bias"  # reverse registration order until observed
    assert r["order"][:2] in (["last.weight", "last.bias"], ["last.bias", "last.weight"])
    assert r["order"][-2:] in (["first.weight", "first.bias"], ["first.bias", "first.weight"])
    assert results[1]["fp32"]["order"] == r["order"]  # rank 0's order on every rank


def test_fp32_reduction_equals_full_batch_after_rebuild(results):
    for r in results:
        assert r["fp32"]["grad_rel_diff"] < 1e-5
        assert r["fp32"]["param_diff"] < 1e-6
        assert r["fp32"]["views_ok"]


def test_bf16_reduction_is_close_and_leaves_param_dtype_grads(results):
    for r in results:
        b = r["bf16"]
        assert b["comm_dtypes"] == ["torch.bfloat16"]
        assert b["grad_rel_diff"] < 2e-2  # bf16 keeps 8 bits of mantissa: ~0.4% per rounding
        assert b["views_ok"]


def test_ddp_over_compiled_blocks_equals_full_batch(results):
    for r in results:
        assert r["compiled_blocks_grad_diff"] < 1e-6, r["compiled_blocks_grad_diff"]


def _p(*shape, dtype=torch.float32):
    return nn.Parameter(torch.zeros(*shape, dtype=dtype))


def test_plan_buckets_sizes_first_bucket_and_kinds():
    params = [_p(256), _p(256), _p(256), _p(1024), _p(256), _p(256, dtype=torch.bfloat16)]
    # 1 KiB per 256 fp32; first bucket 1 KiB, the rest 2 KiB; bf16 param starts its own bucket
    assert plan_buckets(params, 2048, 1024) == [[0], [1, 2], [3], [4], [5]]
    assert plan_buckets(params, 2048) == [[0, 1], [2], [3], [4], [5]]
    # in bf16 each 256 is 512 bytes: three fit a 2 KiB bucket with the 1024-element one starting anew
    assert plan_buckets(params[:5], 2048, None, torch.bfloat16) == [[0, 1, 2], [3], [4]]
    assert plan_buckets(params, 1e9, 1e9) == [[0, 1, 2, 3, 4], [5]]
    with pytest.raises(ValueError, match="bucket size"):
        plan_buckets(params, 0)


def test_find_blocks_and_compile_blocks():
    from cookmind.parallel import compile_blocks

    model = tiny_lm(**SMALL)
    assert find_blocks(model) is model.model.layers
    ids = torch.randint(0, 32, (2, 8))
    before = model(ids).logits
    assert compile_blocks(model, backend="eager") == 2
    assert all(b._compiled_call_impl is not None for b in model.model.layers)
    torch.testing.assert_close(model(ids).logits, before)
    with pytest.raises(ValueError, match="no nn.ModuleList"):
        find_blocks(nn.Linear(2, 2))


def test_find_blocks_picks_the_layers_not_a_longer_list_of_experts():
    # 4 experts per block, 2 blocks: the experts' ModuleList is longer, but the blocks hold them all
    model = tiny_lm(**SMALL, num_experts=4)
    assert find_blocks(model) is model.model.layers
