"""Checkpoints: atomic layout, keep-last-K, newest complete found, weights/optimizer round trip."""

import json

import pytest
import torch
from lm_fixtures import tiny_lm as _model

from cookmind.optim import AdamW
from cookmind.train.checkpoint import find_latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def _train_a_bit(model, opt):
    ids = torch.randint(0, 32, (2, 8))
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


def test_round_trip_restores_weights_and_optimizer_exactly(tmp_path):
    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2)
    _train_a_bit(model, opt)
    path = save_checkpoint(tmp_path, 1, model, opt, {"tokens_seen": 16})
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "meta.json", "model.safetensors", "optimizer.pt"]
    other = _model()
    opt2 = AdamW(other.parameters(), lr=1e-2)
    meta = load_checkpoint(path, other, opt2)
    assert meta["step"] == 1 and meta["tokens_seen"] == 16
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), k
    # the next step is identical too (optimizer moments and step counts came back)
    torch.manual_seed(5)
    _train_a_bit(model, opt)
    torch.manual_seed(5)
    _train_a_bit(other, opt2)
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), k


def test_keep_last_and_newest_complete(tmp_path):
    model = _model()
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, model, None, {}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000020", "step_00000030"]
    # a half-written checkpoint (temp name, or no meta.json) is never picked
    (tmp_path / ".tmp-step_00000040-1").mkdir()
    (tmp_path / "step_00000050").mkdir()
    assert find_latest_checkpoint(tmp_path).name == "step_00000030"
    assert json.loads((tmp_path / "step_00000030" / "meta.json").read_text())["complete"] is True


def test_loading_into_another_shape_is_a_clear_error(tmp_path):
    path = save_checkpoint(tmp_path, 1, _model(), None, {})
    bigger = _model(hidden_size=64)
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint(path, bigger)


def test_missing_meta_is_a_clear_error(tmp_path):
    (tmp_path / "step_00000001").mkdir()
    with pytest.raises(FileNotFoundError, match="meta.json"):
        load_checkpoint(tmp_path / "step_00000001", _model())


def test_weights_files_get_the_umask_modes_their_neighbours_get(tmp_path):
    """safetensors' save_file creates its file 0600 whatever the umask: a checkpoint's or an export's
    model.safetensors (and an adapter's) was readable by its owner only, beside 0644 config and tokenizer files, so
    a server or a colleague under another account could read config.json but not the weights."""
    import os
    import stat

    from cookmind.model import save_model
    from cookmind.model.hf import export_hf, import_hf
    from cookmind.model.lora import apply_lora, save_adapter

    old = os.umask(0o022)
    try:
        model = _model()
        save_model(tmp_path / "ckpt", model)
        export_hf(tmp_path / "ckpt", tmp_path / "hf")
        import_hf(tmp_path / "hf", tmp_path / "back")
        apply_lora(model, 2, 4.0, 0.0, ["q_proj"])
        save_adapter(tmp_path / "adapter", model)
    finally:
        os.umask(old)
    for f in (
        "ckpt/model.safetensors",
        "hf/model.safetensors",
        "back/model.safetensors",
        "adapter/adapter_model.safetensors",
    ):
        mode = stat.S_IMODE((tmp_path / f).stat().st_mode)
        assert mode == 0o644, f"{f}: {oct(mode)}"


