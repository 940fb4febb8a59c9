"""Two processes over gloo (as torchrun starts them; PyTorch DDP with or without ZeRO-1, or ours + ZeRO-1 + activation
checkpointing) reach the same weights as one process with the same global batch."""

import json
import os
from pathlib import Path

import pytest
import torch
from gloo_fixtures import data_parallel_overrides, find_free_port, main_on_ranks
from lm_fixtures import tiny_lm

from cookmind.cli import main as cookmind_main
from cookmind.model import load_model
from cookmind.train import TrainConfig, Trainer
from cookmind.train.checkpoint import find_latest_checkpoint


@pytest.mark.parametrize(
    "ddp, zero1, checkpointing", [("torch", False, False), ("torch", True, False), ("ours", True, True)]
)  # ZeRO-1 shards the optimizer, not the model: it goes with either DDP
def test_two_gloo_processes_equal_one_process(tmp_path, keep_threads, ddp, zero1, checkpointing):
    common = [*data_parallel_overrides(tmp_path, max_steps=5), "logging.log_every=1"]  # every step's loss logged
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")

    argv = [
        "train",
        "--config",
        str(cfg_file),
        "--run-dir",
        str(tmp_path / "ddp"),
        "train.micro_batch_size=2",
        f"parallel.ddp={ddp}",
        f"parallel.zero1={str(zero1).lower()}",
        f"train.activation_checkpointing={str(checkpointing).lower()}",
        *common,
    ]  # the one-process run below never checkpoints activations: the results must not differ
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    printed = main_on_ranks(cookmind_main, [argv], tmp_path, env)  # two ranks as torchrun starts them
    summary = json.loads([line for out in printed for line in out[0].splitlines() if line.startswith("{")][-1])
    assert summary["steps"] == 5 and summary["tokens"] == 5 * 2 * 2 * 2 * 16  # steps x accum x ranks x batch x T
    meta = json.loads((find_latest_checkpoint(tmp_path / "ddp" / "checkpoints") / "meta.json").read_text())
    assert meta["world_size"] == 2

    torch.set_num_threads(1)  # keep_threads restores the count
    _compare_with_one_process(tmp_path, cfg_file, common)


def _compare_with_one_process(tmp_path, cfg_file, common):
    one = TrainConfig.load(str(cfg_file), common + [f"logging.run_dir={tmp_path / 'one'}", "train.micro_batch_size=4"])
    Trainer(one).fit()
    a = load_model(find_latest_checkpoint(tmp_path / "ddp" / "checkpoints")).state_dict()
    b = load_model(find_latest_checkpoint(tmp_path / "one" / "checkpoints")).state_dict()
    init = Trainer(TrainConfig.load(str(cfg_file), common + [f"logging.run_dir={tmp_path / 'x'}"])).bare_model
    moved = max((a[k] - init.state_dict()[k]).abs().max().item() for k in a)
    assert moved > 1e-3, "training must have changed the weights"
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), f"{k}: max diff {(a[k] - b[k]).abs().max()}"
    # the logged loss is the whole batch's, as one process logs it (it was rank 0's own rows': 5.780 against 5.767)
    losses = [
        [
            r["loss"]
            for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())
            if r.get("split") == "train"
        ]
        for run in ("ddp", "one")
    ]
    assert len(losses[0]) == len(losses[1]) == 5
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.parametrize("ddp", ["torch", "ours"])
@pytest.mark.parametrize("reduce_dtype", ["fp32", "bf16"])
def test_parallel_reduce_dtype_reaches_the_all_reduce(tmp_path, ddp, reduce_dtype):
    # One gloo process: the all-reduce average is the gradient itself, after a round trip through the wire
    # dtype. So bf16 reduction must leave exactly the bf16-rounded gradient, fp32 the gradient untouched.
    import torch.distributed as dist

    from cookmind.parallel import finish_gradient_sync, wrap_data_parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = tiny_lm()
        ref = tiny_lm()
        ref.load_state_dict(model.state_dict())
        if ddp == "torch" and reduce_dtype == "bf16":  # torch's bf16 hook is NCCL-only: a clear error on gloo
            with pytest.raises(ValueError, match="needs the NCCL backend"):
                wrap_data_parallel(model, ddp, 25.0, reduce_dtype)
            return
        wrapped = wrap_data_parallel(model, ddp, 25.0, reduce_dtype)
        ids = torch.randint(0, 64, (2, 16))
        wrapped(ids, labels=ids).loss.backward()
        finish_gradient_sync(wrapped)
        ref(ids, labels=ids).loss.backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            want = q.grad.to(torch.bfloat16).float() if reduce_dtype == "bf16" else q.grad
            torch.testing.assert_close(p.grad, want, rtol=0, atol=0, msg=name)
        if reduce_dtype == "bf16":  # and the rounding was visible: the test can tell the two apart
            assert any(not torch.equal(q.grad, q.grad.to(torch.bfloat16).float()) for q in ref.parameters())
    finally:
        wrapped = None  # the wrapper goes before the group (see _leave_group)
        _leave_group()


