"""GRPO through the Trainer under torch.distributed: two gloo processes split the stream and stay in sync."""

import os

import pytest
import torch
from gloo_fixtures import find_free_port, spawn_ranks
from lm_fixtures import MICRO, tiny_config
from test_align_fixtures import XYZ, x_fraction


def _worker(rank, world, port, out_dir):
    torch.set_num_threads(1)
    os.environ.update(
        WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch.distributed as dist

    from cookmind.align.objective import GRPOConfig, GRPOObjective
    from cookmind.model import CookMindLM
    from cookmind.train import TrainConfig, Trainer

    torch.manual_seed(0)  # the same start on every rank
    model = CookMindLM(tiny_config(**MICRO, vocab_size=5, max_position_embeddings=32))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 9)]
    seen = []

    objective = GRPOObjective(
        GRPOConfig(group_size=4, max_new_tokens=4, template="{question}", stop_strings=()),
        reward_fn=x_fraction,
        problems=problems,
    )
    real = objective._next_problems

    def spy(trainer):
        batch = real(trainer)
        seen.append(batch["prompt_lengths"].tolist())
        return batch

    objective.next_batch = spy
    cfg = TrainConfig.from_dict(
        {
            "train": {"objective": "grpo", "max_steps": 2, "micro_batch_size": 2, "device": "cpu", "seed": 0},
            "optim": {"lr": 1e-2, "schedule": "constant"},
            "parallel": {"backend": "gloo"},
            "logging": {"run_dir": os.path.join(out_dir, "run"), "progress": False, "report": False, "log_every": 1},
        }
    )
    trainer = Trainer(cfg, model=model, objective=objective, tokenizer=XYZ())
    trainer.fit()
    torch.save(
        {"state": trainer.bare_model.state_dict(), "start": start, "seen": seen}, os.path.join(out_dir, f"r{rank}.pt")
    )
    trainer.close()  # DDP's wrapper goes before the group it holds (freed after it, a rank can hang at exit)
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_grpo_two_gloo_ranks_split_the_stream_and_sync_gradients(tmp_path):
    spawn_ranks(_worker, (2, find_free_port(), str(tmp_path)), 2)
    r0, r1 = torch.load(tmp_path / "r0.pt"), torch.load(tmp_path / "r1.pt")
    # step k: rank 0 takes problems [4k, 4k+2), rank 1 [4k+2, 4k+4): the stream's 8 problems once each
    assert r0["seen"] == [[1, 2], [5, 6]] and r1["seen"] == [[3, 4], [7, 8]]
    # gradients were averaged: both ranks hold the same weights, and they moved
    for k in r0["state"]:
        torch.testing.assert_close(r0["state"][k], r1["state"][k], rtol=0, atol=0)
    assert any(not torch.equal(r0["state"][k], r0["start"][k]) for k in r0["state"])
