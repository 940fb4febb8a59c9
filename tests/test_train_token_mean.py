"""SFT's loss is the mean over the global batch's supervised tokens, however the batch is split into micro-batches
(and ranks: tests/test_train_fsdp.py's SFT and LoRA scenarios have records of different trained lengths).

It was the mean of the micro-batch means: a token of a micro-batch with few supervised tokens weighed more, so a
run with train.grad_accum_steps=2 (or two processes) trained another model than one process with the whole batch.
The reference here is plain PyTorch: the model's logits, F.cross_entropy over every supervised token of the four
records at once, and the norm of its gradient.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lm_fixtures import TINY, tiny_lm

from cookmind.model.model_io import load_model, save_model
from cookmind.store import write_store
from cookmind.train import TrainConfig, Trainer

SUPERVISED = [2, 4, 7, 10]  # trained tokens of the four records: micro-batch means weigh them unequally


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("token_mean")
    rng = np.random.default_rng(0)
    records = [
        {"sequence": rng.integers(1, 64, size=16), "loss_mask": np.array([0] * (16 - n) + [1] * n)} for n in SUPERVISED
    ]
    write_store(root / "sft", "sft", records, vocab_size=64)
    torch.manual_seed(5)
    save_model(root / "init", tiny_lm())
    return root, records


def _one_step_config(root, objective: str, window: int, micro: int, accum: int, run, **sections) -> TrainConfig:
    """One fp32 CPU step of ``objective`` on ``root``'s store of that name from ``root``/init, unclipped."""
    return TrainConfig.from_dict(
        {
            "data": {"train_path": str(root / objective), "window_size": window, "shuffle": False},
            "train": {
                "objective": objective,
                "max_steps": 1,
                "micro_batch_size": micro,
                "grad_accum_steps": accum,
                "device": "cpu",
                "threads": 1,
                "init_from": str(root / "init"),
            },
            "optim": {"lr": 1e-3, "warmup_steps": 0, "grad_clip": 0.0},
            "checkpoint": {"every": 0},
            "eval": {"every": 0},
            "logging": {"run_dir": str(run), "progress": False, "report": False},
            **sections,
        }
    )


def _first_step(root, micro: int, accum: int) -> dict:
    Trainer(_one_step_config(root, "sft", 16, micro, accum, root / f"run-{micro}x{accum}")).fit()
    rows = [json.loads(line) for line in (root / f"run-{micro}x{accum}" / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r.get("split") == "train")


def _reference(root, records) -> tuple[float, float]:
    model = load_model(root / "init").float().train()
    ids = torch.tensor(np.stack([r["sequence"] for r in records]), dtype=torch.long)
    mask = torch.tensor(np.stack([r["loss_mask"] for r in records]), dtype=torch.bool)
    logits = model(ids).logits[:, :-1]
    targets = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return loss.item(), norm.item()


@pytest.mark.parametrize("micro, accum", [(4, 1), (2, 2), (1, 4)])
def test_the_sft_loss_and_gradient_are_the_global_token_mean_however_the_batch_is_split(data, micro, accum):
    root, records = data
    loss, norm = _reference(root, records)
    row = _first_step(root, micro, accum)
    assert row["supervised_tokens"] * accum == sum(SUPERVISED)  # logged as the mean per micro-batch
    assert row["loss"] == pytest.approx(loss, rel=1e-5)
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-5)


def _steps_items(root, micro: int, accum: int, steps: int) -> list[list[tuple]]:
    """The records (as token tuples) each step reads, in order, from a store of 10 and shuffled epochs."""
    cfg = TrainConfig.from_dict(
        {
            "data": {"train_path": str(root / "sft10"), "window_size": 16},
            "train": {
                "objective": "sft",
                "micro_batch_size": micro,
                "grad_accum_steps": accum,
                "device": "cpu",
                "init_from": str(root / "init"),
            },
            "logging": {"run_dir": str(root / f"items-{micro}x{accum}"), "progress": False, "report": False},
        }
    )
    t = Trainer(cfg)
    return [
        sorted(tuple(row) for _ in range(accum) for row in t._take_batch()["input_ids"].tolist()) for _ in range(steps)
    ]