def test_torch_ddp_gradients_are_views_of_its_buckets():
    # gradient_as_bucket_view: each .grad lives in DDP's communication bucket instead of beside a copy of it, so a
    # DDP run holds its gradients once (the largest model DDP trains grows by 4 bytes a parameter's worth)
    import torch.distributed as dist

    from cookmind.parallel import finish_gradient_sync, wrap_data_parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = tiny_lm()
        wrapped = wrap_data_parallel(model, "torch", 25.0, "fp32")
        ids = torch.randint(0, 64, (2, 16))
        for _ in range(2):  # the buckets are rebuilt in the order gradients arrived after the first backward
            model.zero_grad(set_to_none=True)
            wrapped(ids, labels=ids).loss.backward()
            finish_gradient_sync(wrapped)
        grads = [p.grad for p in model.parameters()]
        storages = {g.untyped_storage().data_ptr() for g in grads}
        assert len(grads) > 10 and len(storages) == 1, f"{len(storages)} storages for {len(grads)} gradients"
    finally:
        wrapped = None  # the wrapper goes before the group (see _leave_group)
        _leave_group()


def test_a_second_wrapper_of_our_ddp_over_the_same_model_takes_its_gradients_over():
    """A Trainer per round over one model (expert iteration) wraps it in a new DDP each round: the earlier
    wrapper's hooks must go, or they mark every gradient arrived a second time ("arrived twice" on the second
    backward). One gloo process: the averaged gradients equal a plain model's, over two backward passes."""
    import torch.distributed as dist

    from cookmind.parallel import finish_gradient_sync, wrap_data_parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model, ref = tiny_lm(), tiny_lm()
        ref.load_state_dict(model.state_dict())
        first = wrap_data_parallel(model, "ours", 25.0, "fp32")
        ids = torch.randint(0, 64, (2, 16))
        first(ids, labels=ids).loss.backward()
        finish_gradient_sync(first)
        wrapped = wrap_data_parallel(model, "ours", 25.0, "fp32")  # the next round's
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            wrapped(ids, labels=ids).loss.backward()
            finish_gradient_sync(wrapped)
        ref(ids, labels=ids).loss.backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    finally:
        first = wrapped = None  # the wrappers go before the group (see _leave_group)
        _leave_group()


def _leave_group() -> None:
    """Leave the test's process group once the caller dropped its DDP wrapper. Freed after the group, DDP's reducer
    frees the group in its destructor while holding the GIL, and a gloo thread waiting for the GIL hangs the test
    (seen here: pytest stuck in ~ProcessGroupGloo at a test's exit; Trainer.close does the same for the Trainer)."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()


def _close_drops_ddp(rank: int) -> dict:
    import gc

    from torch.nn.parallel import DistributedDataParallel

    root, overrides = os.environ["DDP_CLOSE_ROOT"], json.loads(os.environ["DDP_CLOSE_OVERRIDES"])
    overrides = overrides + [f"logging.run_dir={root}/run0"]  # one run directory for the job
    trainer = Trainer(TrainConfig.load("tiny-cpu", overrides + ["train.micro_batch_size=2", "parallel.ddp=torch"]))
    trainer.fit()
    held = lambda: sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())  # noqa: E731
    before = held()
    trainer.close()
    return {"before": before, "after": held(), "bare": trainer.model is trainer.bare_model}


def test_close_drops_ddp_so_leaving_the_group_frees_it(tmp_path, keep_threads):
    # `cookmind train` under torchrun hung at exit now and then (its ranks stuck in ProcessGroupGloo's destructor,
    # reached from DDP's reducer while holding the GIL); close() lets the group's registry hold its last reference
    from gloo_fixtures import run_on_gloo_ranks

    os.environ["DDP_CLOSE_ROOT"] = str(tmp_path)
    os.environ["DDP_CLOSE_OVERRIDES"] = json.dumps(data_parallel_overrides(tmp_path, max_steps=1))
    try:
        ranks = run_on_gloo_ranks(_close_drops_ddp, 2, tmp_path)
    finally:
        del os.environ["DDP_CLOSE_ROOT"], os.environ["DDP_CLOSE_OVERRIDES"]
    for r in ranks:
        assert r == {"before": 1, "after": 0, "bare": True}, r