def _flip_a_byte(path, at=-100):
    """One bit of ``path`` flipped, its size kept: the damage a header check cannot see."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_checkpoints_record_each_files_sha256_and_refuse_a_damaged_one(tmp_path):
    """A bit flipped in model.safetensors' tensor data loaded as other weights, without a word (a header-level check
    cannot see it), and a damaged optimizer.pt resumed other moments. A save now records each file's SHA-256 in
    meta.json (checked here with hashlib); resume, export and load check them and name the file; --resume auto
    passes a damaged newest checkpoint over with a warning; a checkpoint saved before hashes loads as before."""
    import hashlib
    import warnings

    from cookmind.model.hf import export_hf
    from cookmind.model.model_io import CheckpointWarning, ModelLoadError, load_model

    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2)
    _train_a_bit(model, opt)
    first = save_checkpoint(tmp_path, 1, model, opt, {})
    newest = save_checkpoint(tmp_path, 2, model, opt, {})
    recorded = json.loads((newest / "meta.json").read_text())["sha256"]
    names = ["config.json", "model.safetensors", "optimizer.pt"]
    assert recorded == {n: hashlib.sha256((newest / n).read_bytes()).hexdigest() for n in names}
    _flip_a_byte(newest / "model.safetensors")
    damaged = r"step_00000002/model\.safetensors: does not match the SHA-256 .* or changed; use an earlier checkpoint"
    for load in (
        lambda: load_checkpoint(newest, _model(), AdamW(_model().parameters())),
        lambda: load_model(newest),
        lambda: export_hf(newest, tmp_path.with_name(tmp_path.name + "-hf")),  # not among the step_N folders
    ):
        with pytest.raises(ModelLoadError, match=damaged):
            load()
    with pytest.warns(CheckpointWarning, match=r"skipping checkpoint .*step_00000002: .*model\.safetensors"):
        assert find_latest_checkpoint(tmp_path, need_optimizer=True) == first
    _flip_a_byte(first / "optimizer.pt", at=len((first / "optimizer.pt").read_bytes()) // 2)
    with pytest.raises(ModelLoadError, match=r"step_00000001/optimizer\.pt: does not match the SHA-256"):
        load_checkpoint(first, _model(), AdamW(_model().parameters()))
    load_checkpoint(first, _model())  # the weights alone are whole: loading them (no optimizer) is fine
    # a LoRA run's adapter, loaded to resume or to serve
    from cookmind.model.lora import apply_lora, load_adapter

    adapted = _model()
    apply_lora(adapted, r=2, alpha=4)
    lora = save_checkpoint(tmp_path / "lora", 1, adapted, None, {})
    _flip_a_byte(lora / "adapter_model.safetensors")
    with pytest.raises(ModelLoadError, match=r"step_00000001/adapter_model\.safetensors: does not match the SHA-256"):
        load_adapter(_model(), lora)
    # a checkpoint saved before meta.json held hashes loads as it did
    meta = json.loads((newest / "meta.json").read_text())
    del meta["sha256"]
    (newest / "meta.json").write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_latest_checkpoint(tmp_path) == newest
        load_model(newest)


def test_a_tokenizer_folder_that_is_a_model_lends_only_its_tokenizer_files(tmp_path):
    # a LoRA checkpoint named as --tokenizer gave a plain run's checkpoints its adapter files (and its optimizer.pt)
    src = tmp_path / "lora_ckpt"
    src.mkdir()
    for name in (
        "cookmind_tokenizer.json",
        "tokenizer.json",
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.pt",
        "meta.json",
        "notes.txt",
    ):
        (src / name).write_text("{}")
    model = _model()
    path = save_checkpoint(tmp_path / "run", 1, model, None, {}, tokenizer_dir=src)
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "cookmind_tokenizer.json",
        "meta.json",
        "model.safetensors",
        "tokenizer.json",
    ]


def test_a_run_directory_holding_only_what_a_dpo_or_grpo_run_wrote_is_a_runs(tmp_path):
    # `train --overwrite` of a DPO run was refused: "runs/dpo holds files a training run did not write
    # (objective.png)", the plot of its reward margin that the run's own report wrote
    from cookmind.train.checkpoint import check_run_dir, refuse_foreign_files
    from cookmind.train.metrics import MetricsWriter
    from cookmind.train.report import write_report

    run = tmp_path / "dpo"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("train: {objective: dpo}\n")
    writer = MetricsWriter(run / "metrics.jsonl")
    for step in (1, 2):
        writer.write({"step": step, "split": "train", "loss": 0.69, "lr": 1e-3, "reward_margin": 0.1 * step})
    write_report(run, "dpo", {"steps": 2})
    assert {p.name for p in run.iterdir()} == {
        "checkpoints", "config.yaml", "metrics.jsonl", "report.md", "loss.png", "lr.png", "objective.png"
    }  # fmt: skip
    refuse_foreign_files(run)  # all of it the run's: no error
    (run / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds files a training run did not write \(notes.txt\)"):
        refuse_foreign_files(run)
    # --overwrite deletes the old run's metrics, report and plots (a pretraining run plots no objective.png), and
    # leaves the user's file
    check_run_dir(run / "checkpoints", run, None, overwrite=True)
    assert {p.name for p in run.iterdir()} == {"checkpoints", "config.yaml", "notes.txt"}


def test_load_model_takes_a_run_directory_as_every_command_does(tmp_path):
    # load_model("runs/x") said "none of its checkpoints (step_00000002) is complete and whole (the warnings above
    # say why)", with no warning above and both checkpoints whole
    from cookmind.model.model_io import load_model

    model = _model()
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, _model(), None, {})
    save_checkpoint(tmp_path / "run" / "checkpoints", 2, model, None, {})
    (tmp_path / "run" / "config.yaml").write_text("train: {}\n")
    for named in (tmp_path / "run", tmp_path / "run" / "checkpoints"):
        loaded = load_model(named)
        for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
            assert torch.equal(a, b), k


@pytest.mark.parametrize("progress", [True, False])
def test_checking_a_checkpoints_sha256s_reads_its_files_under_a_progress_bar(tmp_path, capsys, monkeypatch, progress):
    """Loading a checkpoint reads every byte of its weights to check the SHA-256 meta.json recorded: minutes of
    silence for a large model before its weights were read (under a bar of their own). The check now shows a bar of
    the bytes read through cookmind.progress (plain lines in a pipe), and none where progress is off."""
    import hashlib

    from lm_fixtures import tiny_config
    from tqdm import tqdm

    from cookmind.model import CookMindLM, save_model
    from cookmind.model.model_io import load_config, read_model_weights

    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)  # a tiny model's file is big enough here
    save_model(tmp_path / "m", CookMindLM(tiny_config()))
    names = ["config.json", "model.safetensors"]
    digests = {n: hashlib.sha256((tmp_path / "m" / n).read_bytes()).hexdigest() for n in names}
    (tmp_path / "m" / "meta.json").write_text(json.dumps({"sha256": digests}))
    capsys.readouterr()
    read_model_weights(tmp_path / "m", load_config(tmp_path / "m"), progress=progress)
    err = capsys.readouterr().err
    size = tqdm.format_sizeof((tmp_path / "m" / "model.safetensors").stat().st_size)  # load_config checked the rest
    lines = [line for line in err.splitlines() if "checking" in line]
    assert (lines and f"100% {size}/{size}" in lines[-1]) if progress else not err, err
    assert "\r" not in err


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_a_run_given_as_the_model_has_its_newest_checkpoints_sha256s_checked_under_a_bar(
    tmp_path, capsys, monkeypatch, quiet
):
    """A training run named as the model is resolved to its newest whole checkpoint first, and finding it hashed the
    checkpoint's files (its weights: minutes for a large model) with no bar; the bar of read_model_weights came after,
    with nothing left to read. `cookmind export RUN OUT` now shows the check under a bar, and --quiet none."""
    from tqdm import tqdm

    from cookmind.cli import main

    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)
    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2)
    step = save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, opt, {})
    capsys.readouterr()
    assert main(["export", "--hf", str(tmp_path / "run"), str(tmp_path / "hf"), *quiet]) == 0
    err = capsys.readouterr().err
    size = tqdm.format_sizeof(sum((step / n).stat().st_size for n in ("config.json", "model.safetensors")))
    lines = [line for line in err.splitlines() if "checking" in line]
    assert (not lines) if quiet else (lines and f"100% {size}/{size}" in lines[-1]), err


@pytest.mark.parametrize("progress", [True, False])
def test_a_run_given_as_train_init_from_has_its_newest_checkpoints_sha256s_checked_under_a_bar(
    tmp_path, capsys, monkeypatch, progress
):
    """A training run named as train.init_from is resolved to its newest whole checkpoint, and finding it hashed the
    checkpoint's files (its weights: minutes for a large model) with no bar before the run started. The check is now
    under a bar with logging.progress (on rank 0), and silent without."""
    import numpy as np
    from tqdm import tqdm

    from cookmind.store import write_store
    from cookmind.train import TrainConfig, Trainer

    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)
    step = save_checkpoint(tmp_path / "init" / "checkpoints", 1, _model(vocab_size=64, num_hidden_layers=1), None, {})
    rng = np.random.default_rng(0)
    store = write_store(tmp_path / "data", "seq", [{"sequence": rng.integers(1, 64, size=200)}], vocab_size=64)
    cfg = TrainConfig.load(
        "tiny-cpu",
        [
            f"data.train_path={store}",
            f"logging.run_dir={tmp_path / 'run'}",
            f"train.init_from={tmp_path / 'init'}",
            "train.max_steps=1",
            f"logging.progress={str(progress).lower()}",
            "eval.every=0",
            "data.window_size=16",
            "train.micro_batch_size=2",
        ],
    )
    cfg.model = {}  # the shape comes from the checkpoint
    capsys.readouterr()
    Trainer(cfg).close()
    err = capsys.readouterr().err
    size = tqdm.format_sizeof(sum((step / n).stat().st_size for n in ("config.json", "model.safetensors")))
    lines = [line for line in err.splitlines() if "checking" in line]
    assert (lines and f"100% {size}/{size}" in lines[-1]) if progress else not lines, err