def test_every_split_of_the_global_batch_reads_the_same_records_across_epoch_ends(data):
    # epochs ended per micro-batch: with 10 records and a global batch of 4, one micro-batch of 4 dropped the last 2
    # and began epoch 1, while 4 micro-batches of 1 trained those 2 with 2 of epoch 1 in the same step, and from then
    # on every step differed (so did a two-process run resumed in one process with the accumulation doubled)
    root, _ = data
    rng = np.random.default_rng(1)
    records = [{"sequence": rng.integers(1, 64, size=16), "loss_mask": np.array([0] * 8 + [1] * 8)} for _ in range(10)]
    write_store(root / "sft10", "sft", records, vocab_size=64)
    whole = _steps_items(root, 4, 1, 6)
    assert _steps_items(root, 2, 2, 6) == whole and _steps_items(root, 1, 4, 6) == whole
    everyone = {tuple(r["sequence"].tolist()) for r in records}
    epoch0 = set(whole[0]) | set(whole[1])
    assert len(epoch0) == 8 and epoch0 <= everyone  # 2 steps of 4, the 2 records left over dropped
    assert len(set(whole[2]) | set(whole[3])) == 8  # epoch 1 begins at step 3, whole
    with pytest.raises(ValueError, match=r"training set \(10 items\) is smaller than one global batch \(12: "):
        _steps_items(root, 4, 3, 1)


@pytest.fixture(scope="module")
def offline_grpo(tmp_path_factory):
    from lm_fixtures import CORPUS

    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    root = tmp_path_factory.mktemp("grpo_token_mean")
    (root / "corpus.txt").write_text(CORPUS)
    vocab, merges = train_bpe(root / "corpus.txt", 300, DEFAULT_SPECIAL_TOKENS)
    Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).save(root / "tok")
    rng = np.random.default_rng(2)
    records = [  # stored responses of 2 to 12 tokens, each with its reward: REINFORCE on the raw reward
        {
            "prompts": rng.integers(40, 250, size=4),
            "responses": rng.integers(40, 250, size=n),
            "masks": np.ones(n, dtype=np.int64),
            "rewards": np.array([r]),
        }
        for n, r in ((2, 1.0), (12, -0.5), (5, 2.0), (9, 0.3))
    ]
    write_store(root / "grpo", "grpo", records, vocab_size=300)
    return root


def _grpo_first_step(root, micro: int, accum: int, normalization: str) -> dict:
    from cookmind.align.objective import GRPOConfig, GRPOObjective

    run = root / f"run-{normalization}-{micro}x{accum}"
    cfg = TrainConfig.from_dict(
        {
            "model": {**TINY, "vocab_size": 300, "max_position_embeddings": 32},
            "data": {
                "train_path": str(root / "grpo"),
                "tokenizer": str(root / "tok"),
                "window_size": 32,
                "shuffle": False,
            },
            "train": {
                "objective": "grpo",
                "max_steps": 1,
                "micro_batch_size": micro,
                "grad_accum_steps": accum,
                "device": "cpu",
                "threads": 1,
                "seed": 0,
            },  # fmt: skip
            "optim": {"lr": 1e-3, "warmup_steps": 0, "grad_clip": 0.0},
            "checkpoint": {"every": 0},
            "eval": {"every": 0},
            "logging": {"run_dir": str(run), "progress": False, "report": False},
        }
    )
    objective = GRPOObjective(GRPOConfig(loss_type="no_baseline", length_normalization=normalization))
    Trainer(cfg, objective=objective).fit()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r.get("split") == "train")


def test_grpo_token_normalization_is_over_the_global_batch_however_it_is_split(offline_grpo):
    # DAPO's token-level loss: every response token of the batch weighs the same. It was each micro-batch's mean,
    # averaged: a token of a micro-batch of short answers weighed more
    whole = _grpo_first_step(offline_grpo, 4, 1, "token")
    for micro, accum in ((2, 2), (1, 4)):
        split = _grpo_first_step(offline_grpo, micro, accum, "token")
        assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
        assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    # the sequence mean is the same at any split of equal micro-batches: a mean of means of equal counts
    seq = _grpo_first_step(offline_grpo, 4, 1, "sequence")
    assert _grpo_first_step(offline_grpo, 1, 4, "sequence")["grad_norm"] == pytest.approx(seq["grad_norm"], rel=1e-5)
    assert seq["loss"] != pytest.approx(whole["loss"], rel=1e-3)  # and another loss than the token mean


