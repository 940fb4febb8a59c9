"""GRPO under torch.distributed: two gloo processes split the rollouts and stay in sync."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_align_fixtures import XYZ, x_fraction


def _worker(rank, world, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from cookmind.align.grpo import GRPOConfig, run_grpo
    from cookmind.model import CookMindConfig, CookMindLM

    torch.manual_seed(0)  # the same start on every rank
    model = CookMindLM(CookMindConfig(vocab_size=5, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = GRPOConfig(n_steps=2, rollout_batch_size=16, group_size=4, train_batch_size=16, learning_rate=1e-2,
                     max_new_tokens=4, template="{question}", stop_strings=(), eval_every=0)
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 5)]
    seen = []
    import cookmind.align.grpo as grpo

    real = grpo.collect_rollouts

    def spy(model, tokenizer, prompt_ids, *args, **kw):  # record which prompts this rank rolled out
        seen.append([len(p) for p in prompt_ids])
        return real(model, tokenizer, prompt_ids, *args, **kw)

    grpo.collect_rollouts = spy
    hist = run_grpo(model, XYZ(), problems, cfg, reward_fn=x_fraction, progress=False)
    torch.save({"state": model.state_dict(), "start": start, "seen": seen, "hist": hist}, os.path.join(out_dir, f"r{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_grpo_two_gloo_ranks_split_rollouts_and_sync_gradients(tmp_path):
    pytest.importorskip("cookmind.model")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = torch.load(tmp_path / "r0.pt"), torch.load(tmp_path / "r1.pt")
    # each step, the 4 prompts are split 2 + 2 across ranks, never overlapping
    for a, b in zip(r0["seen"], r1["seen"]):
        assert len(a) == 2 and len(b) == 2 and not set(a) & set(b)
    # gradients were averaged: both ranks hold the same weights, and they moved
    for k in r0["state"]:
        torch.testing.assert_close(r0["state"][k], r1["state"][k])
    assert any(not torch.equal(r0["state"][k], r0["start"][k]) for k in r0["state"])
    assert r0["hist"][-1]["reward"] == pytest.approx(r1["hist"][-1]["reward"])  # metrics reduced over ranks
