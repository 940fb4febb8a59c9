"""Interrupt + resume equals one uninterrupted run, bit for bit on CPU: pretrain, sft, dpo, dpo+LoRA."""

import numpy as np
import pytest
import torch
from lm_fixtures import TINY, tiny_lm

from cookmind.model import save_model
from cookmind.store import write_store
from cookmind.train import Callback, TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread", "keep_threads")  # each test starts on one thread


def _stores(tmp):
    rng = np.random.default_rng(0)
    seq = [{"sequence": rng.integers(1, 64, size=int(rng.integers(30, 50)))} for _ in range(10)]
    write_store(tmp / "seq", "seq", seq, vocab_size=64)
    sft, dpo = [], []
    for _ in range(24):
        n = int(rng.integers(8, 14))
        mask = np.zeros(n, np.int64)
        mask[n // 2 :] = 1
        sft.append({"sequence": rng.integers(1, 64, size=n), "loss_mask": mask})
        dpo.append(
            {
                "chosen": rng.integers(1, 64, size=n),
                "rejected": rng.integers(1, 64, size=n),
                "chosen_mask": mask,
                "rejected_mask": mask,
            }
        )
    write_store(tmp / "sft", "sft", sft, vocab_size=64)
    write_store(tmp / "dpo", "dpo", dpo, vocab_size=64)
    torch.manual_seed(123)
    save_model(tmp / "init", tiny_lm())


class StopAt(Callback):
    """Simulates an interruption: the same path as SIGTERM (request_stop -> checkpoint -> return)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer, step, metrics):
        if step == self.step:
            trainer.request_stop("test interruption")


CASES = {
    "pretrain": ({"train": {"objective": "pretrain"}, "data": {"train_path": "seq"}}, {"model": dict(TINY)}),
    "sft": ({"train": {"objective": "sft"}, "data": {"train_path": "sft"}}, {"model": dict(TINY)}),
    "dpo": (
        {
            "train": {"objective": "dpo", "init_from": "init"},
            "data": {"train_path": "dpo"},
            "dpo": {"beta": 0.5, "loss": "sigmoid", "label_smoothing": 0.1},
        },
        {},
    ),
    "dpo-lora": (
        {
            "train": {"objective": "dpo", "init_from": "init"},
            "data": {"train_path": "dpo"},
            "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.1},
            "dpo": {"reduction": "mean"},
        },
        {},
    ),
}


def _config(tmp, case, run_dir, resume=None):
    base, extra = CASES[case]
    d = {
        "data": {"window_size": 16},
        "train": {"max_steps": 8, "micro_batch_size": 4, "grad_accum_steps": 2, "seed": 7},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "min_lr_ratio": 0.1},
        "checkpoint": {"every": 2, "keep_last": 2, "resume": resume},
        "logging": {"run_dir": str(run_dir), "progress": False, "report": False, "log_every": 1},
        **extra,
    }
    for section, values in base.items():
        d.setdefault(section, {}).update(values)
    if "train_path" in d["data"]:
        d["data"]["train_path"] = str(tmp / d["data"]["train_path"])
    if d["train"].get("init_from"):
        d["train"]["init_from"] = str(tmp / d["train"]["init_from"])
    return TrainConfig.from_dict(d)


@pytest.mark.parametrize("case", list(CASES))
def test_interrupt_and_resume_is_bit_identical(tmp_path, case):
    _stores(tmp_path)
    full = Trainer(_config(tmp_path, case, tmp_path / "full"))
    whole = full.fit()
    assert whole["status"] == "completed"

    first = Trainer(_config(tmp_path, case, tmp_path / "cut"), callbacks=[StopAt(3)])
    summary = first.fit()
    assert summary["status"] == "stopped" and summary["steps"] == 3
    assert (tmp_path / "cut" / "checkpoints" / "step_00000003" / "meta.json").is_file()

    resumed = Trainer(_config(tmp_path, case, tmp_path / "cut", resume="auto"))
    assert resumed.step == 3
    summary = resumed.fit()
    assert summary["status"] == "completed"
    # the summary's train_* means are over the run's last steps: the resumed run's took only the 5 since the resume
    means = {k: v for k, v in whole.items() if k.startswith("train_")}
    assert means["train_means_over_steps"] == 8 and means == {k: v for k, v in summary.items() if k in means}

    a, b = full.bare_model.state_dict(), resumed.bare_model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{case}: {k} differs after resume"
    # and training really moved the weights (the comparison is not between two untouched models)
    init = Trainer(_config(tmp_path, case, tmp_path / "init_run")).bare_model.state_dict()
    assert any(not torch.equal(init[k], a[k]) for k in a)


def test_resuming_a_pruned_checkpoint_says_it_is_gone_and_names_those_kept(tmp_path):
    _stores(tmp_path)
    assert Trainer(_config(tmp_path, "pretrain", tmp_path / "run")).fit()["status"] == "completed"
    gone = tmp_path / "run" / "checkpoints" / "step_00000002"  # keep_last=2 pruned it: step 6 and 8 remain
    assert not gone.exists()
    with pytest.raises(FileNotFoundError) as info:  # was: 'no complete checkpoint there'
        Trainer(_config(tmp_path, "pretrain", tmp_path / "run", resume=str(gone)))
    message = str(info.value)
    assert "does not exist" in message and "step_00000006, step_00000008" in message


def test_resuming_on_another_store_too_small_for_a_batch_names_the_store_not_the_batch_size(tmp_path):
    # it said 'smaller than one micro-batch per rank: lower train.micro_batch_size', which only led to the
    # refusal of the other store
    _stores(tmp_path)
    assert Trainer(_config(tmp_path, "pretrain", tmp_path / "run")).fit()["status"] == "completed"
    write_store(tmp_path / "small", "seq", [{"sequence": np.arange(1, 40)}], vocab_size=64)  # 2 windows < 4
    cfg = _config(tmp_path, "pretrain", tmp_path / "run", resume="auto")
    cfg.data.train_path = str(tmp_path / "small")
    with pytest.raises(ValueError, match="trained on the training store .*/seq .*, not on .*/small"):
        Trainer(cfg)


def test_a_resumed_runs_report_covers_the_whole_run_and_says_where_it_resumed(tmp_path, monkeypatch):
    """The report of a run stopped at step 3 and resumed plots steps 1-8, both attempts; its summary's `seconds` were
    the last attempt's alone (a resumed run seemed to train 8 steps in the time of 5), and nothing said so. It says
    `resumed_from_step` now: the step this attempt began at, its seconds counted from there."""
    from cookmind.train import report

    _stores(tmp_path)
    plotted = {}
    real = report.plot_series
    monkeypatch.setattr(
        report, "plot_series", lambda path, s, *a, **kw: (plotted.update({path.name: s}), real(path, s, *a, **kw))[1]
    )

    def config(resume=None):
        cfg = _config(tmp_path, "pretrain", tmp_path / "cut", resume=resume)
        cfg.logging.report = True
        return cfg

    first = Trainer(config(), callbacks=[StopAt(3)]).fit()
    assert "resumed_from_step" not in first
    summary = Trainer(config("auto")).fit()
    assert summary["resumed_from_step"] == 3 and summary["steps"] == 8
    assert plotted["loss.png"]["train"][0] == list(range(1, 9))  # both attempts' steps
    assert "| resumed_from_step | 3 |" in (tmp_path / "cut" / "report.md").read_text()


def test_resume_naming_the_run_checks_its_newest_checkpoints_sha256s_under_a_bar(tmp_path, capsys, monkeypatch):
    """`--resume RUN` into a run directory holding checkpoints first checked that RUN is this directory's own, and
    that check hashed the newest checkpoint's weights and optimizer state (minutes for a large model) with no bar;
    the resume's bar that came after had nothing left to read. With logging.progress the check is under a bar."""
    from tqdm import tqdm

    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)
    _stores(tmp_path)
    first = Trainer(_config(tmp_path, "pretrain", tmp_path / "cut"), callbacks=[StopAt(2)])
    assert first.fit()["status"] == "stopped"
    step = tmp_path / "cut" / "checkpoints" / "step_00000002"
    checked = [p for p in step.iterdir() if p.name != "meta.json"]  # every file it recorded a SHA-256 of
    size = tqdm.format_sizeof(sum(p.stat().st_size for p in checked))
    cfg = _config(tmp_path, "pretrain", tmp_path / "cut", resume=str(tmp_path / "cut"))
    cfg.logging.progress = True
    capsys.readouterr()
    resumed = Trainer(cfg)
    resumed.close()
    assert resumed.step == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "checking" in line]
    assert lines and f"100% {size}/{size}" in lines[-1], err