CHOSEN = [1, 2, 6, 9]  # trained tokens of the four chosen responses: micro-batches of 3 and of 15


@pytest.fixture(scope="module")
def dpo_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo_nll")
    rng = np.random.default_rng(1)
    records = [
        {
            "chosen": rng.integers(1, 64, size=12),
            "rejected": rng.integers(1, 64, size=12),
            "chosen_mask": np.array([0] * (12 - n) + [1] * n),
            "rejected_mask": np.array([0] * 8 + [1] * 4),
        }
        for n in CHOSEN
    ]
    write_store(root / "dpo", "dpo", records, vocab_size=64)
    torch.manual_seed(7)
    save_model(root / "init", tiny_lm())
    return root, records


def _dpo_first_step_grads(root, micro: int, accum: int, reduction: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """The first step's metrics row and the gradients the optimizer was given (fp32, CPU)."""
    run = root / f"run-{reduction}-{micro}x{accum}"
    dpo = {"beta": 0.5, "reduction": reduction, "nll_weight": 1.0}
    trainer = Trainer(_one_step_config(root, "dpo", 12, micro, accum, run, dpo=dpo))
    grads, step = {}, trainer.optimizer.step

    def keep_grads(*args, **kwargs):
        grads.update({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    trainer.optimizer.step = keep_grads
    trainer.fit()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r.get("split") == "train"), grads


def _dpo_reference(root, records, reduction: str) -> tuple[float, dict[str, torch.Tensor]]:
    """Plain PyTorch on the four pairs at once: the pairs' mean of -log sigma(beta h), plus each chosen response's
    mean token NLL averaged over the pairs (RPO's length-normalised NLL); its loss and gradients."""
    policy = load_model(root / "init").float().train()
    ref = load_model(root / "init").float().eval()

    def logps(model, side):
        ids = torch.tensor(np.stack([r[side] for r in records]), dtype=torch.long)
        mask = torch.tensor(np.stack([r[f"{side}_mask"] for r in records]), dtype=torch.bool)[:, 1:]
        token = F.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        total = (token * mask).sum(-1)
        return total, total / mask.sum(-1)

    with torch.no_grad():
        ref_c, ref_r = (logps(ref, side)[reduction == "mean"] for side in ("chosen", "rejected"))
    (pc_sum, pc_mean), pr = logps(policy, "chosen"), logps(policy, "rejected")
    pc = pc_mean if reduction == "mean" else pc_sum
    h = (pc - pr[reduction == "mean"]) - (ref_c - ref_r)
    loss = -F.logsigmoid(0.5 * h).mean() - pc_mean.mean()
    loss.backward()
    return loss.item(), {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_dpo_nll_weight_gives_the_same_gradient_however_the_batch_is_split(dpo_data, reduction):
    """dpo.nll_weight's term was each micro-batch's mean over its chosen tokens, averaged over micro-batches: with
    grad_accum_steps=2 a token of the micro-batch of short answers (3 tokens) weighed five times one of the other
    (15), and the step trained another model than one micro-batch of the four pairs. It is now each chosen response's
    mean token NLL averaged over the pairs, as the DPO term is a mean over pairs: the same at any split."""
    root, records = dpo_data
    whole_row, whole = _dpo_first_step_grads(root, 4, 1, reduction)
    split_row, split = _dpo_first_step_grads(root, 2, 2, reduction)
    assert split.keys() == whole.keys()
    for name, g in split.items():  # 2 micro-batches of 2 pairs = 1 of the 4 pairs
        torch.testing.assert_close(g, whole[name], rtol=1e-4, atol=1e-6, msg=f"{name}: 2x2 against 4x1")
    assert split_row["loss"] == pytest.approx(whole_row["loss"], rel=1e-5)
    loss, want = _dpo_reference(root, records, reduction)  # and both are the loss the docstring names
    assert whole_row["loss"] == pytest.approx(loss, rel=1e-5)
    assert whole.keys() == want.keys()
    for name, g in whole.items():
        torch.testing.assert_close(g, want[name], rtol=1e-4, atol=1e-6, msg=f"{name}: 4x1 against plain PyTorch")
