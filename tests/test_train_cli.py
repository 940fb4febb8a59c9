"""`cookmind train` as a user runs it: run directories, exit status, one-line errors (issue #17.2, .4, .10)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from lm_fixtures import tiny_cli_overrides

from cookmind.store import StoreError, write_store
from cookmind.train import TrainConfig, cli
from cookmind.train.trainer import Trainer

TINY = [
    *tiny_cli_overrides(num_hidden_layers=1, max_position_embeddings=256),
    "data.window_size=16",
    "train.micro_batch_size=2",
    "logging.progress=false",
    "eval.every=0",
    "checkpoint.every=0",
]


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    return write_store(
        tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=40)} for _ in range(4)], vocab_size=64
    )


def _args(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def _train(*argv):
    """`cookmind train ARGV` in this process, the test's thread count kept (the command pins its own)."""
    from cookmind.cli import main

    n = torch.get_num_threads()
    try:
        return main(["train", *argv])
    finally:
        torch.set_num_threads(n)


def _run(store, *argv):
    return _train("--train-data", str(store), *argv, *TINY)


def _run_after_tiny(store, *argv):
    """``_run`` with ``argv`` after TINY, so its checkpoint.every (TINY's is 0) takes effect."""
    return _train("--train-data", str(store), *TINY, *argv)


def test_default_run_dirs_are_unique_and_resume_finds_the_newest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    a = cli.resolve_config(_args("train.max_steps=1")).logging.run_dir
    assert a.startswith("runs/tiny-cpu-") and a != "runs/tiny-cpu"
    os.makedirs(a)
    b = cli.resolve_config(_args("train.max_steps=1")).logging.run_dir
    assert b != a and b.startswith("runs/tiny-cpu-")
    os.makedirs(os.path.join(a, "checkpoints"))
    assert cli.resolve_config(_args("--resume", "auto")).logging.run_dir == a
    assert cli.resolve_config(_args("--run-dir", "mine")).logging.run_dir == "mine"
    # a run's saved config fed back: a fresh run is named from the preset's base, not a's name plus a second
    # time, and --resume auto finds the newest run (it searched a's name plus "-*": a fresh run started)
    saved = Path(a) / "config.yaml"
    saved.write_text(yaml.safe_dump({"logging": {"run_dir": a}, "train": {"device": "cpu"}}))
    again = cli.resolve_config(_args("--config", str(saved), "train.max_steps=1")).logging.run_dir
    assert re.fullmatch(r"runs/tiny-cpu-\d{8}-\d{6}(-\d+)?", again) and again != a, again
    assert cli.resolve_config(_args("--config", str(saved), "--resume", "auto")).logging.run_dir == a


def test_resume_auto_continues_the_newest_run_of_the_same_objective_and_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {}
    for name, objective, data in [("pre", "pretrain", "pre"), ("sft", "sft", "sft"), ("pre2", "pretrain", "other")]:
        run = tmp_path / "runs" / f"tiny-cpu-2026010{len(runs)}-000000"
        (run / "checkpoints").mkdir(parents=True)
        (run / "config.yaml").write_text(f"train: {{objective: {objective}}}\ndata: {{train_path: {data}}}\n")
        runs[name] = str(run.relative_to(tmp_path))
    # the newest run of the tiny-cpu preset is SFT (then pretraining on other data): resuming pretraining on
    # "pre" continues the run that pretrained on it, not the SFT run (it failed on that run's sampler state)
    assert cli.resolve_config(_args("--resume", "auto", "--train-data", "pre")).logging.run_dir == runs["pre"]
    sft = _args("--resume", "auto", "--objective", "sft", "--train-data", str(tmp_path / "sft"))
    assert cli.resolve_config(sft).logging.run_dir == runs["sft"]
    fresh = cli.resolve_config(_args("--resume", "auto", "--train-data", "new")).logging.run_dir
    assert fresh not in runs.values() and fresh.startswith("runs/tiny-cpu-")
    # no --train-data: the data is the run's own (its config.yaml); it matched no run and started a new one, which
    # then had no data to train on
    alone = cli.resolve_config(_args("--resume", "auto"))
    assert (alone.logging.run_dir, alone.data.train_path) == (runs["pre2"], "other")
    sft = cli.resolve_config(_args("--resume", "auto", "--objective", "sft"))
    assert (sft.logging.run_dir, sft.train.objective) == (runs["sft"], "sft")


def test_the_readme_says_which_runs_resume_auto_without_run_dir_searches(tmp_path, monkeypatch):
    """The README said `--resume auto` alone "continues the newest one that ran the same objective on the same
    --train-data"; it searches only the auto-named ``<preset's logging.run_dir>-*`` folders (with a checkpoints/
    folder) under the current directory: a run named with --run-dir is never found, and a fresh one starts."""
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    for name in ("mine", "tiny-cpu-20260101-000000"):
        (tmp_path / "runs" / name / "checkpoints").mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text("train: {objective: pretrain}\ndata: {train_path: d}\n")
    (tmp_path / "runs" / "tiny-cpu-20260102-000000").mkdir()  # no checkpoints/: not a run to continue
    # another preset whose name starts with this one's, same objective and data: not this preset's run
    (tmp_path / "runs" / "tiny-cpu-sft-20260103-000000" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-cpu-sft-20260103-000000" / "config.yaml").write_text(
        "train: {objective: pretrain}\ndata: {train_path: d}\n"
    )
    assert cli.resolve_config(_args("--resume", "auto", "--train-data", "d")).logging.run_dir == (
        "runs/tiny-cpu-20260101-000000"
    )
    (tmp_path / "runs" / "tiny-cpu-20260101-000000" / "config.yaml").unlink()
    (tmp_path / "runs" / "tiny-cpu-20260101-000000").rename(tmp_path / "runs" / "theirs")
    fresh = cli.resolve_config(_args("--resume", "auto", "--train-data", "d")).logging.run_dir
    assert fresh.startswith("runs/tiny-cpu-2") and not os.path.exists(fresh)  # "mine" is not searched
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert (
        "`--resume auto` without `--run-dir` searches only those folders: `<logging.run_dir>-*` (the preset's "
        "`logging.run_dir`, `runs/<preset>` by default, relative to the current directory) that hold a "
        "`checkpoints/` folder and whose `config.yaml` ran the same `train.objective` on the same `--train-data` "
        "(any data, without `--train-data`; a folder without a readable one counts), and continues the newest by "
        "name, on its own `config.yaml`"
    ) in readme
    assert "A run named with `--run-dir` is not searched: resume it with `--run-dir`" in readme


def test_a_second_fresh_run_into_the_same_dir_is_refused_in_one_line(tmp_path, store, capsys):
    run = str(tmp_path / "run")
    assert _run(store, "--run-dir", run, "train.max_steps=2") == 0
    assert "run directory " + run in capsys.readouterr().err
    assert _run(store, "--run-dir", run, "train.max_steps=1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "cookmind train: run directory " + run and len(err) == 2
    assert "already holds another run" in err[1] and "--resume auto" in err[1]
    assert os.listdir(os.path.join(run, "checkpoints")) == ["step_00000002"]
    assert _run(store, "--run-dir", run, "--overwrite", "train.max_steps=1") == 0
    assert os.listdir(os.path.join(run, "checkpoints")) == ["step_00000001"]


def test_a_crashed_run_rerun_with_its_own_command_is_named_so_with_the_way_out(tmp_path, store, capsys):
    """A run of the same config that crashed (its folder there, its last checkpoint missing or half written) was
    refused as "another run" when its command was run again. It is named as the same run stopped at step N (or before
    its first checkpoint), with --resume auto where a checkpoint is there and --overwrite to start again; nothing
    is deleted."""
    run = tmp_path / "run"

    def _run(store, *argv):  # checkpoint.every after TINY's 0
        return _train("--train-data", str(store), *TINY, *argv)

    argv = ("--run-dir", str(run), "train.max_steps=4", "checkpoint.every=2", "checkpoint.keep_last=3")
    assert _run(store, *argv) == 0
    ckpts = run / "checkpoints"
    capsys.readouterr()
    assert _run(store, *argv) == 2  # the same command after it completed
    assert capsys.readouterr().err.strip().splitlines()[1] == (
        f"cookmind train: error: {run} holds this command's own run, completed at step 4 "
        f"({ckpts / 'step_00000004'}): use that model, or pass --overwrite to train it again (deleting its checkpoints)"
    )
    shutil.rmtree(ckpts / "step_00000004")  # it crashed in step 3 or 4: step 2 is its newest checkpoint
    assert _run(store, *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[1] == (
        f"cookmind train: error: {run} holds this command's own run, stopped at step 2 (its newest checkpoint "
        f"step_00000002): continue it with --resume auto, or pass --overwrite to start it again (deleting its "
        f"checkpoints)"
    ), err
    assert os.listdir(ckpts) == ["step_00000002"]
    # its only save was cut short: a killed writer's temporary folder (pid 4194305: past any pid_max), no checkpoint
    (ckpts / "step_00000002").rename(ckpts / f".step_00000002.tmp-4194305@{socket.gethostname().split('.')[0]}")
    assert _run(store, *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[1] == (
        f"cookmind train: error: {run} holds this command's own run, stopped before its first complete "
        f"checkpoint: pass --overwrite to start it again (deleting its metrics)"
    ), err
    assert (run / "metrics.jsonl").is_file() and (run / "config.yaml").is_file()
    assert _run(store, *argv[:-1], "checkpoint.keep_last=2") == 2  # another config: another run
    assert "already holds another run" in capsys.readouterr().err
    assert _run(store, *argv, "--overwrite") == 0
    assert sorted(os.listdir(ckpts)) == ["step_00000002", "step_00000004"]


def test_overwrite_and_pruning_delete_only_what_a_save_wrote(tmp_path, store, capsys):
    """--overwrite deleted every step_N folder, the user's files in them and folders no run wrote; pruning
    (checkpoint.keep_last) and a re-save of a step likewise. Now each save records its files in meta.json, and only a
    folder holding nothing else is deleted: --overwrite refuses before deleting anything, pruning keeps and warns."""
    import json

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    assert (
        _run_after_tiny(
            store, "--run-dir", str(run), "train.max_steps=2", "checkpoint.every=1", "checkpoint.keep_last=0"
        )
        == 0
    )
    for step in (1, 2):  # the record is the folder as written (an independent listing of it)
        d = ckpts / f"step_0000000{step}"
        assert json.loads((d / "meta.json").read_text())["files"] == sorted(os.listdir(d))
    (ckpts / "step_00000002" / "my_eval.json").write_text("{}")
    (ckpts / "step_00000099").mkdir()
    (ckpts / "step_00000099" / "data.txt").write_text("mine")
    capsys.readouterr()
    assert _run_after_tiny(store, "--run-dir", str(run), "--overwrite", "train.max_steps=1") == 2
    err = capsys.readouterr().err
    assert f"{ckpts / 'step_00000002'} holds my_eval.json, which no checkpoint save wrote" in err
    assert sorted(os.listdir(ckpts)) == ["step_00000001", "step_00000002", "step_00000099"]  # nothing deleted
    (ckpts / "step_00000002" / "my_eval.json").unlink()
    assert _run_after_tiny(store, "--run-dir", str(run), "--overwrite", "train.max_steps=1") == 2
    assert f"{ckpts / 'step_00000099'} holds data.txt, which no checkpoint save wrote" in capsys.readouterr().err
    (ckpts / "step_00000099" / "data.txt").unlink()
    assert _run_after_tiny(store, "--run-dir", str(run), "--overwrite", "train.max_steps=1") == 0
    assert os.listdir(ckpts) == ["step_00000001"]

    # pruning: keep_last=1 would delete step 1 at step 2; a user's file there keeps it, with a warning
    other = tmp_path / "pruned"
    cut = ["checkpoint.every=1", "checkpoint.keep_last=1"]
    assert _run_after_tiny(store, "--run-dir", str(other), "train.max_steps=1", *cut) == 0
    (other / "checkpoints" / "step_00000001" / "notes.txt").write_text("mine")
    with pytest.warns(UserWarning, match="step_00000001 is kept past checkpoint.keep_last: it holds files no save"):
        assert _run_after_tiny(store, "--run-dir", str(other), "--resume", "auto", "train.max_steps=3", *cut) == 0
    assert sorted(os.listdir(other / "checkpoints")) == ["step_00000001", "step_00000003"]
    assert (other / "checkpoints" / "step_00000001" / "notes.txt").read_text() == "mine"


def test_a_resume_after_a_crash_logs_each_step_once(tmp_path, store, capsys):
    """A run killed between checkpoints had logged the steps after its last one; the resume logged them again and
    metrics.jsonl (and the report's plots) held both attempts. Now the resume drops the rows after its checkpoint,
    a line the kill cut short too, says how many, and the file equals the uninterrupted run's."""
    import json
    import shutil

    every = ["train.max_steps=4", "checkpoint.every=2", "checkpoint.keep_last=0", "logging.log_every=1"]
    assert _run_after_tiny(store, "--run-dir", str(tmp_path / "straight"), *every) == 0
    run = tmp_path / "crashed"
    assert _run_after_tiny(store, "--run-dir", str(run), *every) == 0
    shutil.rmtree(run / "checkpoints" / "step_00000004")  # killed after logging step 4, before its save
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "split": "tr')  # and in the middle of a line
    capsys.readouterr()
    assert _run_after_tiny(store, "--run-dir", str(run), "--resume", "auto", *every) == 0
    err = capsys.readouterr().err
    assert "3 rows of metrics.jsonl were logged after step 2 by the interrupted run (steps 3-4); dropped" in err

    def rows(d):
        keep = ("step", "split", "loss", "lr", "grad_norm", "tokens")
        return [{k: r.get(k) for k in keep} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]

    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4]
    assert rows(run) == rows(tmp_path / "straight")


def test_sigterm_to_the_whole_process_group_with_loader_workers_saves_and_exits_128_plus_n(tmp_path):
    """A scheduler's (or `timeout`'s) SIGTERM goes to the whole process group: the DataLoader workers died of it, the
    next batch (or the stop's checkpoint save) raised "DataLoader worker is killed by signal", and the run ended with
    status 1 and no checkpoint. The workers now leave the signal to the main process, which saves and stops."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    rng = np.random.default_rng(0)  # an epoch of thousands of steps: the workers are mid-epoch when it comes
    store = write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=2000)} for _ in range(20)], 64)
    run = tmp_path / "run"
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "cookmind", "train", "--train-data", str(store), "--run-dir", str(run), *TINY]
    argv += ["train.max_steps=100000", "data.num_workers=2", "logging.log_every=1"]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        os.killpg(proc.pid, signal.SIGTERM)  # the process group: the workers get it too
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "checkpoint saved" in err and "Traceback" not in err, err
    assert "cookmind train: SIGTERM: stopping when the step under way ends, then saving\n" in err  # said at once
    saved = [d for d in (run / "checkpoints").iterdir() if (d / "meta.json").is_file()]
    assert len(saved) == 1


def test_init_from_records_the_loaded_shape_so_the_run_resumes_from_its_config_yaml(tmp_path, store, capsys):
    """With --init-from the preset's model section gives way to the loaded model's shape, but config.yaml kept the
    preset's (a wrong record, and a resume from it was refused: its model keys read as the user's). Now the run says
    which preset values gave way, config.yaml holds the shape that trained, and `--run-dir --resume auto` resumes."""
    import yaml

    from cookmind.cli import main

    first = tmp_path / "first"
    assert _run(store, "--run-dir", str(first), "train.max_steps=1") == 0  # TINY's shape: 1 layer of width 32
    second = tmp_path / "second"
    common = ["data.window_size=16", "train.micro_batch_size=2", "logging.progress=false", "eval.every=0"]
    capsys.readouterr()
    argv = ["train", "--train-data", str(store), "--init-from", str(first / "checkpoints"), "--run-dir", str(second)]
    assert main([*argv, *common, "train.max_steps=1"]) == 0  # the tiny-cpu preset's shape: 2 layers of width 64
    assert "hidden_size 32 (the preset said 64)" in capsys.readouterr().err
    model = yaml.safe_load((second / "config.yaml").read_text())["model"]
    assert (model["hidden_size"], model["num_hidden_layers"], model["intermediate_size"]) == (32, 1, 64)
    assert main(["train", "--run-dir", str(second), "--resume", "auto", "train.max_steps=2"]) == 0
    assert "resuming from" in capsys.readouterr().err


def test_a_checkpoint_dir_holding_other_files_is_refused(tmp_path, store, capsys):
    """checkpoint.dir may name any folder: a fresh run wrote its step_N folders among the user's files."""
    mine = tmp_path / "uc"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    run = ["--run-dir", str(tmp_path / "run"), "train.max_steps=1", f"checkpoint.dir={mine}"]
    assert _run(store, *run) == 2
    assert f"{mine} holds files a training run did not write (notes.txt)" in capsys.readouterr().err
    assert os.listdir(mine) == ["notes.txt"] and not (tmp_path / "run").exists()
    (mine / "notes.txt").unlink()
    assert _run(store, *run) == 0
    assert os.listdir(mine) == ["step_00000001"]


def test_a_checkpoint_dir_that_cannot_be_made_is_refused_before_training(tmp_path, store, capsys):
    """checkpoint.dir=FILE/ck trained every step and then stopped at the first save ('FILE is a file, not a
    folder'), the training lost. The folder is made as the run starts: the same line, before the first step."""
    (tmp_path / "afile").write_text("mine")
    run = ["--run-dir", str(tmp_path / "run"), "train.max_steps=2", f"checkpoint.dir={tmp_path / 'afile' / 'ck'}"]
    assert _run(store, *run) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'afile'} is a file, not a folder" in err and "step/s" not in err and "loss=" not in err
    assert not (tmp_path / "run").exists() and (tmp_path / "afile").read_text() == "mine"


def test_a_refused_resume_leaves_the_runs_config_yaml_alone(tmp_path, store, capsys):
    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=2") == 0
    before = (run / "config.yaml").read_text()
    # another stride: twice the windows, so the sampler state no longer fits and the resume is refused
    assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=4", "data.stride=8") == 2
    assert "sampler state" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == before


def _seq_store(path, seed, n=4, overwrite=False):
    """``n`` records of 40 tokens drawn from ``seed`` (the ``store`` fixture is seed 0, n 4)."""
    rng = np.random.default_rng(seed)
    records = [{"sequence": rng.integers(1, 64, size=40)} for _ in range(n)]
    return write_store(path, "seq", records, vocab_size=64, overwrite=overwrite)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_a_resume_on_other_data_is_refused_in_one_line_naming_both_stores(tmp_path, store, capsys, fmt):
    """A resume checked only the sampler's sample count: a store repacked in another order or split (the same number
    of windows) continued with no word, its validation split overlapping trained data; another count said only
    "sampler state is for a dataset of 863 samples, this one has 818". Now the checkpoint records which stores it
    trained and validated on (path and fingerprint), a resume on another is one line naming both and what to do,
    and a count that differs says the same."""
    import json
    import re

    from cookmind.store import TokenStore

    run, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints" / "step_00000002"
    val = _seq_store(tmp_path / "val", 5)
    common = ["--run-dir", str(run), "--val-data", str(val), f"checkpoint.format={fmt}"]
    assert _run(store, *common, "train.max_steps=2") == 0
    trained, validated = TokenStore(store).fingerprint(), TokenStore(val).fingerprint()
    assert json.loads((ckpt / "meta.json").read_text())["data"] == {
        "train": {"path": str(store), "fingerprint": trained},
        "val": {"path": str(val), "fingerprint": validated},
    }
    capsys.readouterr()

    def refused(*argv):
        assert _run(*argv, "--resume", "auto", "train.max_steps=4") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "Traceback" not in "".join(err)
        return err[-1]

    # the same path, repacked: as many records (windows), other tokens
    _seq_store(store, 1, overwrite=True)
    repacked = TokenStore(store).fingerprint()
    assert refused(store, *common) == (
        f"cookmind train: error: {ckpt} trained on the training store {store} (fingerprint {trained}), not on "
        f"{store} (fingerprint {repacked}), which holds other data or another order or split: resume with the store "
        f"it trained on, or start a new run on this data from its weights with --init-from {ckpt} and another "
        "--run-dir"
    )
    # another store of another size: the same line, not the sampler's count
    other = _seq_store(tmp_path / "other", 2, n=6)
    line = refused(other, *common)
    assert f"trained on the training store {store} (fingerprint {trained}), not on {other} (fingerprint " in line
    assert "sampler" not in line and f"--init-from {ckpt}" in line
    # the validation store is checked alike
    _seq_store(store, 0, overwrite=True)  # the original again: its fingerprint comes back
    assert TokenStore(store).fingerprint() == trained
    other_val = _seq_store(tmp_path / "val2", 6)
    line = refused(store, "--run-dir", str(run), "--val-data", str(other_val), f"checkpoint.format={fmt}")
    assert f"evaluated on the validation store {val} (fingerprint {validated}), not on {other_val}" in line
    # the same store with other window settings: the count differs, the line says the same
    line = refused(store, *common, "data.stride=8")
    assert re.fullmatch(
        rf"cookmind train: error: {re.escape(str(ckpt))}: its sampler state is for 10 training samples, the training "
        rf"store {re.escape(str(store))} \(fingerprint {trained}\) makes 19 with these data settings "
        r"\(data.window_size=16, data.stride=8\): resume with the data and data settings it trained with, or start "
        rf"a new run on this data from its weights with --init-from {re.escape(str(ckpt))} and another --run-dir",
        line,
    ), line
    # another seed or shuffle reads the data in another order: it was the sampler's "this sampler seed=4", naming
    # neither the setting nor the checkpoint nor what to do
    line = refused(store, *common, "train.seed=4", "data.shuffle=false")
    seed = TrainConfig.load("tiny-cpu").train.seed
    assert line == (
        f"cookmind train: error: {ckpt} was saved by a run with train.seed={seed} and data.shuffle=true (this run: "
        "train.seed=4, data.shuffle=false), which fix the order it reads the data in: resume with "
        f"train.seed={seed} and data.shuffle=true, or start a new run on this data from its weights with --init-from "
        f"{ckpt} and another --run-dir"
    )
    # the same data resumes; so does the advice: a new run from the checkpoint's weights on other data
    assert _run(store, *common, "--resume", "auto", "train.max_steps=3") == 0
    new = ["--run-dir", str(tmp_path / "new"), "--init-from", str(ckpt), f"checkpoint.format={fmt}"]
    assert _run(other, *new, "train.max_steps=1") == 0
    assert os.listdir(tmp_path / "new" / "checkpoints") == ["step_00000001"]  # a new run, at step 1


def test_a_checkpoint_saved_before_stores_were_recorded_resumes_as_before(tmp_path, store):
    import json

    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=2") == 0
    meta_file = run / "checkpoints" / "step_00000002" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta.pop("data", None)
    meta_file.write_text(json.dumps(meta))
    _seq_store(store, 1, overwrite=True)  # as many windows: only the count was checked
    assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=3") == 0


def test_a_resume_that_changes_the_schedule_warns_of_the_lr_jump_in_one_line(tmp_path, store):
    """The README's "continue" (``--resume auto train.max_steps=N``) after a finished cosine moved the lr from its
    floor back up with no word: the schedule is recomputed over the new length. The math stays; the resume says it
    in one line, with the setting that avoids the jump. Reference values by hand: lr 3e-3, floor 3e-4 (min_lr_ratio
    0.1), no warmup; at 0-based step 4 the old 4-step cosine is at its floor, the new 8-step one halfway:
    3e-4 + 2.7e-3 * (1 + cos(pi/2)) / 2 = 1.65e-3."""
    import json
    import warnings

    run = tmp_path / "run"
    sched = [
        "--run-dir",
        str(run),
        "optim.lr=3e-3",
        "optim.min_lr_ratio=0.1",
        "optim.warmup_steps=0",
        "logging.log_every=1",
    ]
    assert _run(store, *sched, "train.max_steps=4") == 0
    with pytest.warns(UserWarning) as caught:
        assert _run(store, *sched, "--resume", "auto", "train.max_steps=8") == 0
    jumps = [str(w.message) for w in caught if "jumps" in str(w.message)]
    assert jumps == [
        "train.max_steps=8 (the checkpoint's run had 4): the learning rate at step 5 jumps from 0.0003 to 0.00165, "
        "because the cosine schedule is recomputed over 8 steps; to go on at 0.0003 instead, set "
        "optim.schedule=constant optim.lr=0.0003"
    ]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["lr"] for r in rows if r.get("split") == "train"}
    # step 4 (0-based 3) on the old cosine: 3e-4 + 2.7e-3 * (1 + cos(3 pi / 4)) / 2 = 6.954e-4
    assert lr[4] == pytest.approx(6.954e-4, rel=1e-3) and lr[5] == pytest.approx(1.65e-3)  # the math is unchanged
    # the advice holds: no jump, no warning; nor for a resume that changes no schedule key
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        advice = ["optim.schedule=constant", "optim.lr=0.0003", "train.max_steps=10"]
        assert _run(store, *sched, "--resume", "auto", *advice) == 0
        assert _run(store, *sched, "--resume", "auto", *advice[:2], "train.max_steps=12") == 0
    assert not [w for w in quiet if "jumps" in str(w.message)]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["lr"] for r in rows if r.get("split") == "train"}[9] == pytest.approx(3e-4)


def test_a_store_of_another_kind_or_none_names_the_flag_to_change(tmp_path, capsys):
    mask = np.array([0, 0, 1, 1], np.uint8)
    sft = write_store(tmp_path / "sft", "sft", [{"sequence": np.arange(1, 5), "loss_mask": mask}] * 4, vocab_size=64)
    for objective in ("pretrain", "dpo"):  # dpo's window sizing read the store's missing "chosen": a KeyError
        assert _run(sft, "--objective", objective, "--run-dir", str(tmp_path / objective), "train.max_steps=1") == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"is a 'sft' store and --objective {objective} (train.objective) reads" in err
        assert "pass --objective sft" in err
        assert not (tmp_path / objective).exists()
    # an objective the caller passes is what reads the store, whatever train.objective says (default pretrain)
    from cookmind.train.objectives import PretrainObjective, SFTObjective

    own = [
        f"data.train_path={sft}",
        f"logging.run_dir={tmp_path / 'own'}",
        "data.window_size=4",
        "train.micro_batch_size=2",
    ]
    cfg = TrainConfig.load("tiny-cpu", own + tiny_cli_overrides())
    assert cfg.train.objective == "pretrain"
    assert Trainer(cfg, objective=SFTObjective()).train_type == "sft"
    cfg.logging.run_dir = str(tmp_path / "own-pretrain")
    with pytest.raises(StoreError, match=r"the run's objective \(PretrainObjective\) reads 'seq' stores"):
        Trainer(cfg, objective=PretrainObjective())
    # a missing store was reported as "model.vocab_size is not set and there is no tokenizer"
    assert _run(tmp_path / "nowhere", "--run-dir", str(tmp_path / "r"), "train.max_steps=1") == 2
    assert "nowhere: no such store; make one with `cookmind pack" in capsys.readouterr().err
    # no store at all (a new user's `cookmind train`): it said "model.vocab_size is not set and there is no tokenizer
    # (data.tokenizer)", which named neither the data it lacked nor the flag to pass
    assert _train("--run-dir", str(tmp_path / "none"), "train.max_steps=1") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "cookmind train: error: no training data: pass --train-data STORE (data.train_path), a token store that "
        "`cookmind pack` made (it names its tokenizer, which sizes the model's vocabulary)"
    )


def test_a_validation_store_of_another_kind_or_none_is_named_as_the_val_data(tmp_path, store, capsys):
    # a grpo store as --val-data of a dpo run said "grpo is a 'grpo' store, not 'dpo'" once the model was built, the
    # same words as for the training store: which of the two was wrong went unsaid
    mask = np.array([0, 0, 1, 1], np.uint8)
    sft = write_store(tmp_path / "sft", "sft", [{"sequence": np.arange(1, 5), "loss_mask": mask}] * 4, vocab_size=64)
    assert _run(store, "--val-data", str(sft), "--run-dir", str(tmp_path / "a"), "train.max_steps=1") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cookmind train: error: --val-data {sft} (data.val_path) is a 'sft' store and the run trains on 'seq' "
        "stores: validate on a 'seq' store (`cookmind pack --train-type seq --val-fraction F --val-out VAL` splits "
        "one off the training input)"
    )
    assert _run(sft, "--objective", "pretrain", "--run-dir", str(tmp_path / "b"), "train.max_steps=1") == 2
    assert f"error: --train-data {sft} (data.train_path) is a 'sft' store" in capsys.readouterr().err
    assert _run(store, "--val-data", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "c")) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"cookmind train: error: --val-data (data.val_path): {tmp_path / 'nowhere'}: no such store")
    )
    assert not any((tmp_path / r).exists() for r in "abc")


def test_sigterm_saves_and_exits_non_zero(tmp_path, store, sigterm_at_step, capsys):
    sigterm_at_step(1)
    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=50") == 128 + signal.SIGTERM
    assert "stopped by signal SIGTERM at step 2" in capsys.readouterr().err
    assert os.listdir(run / "checkpoints") == ["step_00000002"]


def test_a_stop_is_said_once_by_rank_0_not_by_every_rank(tmp_path, store, monkeypatch, capsys):
    """Under torchrun every rank stops at the same step, and each printed 'stopped by signal SIGTERM ...' (a
    two-rank FSDP run said it twice). Rank 0 says it (and local rank 0 of every other node: test_multinode); every
    rank exits 128 + N."""
    from cookmind.parallel import DistInfo
    from cookmind.train import trainer as trainer_module

    class Stopped:  # a rank's Trainer after a SIGTERM at step 3
        def __init__(self, cfg):
            self.dist, self.run_dir, self.stop_reason = DistInfo(rank=rank, world_size=2), "runs/x", "signal SIGTERM"

        def fit(self):
            return {"status": "stopped", "steps": 3}

        def close(self):
            pass

        def handling_signals(self):
            return contextlib.nullcontext()

    monkeypatch.setattr(trainer_module, "Trainer", Stopped)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it
    for rank, says in ((0, 1), (1, 0)):  # one node: torchrun's LOCAL_RANK is the rank
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        assert _run(store, "--run-dir", str(tmp_path / f"r{rank}")) == 128 + signal.SIGTERM
        err = capsys.readouterr().err
        assert err.count("cookmind train: stopped by signal SIGTERM at step 3; checkpoint saved") == says, err


def test_a_full_disk_is_one_line_no_traceback(tmp_path, store, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:595] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr("cookmind.atomic._LOW_SPACE", 1 << 62)  # this filesystem "has no space left"
    assert _run(store, "--run-dir", str(tmp_path / "run"), "train.max_steps=1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no space left on device while writing" in err and "step_00000001" in err


@pytest.mark.parametrize(
    "setting,env,expected",
    [
        ("train.device=gpu", {}, "train.device=gpu is not a device; pass auto, cpu, cuda or cuda:N"),
        ("train.device=cpu", {"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2 but MASTER_ADDR is unset; launch with"),
    ],
)
def test_a_bad_device_or_launch_is_one_line_no_traceback(tmp_path, store, monkeypatch, capsys, setting, env, expected):
    """What the user set wrong (a device torch does not know, a torchrun variable without the others) was a torch
    or RuntimeError traceback; nothing is left behind in the run directory."""
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert _run(store, "--run-dir", str(tmp_path / "run"), "train.max_steps=1", setting) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"cookmind train: error: {expected}"), err
    assert not (tmp_path / "run").exists()


def test_train_threads_is_honoured_on_cpu(tmp_path, store, keep_threads):
    from cookmind.train.config import TrainConfig

    cfg = TrainConfig.load(
        "tiny-cpu", [f"data.train_path={store}", f"logging.run_dir={tmp_path / 'r'}", "train.threads=2", *TINY]
    )
    Trainer(cfg)
    assert torch.get_num_threads() == 2


def test_cookmind_train_interrupted_and_resumed_equals_uninterrupted_bit_for_bit(
    tmp_path, store, sigterm_at_step, keep_threads
):
    torch.set_num_threads(2)  # what a user's process may start with: `cookmind train` pins train.threads=1
    full, cut = tmp_path / "full", tmp_path / "cut"
    steps = ["train.max_steps=4", "checkpoint.every=2"]
    assert _run(store, "--run-dir", str(full), *steps) == 0
    sigterm_at_step(2)
    assert _run(store, "--run-dir", str(cut), *steps) == 128 + signal.SIGTERM
    assert _run(store, "--run-dir", str(cut), "--resume", "auto", *steps) == 0
    a = (full / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes()
    b = (cut / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes()
    assert a == b


def test_resuming_a_run_directory_needs_only_the_directory_its_config_yaml_holds_the_rest(
    tmp_path, store, sigterm_at_step, keep_threads, capsys
):
    """``--run-dir RUN --resume auto`` with no --config, data or model settings resumes RUN with the settings it
    trained with (its config.yaml) and ends where the uninterrupted run ends, bit for bit. It stopped on
    "model.vocab_size is not set": the default preset was used instead."""
    from cookmind.cli import main

    torch.set_num_threads(2)
    full, cut = tmp_path / "full", tmp_path / "cut"
    steps = ["train.max_steps=4", "checkpoint.every=2"]
    assert _run(store, "--run-dir", str(full), *steps) == 0
    sigterm_at_step(2)
    assert _run(store, "--run-dir", str(cut), *steps) == 128 + signal.SIGTERM
    capsys.readouterr()
    assert main(["train", "--run-dir", str(cut), "--resume", "auto"]) == 0
    err = capsys.readouterr().err
    assert f"settings from {cut / 'config.yaml'} (the run being resumed)" in err
    assert f"resuming from {cut / 'checkpoints' / 'step_0000000'}" in err  # the stop's checkpoint
    a = (full / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes()
    b = (cut / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes()
    assert a == b
    # a fresh run, or a resume that names no run directory, still starts from the default preset
    assert cli.resolve_config(_args("--run-dir", str(cut), "train.max_steps=1")).model.get("vocab_size") is None
    assert cli.run_config_to_resume(_args("--resume", "auto")) is None
    assert cli.run_config_to_resume(_args(f"logging.run_dir={cut}", "checkpoint.resume=auto")) == str(
        cut / "config.yaml"
    )


def test_resume_auto_without_run_dir_resumes_the_run_found_as_it_was_saved(
    tmp_path, store, monkeypatch, sigterm_at_step, keep_threads, capsys
):
    """``--resume auto`` without --run-dir found the newest run of the preset, then resumed it with the preset's
    settings, not the run's: a run started with ``optim.lr=1e-3`` went on at the preset's 3e-3 (a schedule warning
    said only that the rate jumped). It
    now resumes as ``--run-dir RUN --resume auto`` does (RUN's config.yaml, this command's flags and overrides on
    top), ends where the uninterrupted run ends, and says where the preset differs from the run it continues."""
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(2)
    steps = ["optim.lr=1e-3", "train.max_steps=4", "checkpoint.every=2"]
    assert _run(store, "--run-dir", "full", *steps) == 0
    sigterm_at_step(2)
    assert _run(store, *steps) == 128 + signal.SIGTERM
    (cut,) = (tmp_path / "runs").iterdir()
    capsys.readouterr()
    assert _run(store, "--resume", "auto", "train.max_steps=4") == 0  # optim.lr not typed again
    err = capsys.readouterr().err
    saved = Path("runs") / cut.name / "config.yaml"
    assert f"settings from {saved} (the run being resumed), with this command's flags and overrides on top" in err
    assert "optim.lr=0.001 (tiny-cpu has 0.003)" in err, err
    assert yaml.safe_load(saved.read_text())["optim"]["lr"] == 1e-3
    a = (tmp_path / "full" / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes()
    assert (cut / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes() == a
    # an override on the command line still wins over the saved run's setting
    args = _args("--resume", "auto", "--train-data", str(store), "optim.lr=2e-3", *TINY)
    assert cli.resolve_config(args).optim.lr == 2e-3


def test_print_config_of_a_grpo_run_shows_every_grpo_setting_and_reads_back(tmp_path, capsys):
    """--print-config printed ``grpo: {}`` (the section holds only what was set): the user could not see the
    objective's settings. Now every GRPOConfig field, with the run's values, for every objective (as dpo's), and
    the print is a config file."""
    import dataclasses

    import yaml

    from cookmind.align.objective import GRPOConfig
    from cookmind.cli import main

    assert main(["train", "--objective", "grpo", "--print-config", "grpo.group_size=4", "grpo.top_p=0.9"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert list(printed["grpo"]) == [f.name for f in dataclasses.fields(GRPOConfig)]
    assert printed["grpo"]["group_size"] == 4 and printed["grpo"]["top_p"] == 0.9
    assert printed["grpo"]["template"] == "chat" and printed["grpo"]["cliprange"] == GRPOConfig().cliprange
    saved = tmp_path / "grpo.yaml"
    saved.write_text(yaml.safe_dump(printed))
    assert main(["train", "--config", str(saved), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["grpo"] == printed["grpo"]
    assert main(["train", "--objective", "grpo", "--print-config", "grpo.group_sz=4"]) == 2
    assert "grpo: unknown keys ['group_sz']" in capsys.readouterr().err
    # other objectives show the defaults too, as the dpo section does (it printed `grpo: {}`), and read back
    assert main(["train", "--print-config"]) == 0
    pretrain = yaml.safe_load(capsys.readouterr().out)
    assert list(pretrain["grpo"]) == [f.name for f in dataclasses.fields(GRPOConfig)]
    assert pretrain["grpo"]["group_size"] == GRPOConfig().group_size
    saved.write_text(yaml.safe_dump(pretrain))
    assert main(["train", "--config", str(saved), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["grpo"] == pretrain["grpo"]


def test_config_errors_are_one_line_with_the_bad_input_exit_status(tmp_path, store, capsys):
    # they exited 1 through SystemExit; the README promises 2 for bad input, like every other refusal
    assert _run(store, "--run-dir", str(tmp_path / "r"), "train.lerning_rate=1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cookmind train: error: override 'train.lerning_rate=1'")
    assert _run(store, "--config", "tiny-cpuu") == 2
    assert "config preset 'tiny-cpuu' not found" in capsys.readouterr().err
    assert _run(store, "--config", str(tmp_path / "mine.yaml")) == 2  # a file, not a preset, is what is missing
    assert f"config file '{tmp_path / 'mine.yaml'}' not found" in capsys.readouterr().err


def _signal_during_the_stops_save(monkeypatch, second: signal.Signals) -> None:
    """SIGTERM before step 1; ``second`` arrives as the stop's checkpoint is being saved."""
    launch, save = Trainer._launch_step, Trainer.save_checkpoint

    def launch_and_kill(self):
        if self.step == 1 and self.stop_reason is None:
            os.kill(os.getpid(), signal.SIGTERM)
        return launch(self)

    def save_and_kill(self, *args, **kwargs):
        if self.stop_reason is not None:
            os.kill(os.getpid(), second)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_launch_step", launch_and_kill)
    monkeypatch.setattr(Trainer, "save_checkpoint", save_and_kill)


def test_a_second_ctrl_c_during_the_stops_save_is_one_line_naming_the_checkpoint_to_resume(
    tmp_path, store, monkeypatch, capsys
):
    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=1") == 0  # step_1 is complete
    _signal_during_the_stops_save(monkeypatch, signal.SIGINT)
    assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=50") == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "interrupted at step 2 before its checkpoint was saved; the newest complete one is" in err
    assert "step_00000001: continue with --resume auto" in err
    assert sorted(os.listdir(run / "checkpoints")) == ["step_00000001"]  # nothing half-written, no temporary


def test_a_second_ctrl_c_after_the_steps_checkpoint_was_saved_says_it_was_saved(tmp_path, store, monkeypatch, capsys):
    """A second Ctrl-C that came once the step's checkpoint was whole (here: saved by checkpoint.every as the stop
    was pending) said "interrupted at step 2 before its checkpoint was saved; the newest complete one is
    .../step_00000002": that step's own. Now it says the step's checkpoint was saved."""
    run = tmp_path / "run"
    launch, save = Trainer._launch_step, Trainer.save_checkpoint

    def launch_and_interrupt(self):
        if self.step == 1 and self.stop_reason is None:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, as step 2 starts
        return launch(self)

    def save_then_interrupt(self, *args, **kwargs):
        saved = save(self, *args, **kwargs)
        if self.stop_reason is not None:
            os.kill(os.getpid(), signal.SIGINT)  # the second, once step 2's checkpoint is whole
        return saved

    monkeypatch.setattr(Trainer, "_launch_step", launch_and_interrupt)
    monkeypatch.setattr(Trainer, "save_checkpoint", save_then_interrupt)
    code = _run_after_tiny(store, "--run-dir", str(run), "train.max_steps=50", "checkpoint.every=1")
    assert code == 128 + signal.SIGINT
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "".join(err)
    assert err[-1] == (
        f"cookmind train: interrupted at step 2 after its checkpoint was saved ({run / 'checkpoints' / 'step_00000002'}"
        f"): continue with --resume auto --run-dir {run}"
    )
    assert sorted(os.listdir(run / "checkpoints")) == ["step_00000001", "step_00000002"]


def test_a_second_sigterm_during_the_stops_save_lets_the_checkpoint_finish(tmp_path, store):
    # In a subprocess: before the fix the second SIGTERM met the default handler, which kills the process.
    import subprocess
    import sys
    import textwrap

    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import signal, sys
        import pytest
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_train_cli as t
        with pytest.MonkeyPatch.context() as mp:
            t._signal_during_the_stops_save(mp, signal.SIGTERM)
            sys.exit(t._run({str(store)!r}, "--run-dir", {str(run)!r}, "train.max_steps=50"))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert "stopped by signal SIGTERM at step 2" in proc.stderr
    assert sorted(os.listdir(run / "checkpoints")) == ["step_00000002"]
    assert (run / "checkpoints" / "step_00000002" / "meta.json").exists()


class _SlowToFree(torch.Tensor):
    """A tensor whose freeing waits: freed on a gloo worker thread, it holds that thread inside the work's
    destructor while the main thread goes on to the exit."""

    def __del__(self):
        time.sleep(1.0)


def _ctrl_c_at_the_end(monkeypatch, when: str, times: int = 1) -> None:
    """``times`` Ctrl-C's as the last step starts ("last step") or as report.md is written ("report": the last
    checkpoint is whole, the run's final evaluation done)."""
    import cookmind.train.report as report

    def interrupt():
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)

    if when == "last step":
        launch = Trainer._launch_step

        def launch_and_interrupt(self):
            if self.step == self.cfg.train.max_steps - 1:
                interrupt()
            return launch(self)

        monkeypatch.setattr(Trainer, "_launch_step", launch_and_interrupt)
    else:
        write = report.write_report

        def write_and_interrupt(*args, **kwargs):
            interrupt()
            return write(*args, **kwargs)

        monkeypatch.setattr(report, "write_report", write_and_interrupt)


@pytest.mark.parametrize("when", ["last step", "report"])
def test_a_ctrl_c_once_the_last_step_is_under_way_lets_the_run_complete(tmp_path, store, monkeypatch, capsys, when):
    """`timeout -s INT` late in a run that had run all its steps said "interrupted at step 3 after its checkpoint was
    saved ... continue with --resume auto" (a Ctrl-C after the handlers were gone, as report.md was written) or
    "stopped by signal SIGINT at step 3 ... continue with --resume auto" (one during the last step), exit 130: a
    resume has nothing left to do. The run completes, says the signal came too late to stop it, and exits 0.
    Reference: an undisturbed run of the same steps, whose last checkpoint is the same."""
    assert _run(store, "--run-dir", str(tmp_path / "whole"), "train.max_steps=3") == 0
    capsys.readouterr()
    _ctrl_c_at_the_end(monkeypatch, when)
    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=3") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["status"] == "completed" and "--resume" not in err and "interrupted" not in err
    assert "cookmind train: signal SIGINT came once the last step was under way; the run completed its 3 steps" in err
    assert (run / "report.md").exists() and os.listdir(run / "checkpoints") == ["step_00000003"]
    weights = "checkpoints/step_00000003/model.safetensors"
    assert (run / weights).read_bytes() == (tmp_path / "whole" / weights).read_bytes()


def test_a_ctrl_c_just_after_fit_returns_leaves_the_completed_run_completed(tmp_path, store, monkeypatch, capsys):
    """fit restored the default handlers as it returned, so a Ctrl-C in the few ms before the command had printed
    the run's summary raised KeyboardInterrupt there: "interrupted ... report.md may be missing", exit 130, no
    summary, for a run whose steps, checkpoint and report were all written. The handlers now stay until the command
    has reported the run: it completes, says the signal came too late to stop it, and exits 0."""
    fit = Trainer.fit

    def fit_then_interrupt(self):
        summary = fit(self)
        os.kill(os.getpid(), signal.SIGINT)  # as fit returns
        return summary

    monkeypatch.setattr(Trainer, "fit", fit_then_interrupt)
    default = signal.getsignal(signal.SIGINT)
    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=2") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["status"] == "completed" and "interrupted" not in err and "--resume" not in err
    assert "cookmind train: signal SIGINT came once the last step was under way; the run completed its 2 steps" in err
    assert signal.getsignal(signal.SIGINT) is default  # the command leaves the handlers as it found them


def test_a_second_ctrl_c_after_the_last_steps_checkpoint_says_the_training_is_complete(
    tmp_path, store, monkeypatch, capsys
):
    """Two Ctrl-C's as report.md was written said "interrupted at step 3 after its checkpoint was saved ...: continue
    with --resume auto", though all 3 steps had run and been saved."""
    run = tmp_path / "run"
    _ctrl_c_at_the_end(monkeypatch, "report", times=2)
    assert _run(store, "--run-dir", str(run), "train.max_steps=3") == 128 + signal.SIGINT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"cookmind train: interrupted after its last step (3) and that step's checkpoint "
        f"({run / 'checkpoints' / 'step_00000003'}) were done: the training is complete; its final evaluation "
        "or report.md may be missing"
    )
    assert (run / "checkpoints" / "step_00000003" / "meta.json").exists()


def _a_last_collective_freed_late(monkeypatch) -> None:
    """After fit, one more collective whose work only gloo's worker thread holds: the thread frees it (and its
    tensor) after the run has ended, as a worker still freeing the last collective of a run may."""
    import torch.distributed as dist

    fit = Trainer.fit

    def fit_then_collect(self):
        summary = fit(self)
        dist.all_reduce(torch.zeros(1).as_subclass(_SlowToFree), async_op=True)  # the work is dropped here
        return summary

    monkeypatch.setattr(Trainer, "fit", fit_then_collect)


def test_a_run_in_a_process_group_ends_with_its_status_while_a_gloo_worker_still_frees_its_last_work(tmp_path, store):
    """A two-rank FSDP job (bench_scaling's CI test) ended now and then in SIGABRT after a completed run: a gloo
    worker thread still freeing the last collective's tensors took the GIL during Python's finalization and was
    ended there (core dump: ~AsyncAllreduceWork -> decref_pyobject -> take_gil -> pthread_exit -> terminate). Made
    certain here by a freeing that waits. The program (``cookmind.cli.run``, the command's entry point) now ends
    a process that was in a group without the finalization, with the run's exit status."""
    import subprocess
    import sys
    import textwrap

    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import sys
        import pytest
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_train_cli as t
        from cookmind.cli import run
        mp = pytest.MonkeyPatch()
        t._a_last_collective_freed_late(mp)
        sys.argv = ["cookmind", "train", "--train-data", {str(store)!r}, *t.TINY, "--run-dir", {str(run)!r},
                    "train.max_steps=2", "parallel.fsdp=true"]
        run()
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "completed"
    assert "Fatal Python error" not in proc.stderr and "terminate called" not in proc.stderr


def test_resume_auto_says_where_it_resumed_or_that_it_starts_fresh(tmp_path, store, capsys):
    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=1") == 0
    assert f"no checkpoint in {run / 'checkpoints'} yet; starting at step 0" in capsys.readouterr().err
    assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=2") == 0
    assert f"resuming from {run / 'checkpoints' / 'step_00000001'}" in capsys.readouterr().err


def test_train_notes_show_the_control_characters_of_the_paths_they_quote_escaped(tmp_path, store, capsys):
    # a store and a run directory whose names hold an ESC (a terminal's clear-screen sequence, a title-setting OSC):
    # "run directory ...", "no checkpoint in ... yet", "resuming from ..." wrote them raw, and the terminal ran them
    import shutil

    from cookmind.terminal import escape_controls

    odd = tmp_path / "se\x1b[2Jq"
    shutil.copytree(store, odd)
    run = tmp_path / "run\x1b]0;owned\x07"
    assert _run(odd, "--run-dir", str(run), "--resume", "auto", "train.max_steps=1") == 0
    first = capsys.readouterr().err
    assert _run(odd, "--run-dir", str(run), "--resume", "auto", "train.max_steps=2") == 0
    err = first + capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err, err
    assert f"cookmind train: run directory {escape_controls(str(run))}\n" in err, err
    assert f"no checkpoint in {escape_controls(str(run / 'checkpoints'))} yet" in err, err
    assert f"resuming from {escape_controls(str(run / 'checkpoints' / 'step_00000001'))}\n" in err, err


def test_resume_auto_of_a_folder_that_holds_no_run_says_so(tmp_path, capsys):
    """``--run-dir runs/nothing --resume auto`` (no run there, no data given) failed on the default preset with
    "model.vocab_size is not set and there is no tokenizer". Now it says there is no run to resume and what to pass;
    a folder whose config.yaml is gone but whose checkpoints are there says which settings to give."""
    empty, kept = tmp_path / "empty", tmp_path / "kept"
    empty.mkdir()
    (kept / "checkpoints" / "step_00000002").mkdir(parents=True)
    for run, why in (
        (tmp_path / "nothing", "the folder does not exist"),
        (empty, "no config.yaml and no checkpoint there"),
    ):
        assert _train("--run-dir", str(run), "--resume", "auto") == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"cookmind train: error: no run to resume in {run} ({why}): pass the --run-dir of an existing run, or "
            f"--train-data STORE to start a new run there"
        )
    assert not (tmp_path / "nothing").exists() and os.listdir(empty) == []
    assert _train("--run-dir", str(kept), "--resume", "auto") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cookmind train: error: {kept} holds checkpoints but no config.yaml, which says how the run trained: "
        "resume it with the --config and --train-data it trained with"
    )


def test_a_run_that_cannot_start_leaves_no_run_directory(tmp_path, store, capsys):
    """A setup failure after the checks (here the tokenizer: data.tokenizer names a folder with none) left an empty
    run directory behind, which generate or --resume then read as a run ('config.json: missing')."""
    (tmp_path / "no-tokenizer").mkdir()
    argv = ["--run-dir", str(tmp_path / "run"), "--tokenizer", str(tmp_path / "no-tokenizer"), "train.max_steps=1"]
    assert _run(store, *argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("cookmind train: error:")
    assert not (tmp_path / "run").exists()
    assert _run(store, "--run-dir", str(tmp_path / "run"), "train.max_steps=1") == 0  # the same run dir then works
    assert (tmp_path / "run" / "config.yaml").exists() and (tmp_path / "run" / "metrics.jsonl").exists()


# -- out of GPU memory: one line that says what to change, not a traceback -----------------------------------------

OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which 1.10 GiB is "
    "free. Including non-PyTorch memory, this process has 22.44 GiB memory in use."
)


def test_out_of_gpu_memory_mid_run_is_one_line_with_the_fix_and_the_checkpoint_to_resume(
    tmp_path, store, capsys, monkeypatch
):
    launch = Trainer._launch_step

    def launch_then_oom(self):  # the GPU runs out at the second step, as a too-large micro-batch would
        if self.step == 1:
            raise torch.OutOfMemoryError(OOM)
        return launch(self)

    monkeypatch.setattr(Trainer, "_launch_step", launch_then_oom)
    from cookmind.cli import main

    run = tmp_path / "run"
    # TINY (appended by _run) saves no checkpoints: here the override comes after it and saves every step
    n = torch.get_num_threads()
    try:
        rc = main(
            [
                "train",
                "--train-data",
                str(store),
                *TINY,
                "--run-dir",
                str(run),
                "train.max_steps=3",
                "checkpoint.every=1",
            ]
        )
    finally:
        torch.set_num_threads(n)
    assert rc == 2
    notes = ("cookmind train: seq data:", "cookmind train: optim.warmup_steps=")  # tiny-cpu warms up for 10 steps
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith(notes)]
    assert len(err) == 2 and err[0] == f"cookmind train: run directory {run}", err  # no traceback
    line = err[1]
    assert line.startswith("cookmind train: error: out of GPU memory (Tried to allocate 2.00 GiB; total capacity")
    assert "at step 2 (micro-batches of 2 x 16 tokens)" in line
    assert "train.micro_batch_size" in line and "train.activation_checkpointing=true" in line
    assert "parallel.fsdp=true" in line and "--resume auto" in line
    assert str(run / "checkpoints" / "step_00000001") in line
    assert os.listdir(run / "checkpoints") == ["step_00000001"]  # the half-done step is not saved


def test_out_of_gpu_memory_while_setting_up_is_one_line(tmp_path, store, capsys, monkeypatch):
    def oom(self, cfg, *a, **k):
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(Trainer, "__init__", oom)
    assert _run(store, "--run-dir", str(tmp_path / "run"), "train.max_steps=1") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "out of GPU memory (Tried to allocate 2.00 GiB" in line and "while the run was set up" in line
    assert "train.micro_batch_size" in line


def test_other_stages_out_of_gpu_memory_is_one_line_naming_their_knob(monkeypatch, capsys):
    from cookmind import cli as top
    from cookmind.evals import cli as evals_cli

    def oom(args):
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(evals_cli, "main", oom)
    assert top.main(["eval", "gsm8k", "--model", "m", "--data", "d"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("cookmind eval gsm8k: error: out of GPU memory (Tried to allocate 2.00 GiB")
    assert "\n" not in line
    assert "--batch-size" in line

    def other(args):
        raise RuntimeError("something else")

    monkeypatch.setattr(evals_cli, "main", other)
    with pytest.raises(RuntimeError, match="something else"):  # any other error keeps its traceback
        top.main(["eval", "gsm8k", "--model", "m", "--data", "d"])


def test_a_second_run_into_a_run_directory_in_use_is_refused_until_the_first_ends(tmp_path, store, capsys):
    """A `--resume auto` started while the first run still trained ran beside it: metrics.jsonl interleaved and both
    wrote checkpoints. The lock is the OS's: a holder killed with SIGKILL leaves none behind."""
    import subprocess
    import sys

    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=1") == 0
    holder = subprocess.Popen(  # stands for the first run, still training in that directory
        [
            sys.executable,
            "-c",
            f"from cookmind.train.run_lock import lock_run_dir; lock_run_dir({str(run)!r}); "
            "print('locked', flush=True); import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (run / "metrics.jsonl").read_text()
        capsys.readouterr()
        assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=2") == 2
        err = capsys.readouterr().err
        assert f"run directory {run} is in use by a cookmind train still running (pid {holder.pid} on " in err
        assert (run / "metrics.jsonl").read_text() == before  # nothing written beside the first run
    finally:
        holder.kill()
        holder.wait()
    assert _run(store, "--run-dir", str(run), "--resume", "auto", "train.max_steps=2") == 0


def test_an_explicit_resume_refuses_a_run_directory_it_would_mix_runs_in(tmp_path, store, capsys):
    """--resume PATH skipped every check: into another run's directory it overwrote that run's step of the same
    number and pruned the rest; from an older step of its own directory, the abandoned branch's newer steps stayed
    the 'newest' for --resume auto, export and generate."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run(store, "--run-dir", str(a), "train.max_steps=2") == 0
    assert _run(store, "--run-dir", str(a), "--resume", "auto", "train.max_steps=4") == 0  # step_2 and step_4
    assert _run(store, "--run-dir", str(b), "train.max_steps=2") == 0
    assert _run(store, "--run-dir", str(b), "--resume", "auto", "train.max_steps=4") == 0
    b_steps = sorted(os.listdir(b / "checkpoints"))
    b_metrics = (b / "metrics.jsonl").read_text()
    capsys.readouterr()
    step2 = str(a / "checkpoints" / "step_00000002")
    assert _run(store, "--run-dir", str(b), "--resume", step2, "train.max_steps=6") == 2
    err = capsys.readouterr().err
    assert f"{b} already holds another run (checkpoints step_00000002, step_00000004); resuming {step2}" in err
    assert sorted(os.listdir(b / "checkpoints")) == b_steps and (b / "metrics.jsonl").read_text() == b_metrics
    # from an older step of its own directory: the newer one would stay the newest
    assert _run(store, "--run-dir", str(a), "--resume", step2, "train.max_steps=3") == 2
    err = capsys.readouterr().err
    assert "holds checkpoints newer than step_00000002 (step_00000004)" in err
    # the same resume into an empty directory, or of the newest, goes ahead
    assert _run(store, "--run-dir", str(tmp_path / "c"), "--resume", step2, "train.max_steps=3") == 0
    assert _run(store, "--run-dir", str(a), "--resume", str(a / "checkpoints"), "train.max_steps=5") == 0
    # --overwrite: the user asked for b's checkpoints to go; only this run's are left
    c3 = str(tmp_path / "c" / "checkpoints" / "step_00000003")
    assert _run(store, "--run-dir", str(b), "--resume", c3, "--overwrite", "train.max_steps=4") == 0
    assert sorted(os.listdir(b / "checkpoints")) == ["step_00000004"]


def test_a_fresh_run_refuses_a_folder_holding_files_no_run_wrote(tmp_path, store, capsys):
    """A fresh run wrote config.yaml, report.md and checkpoints/ into any folder: a token store (which `pack
    --overwrite` then wiped, the run's checkpoints with it) or the user's own files of those names."""
    import shutil

    copy = shutil.copytree(store, tmp_path / "store-copy")
    before = sorted(os.listdir(copy))
    capsys.readouterr()
    assert _run(store, "--run-dir", str(copy), "train.max_steps=1") == 2
    err = capsys.readouterr().err
    assert f"{copy} holds files a training run did not write (meta.json, " in err and "choose a new" in err
    assert sorted(os.listdir(copy)) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    assert _run(store, "--run-dir", str(mine), "--overwrite", "train.max_steps=1") == 2  # --overwrite is for runs
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(store, "--run-dir", str(empty), "train.max_steps=1") == 0  # an empty folder is fine
    # a run's own leftovers are not foreign: a killed write's temporary file, a checkpoint.dir inside the run
    (empty / ".config.yaml.tmp-123@host").write_text("half")
    argv = ["--run-dir", str(empty), "--overwrite", f"checkpoint.dir={empty / 'ckpts'}", "train.max_steps=1"]
    assert _run(store, *argv) == 0 and _run(store, *argv) == 0


def test_a_filesystem_without_locks_does_not_stop_a_run(tmp_path, monkeypatch):
    import errno
    import fcntl

    from cookmind.train.run_lock import lock_run_dir, release_run_dir

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    (tmp_path / "run").mkdir()
    lock_run_dir(tmp_path / "run")  # no error: the run goes on unguarded
    release_run_dir(tmp_path / "run")


def test_resuming_at_or_past_max_steps_says_there_is_nothing_to_train(tmp_path, store, capsys):
    run = str(tmp_path / "run")
    assert _run(store, "--run-dir", run, "train.max_steps=3") == 0
    capsys.readouterr()
    assert _run(store, "--run-dir", run, "--resume", "auto", "train.max_steps=2") == 0  # it said only "completed"
    err = capsys.readouterr().err
    assert "the checkpoint is at step 3, already at or past train.max_steps=2: nothing to train" in err
    assert _run(store, "--run-dir", run, "--resume", "auto", "train.max_steps=4") == 0
    assert "nothing to train" not in capsys.readouterr().err


@pytest.mark.parametrize("which", ["train", "val"])
def test_a_store_of_another_tokenizer_with_a_larger_vocabulary_is_named_as_such(tmp_path, tok_dir, which, capsys):
    """A store packed by another, larger tokenizer was refused as "model.vocab_size has 320 token ids but the store
    ... has 1000; set model.vocab_size to at least 1000": a fix that only led to the tokenizer error. Now the
    tokenizer error comes first, naming the store's tokenizer and the run's."""
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    rng = np.random.default_rng(0)
    ours = {"fingerprint": tok.fingerprint(), "path": str(tok_dir)}
    other = {"fingerprint": "f" * 64, "path": "/elsewhere/tok1000"}
    stores = {}
    for name in ("train", "val"):
        vocab, meta = (1000, other) if name == which else (tok.vocab_size, ours)
        records = [{"sequence": rng.integers(0, vocab, size=40)} for _ in range(4)]
        stores[name] = write_store(tmp_path / name, "seq", records, vocab_size=vocab, meta={"tokenizer": meta})
    argv = ["--train-data", str(stores["train"]), "--val-data", str(stores["val"]), "--tokenizer", str(tok_dir)]
    overrides = [o for o in TINY if not o.startswith("model.vocab_size=")]
    assert _train(*argv, "--run-dir", str(tmp_path / "run"), *overrides, "train.max_steps=1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{stores[which]} was packed with tokenizer /elsewhere/tok1000" in err, err
    assert "model.vocab_size" not in err, err


@pytest.mark.parametrize("preset", ["gpt2-small", "minimind", "qwen3-0.6b", "llama-1.3b"])
def test_a_gpu_preset_on_a_machine_without_cuda_is_refused_in_one_line(tmp_path, store, monkeypatch, preset):
    """The README's one-H200 recipe (`cookmind train --config qwen3-0.6b --train-data STORE --tokenizer TOK`) on a
    CPU machine started a 23,000-step bf16 run of a 0.6B model on the CPU (train.device=auto), one step never
    ending, so not even SIGTERM stopped it. A GPU preset asks for CUDA: without it the Trainer refuses at once, in
    one line naming the key and how to run the preset on the CPU anyway (shrunk here so a wrong start is cheap)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    shrunk = [
        f"data.train_path={store}",
        f"logging.run_dir={tmp_path / 'run'}",
        *TINY,
        "train.compile=false",
        "train.grad_accum_steps=1",
    ]
    with pytest.raises(ValueError) as err:
        Trainer(TrainConfig.load(preset, shrunk))
    msg = str(err.value)
    assert msg.startswith("train.device=cuda") and "train.device=cpu" in msg and "\n" not in msg
    assert not (tmp_path / "run").exists()
    Trainer(TrainConfig.load(preset, [*shrunk, "train.device=cpu"]))  # what the line says runs it on the CPU


def test_a_store_whose_documents_another_framing_opened_is_refused_in_one_line(tmp_path, tok_dir, capsys):
    """A tokenizer's fingerprint covers its vocabulary, merges, specials and pattern, not the ids that open and end a
    document (``bos_ids``, as a Hugging Face folder's post_processor gives them, and the EOS): a store packed with the
    tokenizer before its BOS was set trained with it after, so the model learned documents without the BOS and was
    then prompted with it (prompts open with ``bos_ids``). Pack records the framing; train refuses a store framed
    otherwise, in one line naming both; a store packed before pack recorded ``bos_ids`` is not refused for it."""
    import json

    from lm_fixtures import CORPUS

    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer
    from cookmind.tokenizer.chat_template import IM_START

    plain = Tokenizer.load(tok_dir)
    with_bos = Tokenizer(
        plain.vocab, plain.merges, plain.special_tokens, plain.pattern, bos_ids=[plain.special_tokens[IM_START]]
    )
    assert with_bos.fingerprint() == plain.fingerprint()  # what the fingerprint alone let through
    with_bos.save(tmp_path / "tok_bos")
    (tmp_path / "c.txt").write_text(CORPUS)
    pack([tmp_path / "c.txt"], tmp_path / "s", str(tok_dir), "seq", progress=False)
    run = ["--train-data", str(tmp_path / "s"), *[o for o in TINY if not o.startswith("model.vocab_size=")]]
    assert (
        _train(*run, "--tokenizer", str(tmp_path / "tok_bos"), "--run-dir", str(tmp_path / "r1"), "train.max_steps=1")
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1:]  # after the line naming the run directory
    assert f"{tmp_path / 's'} was packed with tokenizer {tok_dir.resolve()}, whose documents open with ids []" in err[0]
    assert f"{tmp_path / 'tok_bos'}'s documents open with ids [{plain.special_tokens[IM_START]}]" in err[0], err
    assert "re-pack" in err[0] and not (tmp_path / "r1").exists()
    # the store's own tokenizer trains on it; so does the BOS tokenizer on a store packed with it
    assert _train(*run, "--tokenizer", str(tok_dir), "--run-dir", str(tmp_path / "r2"), "train.max_steps=1") == 0
    pack([tmp_path / "c.txt"], tmp_path / "sb", str(tmp_path / "tok_bos"), "seq", progress=False)
    meta = json.loads((tmp_path / "sb" / "meta.json").read_text())["tokenizer"]
    assert meta["bos_ids"] == [plain.special_tokens[IM_START]] and meta["eos_id"] == plain.eos_id
    run_b = ["--train-data", str(tmp_path / "sb"), *run[2:], "--tokenizer", str(tmp_path / "tok_bos")]
    assert _train(*run_b, "--run-dir", str(tmp_path / "r3"), "train.max_steps=1") == 0
    # a store from before pack recorded bos_ids: only what it records (its EOS) is checked
    meta_path = tmp_path / "s" / "meta.json"
    old = json.loads(meta_path.read_text())
    del old["tokenizer"]["bos_ids"]
    meta_path.write_text(json.dumps(old))
    assert (
        _train(*run, "--tokenizer", str(tmp_path / "tok_bos"), "--run-dir", str(tmp_path / "r4"), "train.max_steps=1")
        == 0
    )
    old["tokenizer"]["eos_id"] = plain.special_tokens[IM_START]
    meta_path.write_text(json.dumps(old))
    capsys.readouterr()
    assert _train(*run, "--tokenizer", str(tok_dir), "--run-dir", str(tmp_path / "r5"), "train.max_steps=1") == 2
    assert f"whose documents end with id {plain.special_tokens[IM_START]}" in capsys.readouterr().err


def test_overwrite_never_deletes_what_the_run_is_told_to_read_and_never_pairs_with_resume(tmp_path, store, capsys):
    # `--init-from pre --run-dir pre --overwrite` deleted pre's checkpoints, then said pre had no complete
    # checkpoint: the model the user asked to start from was gone. `--resume auto --overwrite` resumed, silently
    # ignoring --overwrite
    run = tmp_path / "pre"
    assert _run(store, "--run-dir", str(run), "train.max_steps=2", "checkpoint.every=2") == 0
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    capsys.readouterr()

    def refused(*argv):
        assert _run(store, "--run-dir", str(run), "--overwrite", *argv, "train.max_steps=1") == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert refused("--init-from", str(run)) == (
        f"cookmind train: error: --init-from {run} (train.init_from) is a checkpoint of the run in {run}, which "
        "--overwrite would "
        f"delete before reading it: give the new run another --run-dir (it starts from {run} all the same)"
    )
    step = run / "checkpoints" / before[-1]
    assert "is a checkpoint of the run in" in refused("--init-from", str(step))
    assert refused("--resume", "auto") == (
        f"cookmind train: error: --resume auto continues the run in {run} and --overwrite deletes its checkpoints: "
        "give one of them (--overwrite starts afresh)"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # nothing deleted
    assert _run(store, "--run-dir", str(tmp_path / "next"), "--init-from", str(run), "train.max_steps=1") == 0
    assert _run(store, "--run-dir", str(run), "--overwrite", "train.max_steps=1") == 0  # what --overwrite is for


def test_lora_without_a_model_to_adapt_is_refused(tmp_path, store, capsys):
    # it trained adapters on a random frozen base, status "completed" (and DPO took that base as its reference)
    assert _run(store, "--run-dir", str(tmp_path / "l"), "lora.enabled=true", "train.max_steps=1") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "cookmind train: error: lora.enabled=true adapts a trained model, and train.init_from is not set: the frozen "
        "base would be random weights; pass --init-from MODEL (a checkpoint, a run directory or a Hugging Face folder)"
    )
    assert not (tmp_path / "l" / "checkpoints").exists()


def test_a_resume_whose_config_replaces_the_runs_own_says_so(tmp_path, store, capsys):
    # `--config tiny-cpu --run-dir a --resume auto` read no training data and failed as "model.vocab_size is not set
    # and there is no tokenizer", which said nothing of the config that replaced the run's
    run = tmp_path / "a"
    assert _run(store, "--run-dir", str(run), "train.max_steps=2", "checkpoint.every=2") == 0
    capsys.readouterr()
    assert _train("--config", "tiny-cpu", "--run-dir", str(run), "--resume", "auto", *TINY, "train.max_steps=3") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cookmind train: error: --config tiny-cpu replaces {run / 'config.yaml'}, the resumed run's own config, and "
        "names no training data: leave --config out to resume with the run's config, or pass --train-data (and "
        "--tokenizer)"
    )
    assert _train("--run-dir", str(run), "--resume", "auto", "train.max_steps=3") == 0  # what the line says
    # with training data --config's settings replace the run's: that was silent; now the settings that differ are said
    capsys.readouterr()
    mine = tmp_path / "mine.yaml"
    mine.write_text("optim: {weight_decay: 0.0}\n")  # the command's overrides go on both: optim.lr is no difference
    again = ["--config", str(mine), "--run-dir", str(run), "--resume", "auto", "--train-data", str(store), *TINY]
    assert _train(*again, "optim.lr=1e-3", "train.max_steps=4") == 0
    assert (
        f"cookmind train: --config {mine} replaces {run / 'config.yaml'}, the resumed run's own settings: "
        "optim.warmup_steps=0 (the run had 10), optim.weight_decay=0.0 (the run had 0.1), train.device=auto (the run "
        "had cpu); leave --config out to resume the run as it was saved\n"
    ) in capsys.readouterr().err  # a file is no preset: what it leaves out takes the schema's defaults


def test_a_run_whose_only_checkpoint_is_damaged_says_so_not_yet_or_an_older_one(tmp_path, store, capsys):
    # "skipping checkpoint ...: damaged; using an older one", then "a training run without a complete checkpoint in
    # its checkpoints/ yet": there was no older one, and waiting would not help
    from cookmind.cli import main

    run = tmp_path / "run"
    assert _run(store, "--run-dir", str(run), "train.max_steps=2") == 0
    (step,) = (run / "checkpoints").iterdir()
    weights = step / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    capsys.readouterr()
    with pytest.warns(UserWarning, match=r"model.safetensors .*; and there is no older one$"):
        assert main(["generate", str(run), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    said = f"{run}: none of its checkpoints ({step.name}) is complete and whole (the warnings above say why); restore "
    assert last.endswith(said + "one from a copy, or train again")


def test_a_model_path_that_is_a_file_or_missing_is_named_so(tmp_path, capsys):
    # a file was "no such model directory" (generate), "FILE/config.json: missing" (export); a missing import
    # folder "nonexist/config.json: missing"; a broken config.json "a cookmind model, not a Hugging Face folder"
    from cookmind.cli import main

    (tmp_path / "data.jsonl").write_text("{}\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    cases = [
        (["generate", str(tmp_path / "data.jsonl"), "--prompt", "hi"], "data.jsonl: a file, not a model folder"),
        (["export", "--hf", str(tmp_path / "data.jsonl"), str(tmp_path / "o1")], "a file, not a model folder"),
        (["import", "--hf", str(tmp_path / "nope"), str(tmp_path / "o2")], "nope: no such folder"),
        (["import", "--hf", str(tmp_path / "data.jsonl"), str(tmp_path / "o3")], "a file, not a Hugging Face model"),
        (["import", "--hf", str(tmp_path / "bad"), str(tmp_path / "o4")], "bad/config.json: not valid JSON"),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        assert says in capsys.readouterr().err.strip().splitlines()[-1], argv


def test_the_last_checkpoint_holds_the_final_evaluation_and_a_resume_at_the_end_does_not_repeat_it(
    tmp_path, store, capsys
):
    """The final checkpoint was saved before the end-of-run evaluation, so its last_eval was an older one; a resume
    of the finished run (nothing left to train) evaluated again and metrics.jsonl held the final row twice. The
    checkpoint now records the final evaluation, and the resume reports it without a second row."""
    run = tmp_path / "run"
    argv = ["--run-dir", str(run), "--val-data", str(store), "train.max_steps=3", "eval.every=2"]

    def val_rows():
        rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        return [r for r in rows if r.get("split") == "val"]

    assert _run_after_tiny(store, *argv) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = val_rows()
    assert [r["step"] for r in rows] == [2, 3]
    final = {k: v for k, v in rows[-1].items() if k not in ("step", "split")}
    meta = json.loads((run / "checkpoints" / "step_00000003" / "meta.json").read_text())
    assert meta["last_eval"] == pytest.approx(final, rel=1e-4)  # metrics.jsonl rounds
    assert first["val_loss"] == pytest.approx(final["val_loss"], rel=1e-4)
    assert _run_after_tiny(store, *argv, "--resume", "auto") == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert val_rows() == rows
    assert again["status"] == "completed" and again["steps"] == 3
    assert again["val_loss"] == first["val_loss"]


def test_a_resume_of_another_runs_finished_checkpoint_into_a_new_run_dir_writes_nothing(tmp_path, store, capsys):
    """`--run-dir runs/G --resume runs/B/checkpoints/step_N` with N >= train.max_steps said "nothing to train" and
    then wrote runs/G: a config.yaml, and a report of a "completed" run of N steps with B's losses and no checkpoint.
    It is refused now, before anything is written; with steps left it continues B's training in G, as before."""
    finished = tmp_path / "B"
    assert _run_after_tiny(store, "--run-dir", str(finished), "train.max_steps=3") == 0
    ckpt = finished / "checkpoints" / "step_00000003"
    capsys.readouterr()
    forked = tmp_path / "G"
    assert _run_after_tiny(store, "--run-dir", str(forked), "--resume", str(ckpt), "train.max_steps=2") == 2
    err = capsys.readouterr().err
    assert f"{ckpt} is at step 3, already at or past train.max_steps=2: nothing to train in {forked}" in err, err
    assert "--init-from" in err and not forked.exists()
    assert _run_after_tiny(store, "--run-dir", str(forked), "--resume", str(ckpt), "train.max_steps=4") == 0
    assert (forked / "checkpoints" / "step_00000004" / "meta.json").is_file()


def test_a_resume_with_no_checkpoint_yet_drops_the_rows_of_the_attempt_that_saved_none(tmp_path, store, capsys):
    """A job killed before its first checkpoint, resumed with --resume auto, started at step 0 on top of the killed
    attempt's metrics.jsonl: its rows read 1..8, 1, 2, ... and the report's plots mixed two runs."""
    import shutil

    every = ["train.max_steps=2", "checkpoint.every=0", "logging.log_every=1"]
    assert _run_after_tiny(store, "--run-dir", str(tmp_path / "straight"), *every) == 0
    run = tmp_path / "killed"
    assert _run_after_tiny(store, "--run-dir", str(run), "train.max_steps=3", "checkpoint.every=0") == 0
    shutil.rmtree(run / "checkpoints")  # killed before it saved one
    capsys.readouterr()
    assert _run_after_tiny(store, "--run-dir", str(run), "--resume", "auto", *every) == 0
    err = capsys.readouterr().err
    assert "starting at step 0" in err and "rows of metrics.jsonl were logged by an attempt that saved no" in err, err

    def rows(d):
        keep = ("step", "split", "loss", "lr", "grad_norm")
        return [{k: r.get(k) for k in keep} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]

    assert rows(run) == rows(tmp_path / "straight")


def test_a_run_dir_in_another_runs_checkpoints_folder_is_refused_before_anything_is_written(tmp_path, store, capsys):
    """`--run-dir runs/A/checkpoints/new` (or a folder beside a checkpoint.dir's step_N checkpoints) started a run
    there, where A's keep_last pruning and --overwrite delete, and A's newest-checkpoint rule looks. Refused in one
    line, nothing written; a user's own folder of step_N folders (no checkpoint files) is no run's and takes one."""
    step = tmp_path / "runs" / "A" / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")  # a checkpoint's last file
    (tmp_path / "runs" / "A" / "config.yaml").write_text("train: {}\n")
    elsewhere = tmp_path / "ck" / "step_00000005"  # a checkpoint.dir outside a run folder
    elsewhere.mkdir(parents=True)
    (elsewhere / "meta.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "seq" not in p.parts)
    cases = [
        (["--run-dir", str(step.parent / "new")], step.parent),
        (["--run-dir", str(step)], step.parent),
        (["--run-dir", str(step), "--resume", "auto"], step.parent),
        (["--run-dir", str(tmp_path / "ck" / "new")], tmp_path / "ck"),
        (["--run-dir", str(tmp_path / "B"), f"checkpoint.dir={step / 'ck'}"], step.parent),
    ]
    for argv, root in cases:
        assert _run(store, *argv, "train.max_steps=1") == 2, argv
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("cookmind train: error: ") and f"is in {root}, a training run's checkpoints" in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "seq" not in p.parts) == before
    notes = tmp_path / "exp"  # the user's folders step_1, step_2 of notes
    for name in ("step_1", "step_2"):
        (notes / name).mkdir(parents=True)
        (notes / name / "notes.txt").write_text("what I tried\n")
    assert _run(store, "--run-dir", str(notes / "step_3"), "train.max_steps=1") == 0
    assert (notes / "step_3" / "config.yaml").is_file()


def test_a_projects_own_checkpoints_folder_beside_its_config_yaml_takes_runs(tmp_path, store):
    """A project keeping its own config.yaml at its root and its runs under checkpoints/ (proj/checkpoints/run1) was
    taken for a run's checkpoints folder that had not saved yet: a new run there, and the resume of one, refused.
    A run's folder holds its metrics.jsonl or lock beside config.yaml; the project's root holds neither."""
    proj = tmp_path / "proj"
    (proj / "checkpoints").mkdir(parents=True)
    (proj / "config.yaml").write_text("project: mine\n")
    run1 = proj / "checkpoints" / "run1"
    assert _run(store, "--run-dir", str(run1), "train.max_steps=1") == 0
    assert (run1 / "checkpoints").is_dir() and (run1 / "config.yaml").is_file()
    assert _run(store, "--run-dir", str(run1), "--resume", "auto", "train.max_steps=2") == 0


def test_a_signal_as_a_failed_run_ends_does_not_promise_a_save(tmp_path, store, monkeypatch, capfd):
    """torchrun SIGTERMs the surviving workers as one of them fails (a peer killed, an error on one rank): the signal
    reached a rank that had already stopped on its own error and said "SIGTERM: stopping when the step under way
    ends, then saving", after the error line; no step was under way and nothing was saved."""
    launch, close = Trainer._launch_step, Trainer.close

    def launch_and_fail(self):
        if self.step == 1:
            raise ValueError("the batch of step 2 failed")
        return launch(self)

    def close_as_torchrun_signals(self):  # the failed run cleans up: torchrun's SIGTERM arrives now
        os.kill(os.getpid(), signal.SIGTERM)
        return close(self)

    monkeypatch.setattr(Trainer, "_launch_step", launch_and_fail)
    monkeypatch.setattr(Trainer, "close", close_as_torchrun_signals)
    assert _run(store, "--run-dir", str(tmp_path / "run"), "train.max_steps=3") == 2
    err = capfd.readouterr().err
    assert "cookmind train: error: the batch of step 2 failed" in err, err
    assert "then saving" not in err and "SIGTERM came as the run was ending on its error; nothing is saved" in err, err
    # the error line is printed last, after the run's clean-up, where the signal came: the note must not point "above"
    assert err.index("SIGTERM came") < err.index("error: the batch of step 2 failed") and "above" not in err, err


def test_a_peer_lost_after_the_last_step_is_not_told_at_a_step_past_max_steps():
    """A peer that goes while the run saves its last checkpoint or writes its report was told "at step
    max_steps + 1", a step the run never has (review finding)."""
    from types import SimpleNamespace

    from cookmind.train.cli import _where_the_run_is

    def trainer(step):
        return SimpleNamespace(step=step, cfg=SimpleNamespace(train=SimpleNamespace(max_steps=3)))

    assert _where_the_run_is(trainer(0)) == "at step 1"
    assert _where_the_run_is(trainer(2)) == "at step 3"
    assert _where_the_run_is(trainer(3)) == "after its last step (3), saving or reporting"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--objective", "sft", "lora.r=4"], "'lora.r=4': changes nothing without lora.enabled=true"),
        (["--objective", "sft", "lora.targets=[q_proj]"], "without lora.enabled=true"),
        (["--objective", "sft", "dpo.beta=0.5"], "only a dpo run reads the dpo section (train.objective=sft)"),
        (["grpo.group_size=4"], "only a grpo run reads the grpo section (train.objective=pretrain)"),
        (["--objective", "grpo", "grpo.eval_size=5"], "'grpo.eval_size=5': changes nothing without grpo.eval_problems"),
        (["parallel.reshard_after_forward=false"], "'parallel.reshard_after_forward=false': changes nothing without "),
        (["parallel.fsdp_unit_blocks=2"], "changes nothing without parallel.fsdp=true"),
        (["parallel.fsdp_prefetch=true"], "changes nothing without parallel.fsdp=true"),
        (["parallel.fsdp=true", "parallel.bucket_mb=50"], "'parallel.bucket_mb=50': changes nothing with "),
    ],
)
def test_an_override_the_run_does_not_read_is_refused(argv, said, capsys):
    """`train --objective sft lora.r=4` (lora.enabled=true forgotten) fine-tuned the whole model, and dpo.* / grpo.*
    in another objective's run were taken and ignored, saying nothing."""
    from cookmind.cli import main

    assert main(["train", "--print-config", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cookmind train: error: override ") and said in err and err.count("\n") == 1
    # the same settings where the run reads them
    assert main(["train", "--print-config", "lora.enabled=true", "lora.r=4", "--objective", "dpo", "dpo.beta=0.5"]) == 0
    assert main(["train", "--print-config", "--objective", "grpo", "grpo.group_size=4"]) == 0
    assert main(["train", "--print-config", "--objective", "grpo", "grpo.eval_problems=p", "grpo.eval_size=5"]) == 0
    assert main(["train", "--print-config", "parallel.fsdp=true", "parallel.fsdp_unit_blocks=2"]) == 0
    assert main(["train", "--print-config", "parallel.bucket_mb=50"]) == 0


def test_an_override_the_found_run_reads_is_taken_on_a_resume_auto_without_run_dir(tmp_path, monkeypatch, capsys):
    """--resume auto without --run-dir checked the overrides against the preset, before the run found took its
    place: ``grpo.eval_size=5`` was refused as changing nothing without grpo.eval_problems, which the found run sets
    (with --run-dir the same command resumed)."""
    from cookmind.cli import main

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "tiny-cpu-20261204-170000"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["train", "--print-config", "--objective", "grpo", "grpo.eval_problems=gsm8k.jsonl"]) == 0
    (run / "config.yaml").write_text(capsys.readouterr().out)
    cfg = cli.resolve_config(_args("--objective", "grpo", "--resume", "auto", "grpo.eval_size=5"))
    assert (cfg.logging.run_dir, cfg.grpo["eval_problems"], cfg.grpo["eval_size"]) == (
        str(Path("runs") / run.name),
        "gsm8k.jsonl",
        5,
    )
    # the preset's own run still refuses what no run of it reads
    with pytest.raises(ValueError, match="grpo.eval_size=5"):
        cli.resolve_config(_args("--objective", "grpo", "grpo.eval_size=5"))


def test_a_config_that_replaces_the_runs_own_is_not_held_to_the_run_it_replaces(tmp_path, store, capsys):
    """The note naming what a --config changes loaded the run's old config.yaml with this command's overrides: an
    override that fits only the new config (a longer window for a longer context) stopped the command with an error
    about the config being replaced."""
    from cookmind.cli import main

    run = tmp_path / "run"
    run.mkdir()
    assert main(["train", "--print-config", "--train-data", str(store), *TINY]) == 0
    (run / "config.yaml").write_text(capsys.readouterr().out)
    longer = "model.max_position_embeddings=512"
    assert main(["train", "--print-config", "--train-data", str(store), *TINY, longer]) == 0
    new = tmp_path / "new.yaml"
    new.write_text(capsys.readouterr().out)
    argv = ["--config", str(new), "--run-dir", str(run), "--resume", "auto", "--train-data", str(store)]
    args = _args(*argv, "data.window_size=300")  # the run's context is 256, the new config's 512
    cfg = cli.resolve_config(args)
    assert (cfg.model["max_position_embeddings"], cfg.data.window_size) == (512, 300)
    assert f"--config {new} replaces {run / 'config.yaml'}" in args.settings_note


def test_a_found_run_whose_config_no_longer_loads_is_named_with_the_way_out(tmp_path, monkeypatch, capsys):
    """--resume auto without --run-dir now loads the found run's config.yaml; one that no longer loads (a key since
    renamed, a value since refused) said only the key's error, not whose config it was or how to resume anyway."""
    from cookmind.cli import main

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "tiny-cpu-20261204-170000"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["train", "--print-config"]) == 0
    saved = yaml.safe_load(capsys.readouterr().out)
    saved["optim"]["lr_old_name"] = 1e-3
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ValueError) as info:
        cli.resolve_config(_args("--resume", "auto"))
    found = Path("runs") / run.name
    assert str(info.value).startswith(f"{found / 'config.yaml'}, the config of the run --resume auto found, does not")
    assert str(info.value).endswith(
        f"resume it with --run-dir {found} --config C (a config that loads), or leave --resume out to start a new run"
    )


def test_a_ctrl_c_as_the_run_drops_its_wrappers_still_leaves_the_process_group(monkeypatch):
    """A second Ctrl-C while the train CLI's teardown dropped the model's wrappers (trainer.close, a garbage
    collection) skipped destroy_distributed after it: the group was left standing into the process's end."""
    import cookmind.parallel

    left = []
    monkeypatch.setattr(cookmind.parallel, "destroy_distributed", lambda: left.append("left"))

    class Stopped:
        def fit(self):
            return {"status": "completed", "steps": 1}

        def close(self):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cli._fit_and_report(Stopped(), None)
    assert left == ["left"]


def test_a_run_dir_inside_a_folder_the_run_reads_is_refused_before_it_starts(tmp_path, store, capsys):
    """`--train-data STORE --run-dir STORE/run` (as `import --hf HF --out HF/sub`) wrote the run into the folder it
    reads: refused in one line naming the setting and a folder beside it instead; nothing is made there."""
    assert _run(store, "--run-dir", str(store / "run"), "train.max_steps=1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"cookmind train: error: --run-dir {store / 'run'} is inside {store}, the folder --train-data "
        f"(data.train_path) reads; write it outside that folder, e.g. {tmp_path / 'seq-run'}"
    ), err
    assert not (store / "run").exists()


def test_a_run_dir_inside_the_run_it_starts_from_is_accepted(tmp_path, store, capsys):
    """`--init-from runs/pre --run-dir runs/pre/sft` was refused as 'inside runs/pre, the folder --init-from reads',
    though a run directory is read only through its checkpoints/ (which refuse any output inside them): the new run
    beside them harms nothing, and the run it started from still loads and resumes."""
    pre = tmp_path / "pre"
    assert _run(store, "--run-dir", str(pre), "train.max_steps=1") == 0
    capsys.readouterr()
    assert _run(store, "--init-from", str(pre), "--run-dir", str(pre / "next"), "train.max_steps=1") == 0
    assert (pre / "next" / "checkpoints").is_dir()
    # its checkpoints/ still refuse: the new run would be another run's checkpoint there
    assert _run(store, "--init-from", str(pre), "--run-dir", str(pre / "checkpoints" / "x"), "train.max_steps=1") == 2
    assert "checkpoints" in capsys.readouterr().err


def test_a_fresh_run_under_resume_auto_inside_a_folder_it_reads_is_refused(tmp_path, store, capsys):
    """`--resume auto` that finds nothing starts a fresh run: job scripts pass it always. It skipped the check, so
    `--train-data STORE --run-dir STORE/run --resume auto` wrote the run inside the store."""
    assert _run(store, "--run-dir", str(store / "run"), "--resume", "auto", "train.max_steps=1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"--run-dir {store / 'run'} is inside {store}, the folder --train-data (data.train_path) reads" in err[-1]
    assert not (store / "run").exists()


def test_a_completed_run_is_its_own_whatever_way_its_paths_are_spelled(tmp_path, store, capsys, monkeypatch):
    """The same command typed with `--train-data seq/` (tab completion's slash) or an absolute path was told its own
    completed run was 'another run': the paths it reads are compared as the files they name."""
    monkeypatch.chdir(tmp_path)
    argv = ("--run-dir", "run", "train.max_steps=2")
    assert _train("--train-data", "seq", *TINY, *argv) == 0
    capsys.readouterr()
    for spelled in ("seq/", str(store), "./seq"):
        assert _train("--train-data", spelled, *TINY, *argv) == 2
        err = capsys.readouterr().err
        assert "holds this command's own run, completed at step 2" in err, (spelled, err)
    other = write_store(tmp_path / "seq2", "seq", [{"sequence": np.arange(1, 41) % 64} for _ in range(4)], 64)
    assert _train("--train-data", str(other), *TINY, *argv) == 2  # another store: another run
    assert "already holds another run" in capsys.readouterr().err


def test_quiet_draws_no_progress_as_the_other_long_commands_quiet(tmp_path, store, capsys):
    """curate, pack, tokenizer train, eval and demo take --quiet; train took only logging.progress=false, and refused
    --quiet as an unknown argument. --quiet is logging.progress=false now: the run's notes and summary stay."""
    quiet = [o for o in TINY if o != "logging.progress=false"]
    assert _train("--train-data", str(store), "--run-dir", str(tmp_path / "q"), "--quiet", *quiet) == 0
    captured = capsys.readouterr()
    assert "pretrain:" not in captured.err and "run directory" in captured.err
    assert json.loads(captured.out.splitlines()[-1])["status"] == "completed"
    assert _args("--quiet").quiet and not _args().quiet
    assert _train("--train-data", str(store), "--run-dir", str(tmp_path / "p"), *quiet, "train.max_steps=2") == 0
    assert "pretrain: 100% 2/2" in capsys.readouterr().err  # without it: the bar (lines here, in no terminal)


def test_a_sigterm_in_a_log_is_said_on_a_line_of_its_own_without_a_blank_one(tmp_path, store, sigterm_at_step, capfd):
    """The stop's note began with a newline, to end a terminal bar's line; in a pipe or a log, where every progress
    line ends in its own newline, it left a blank line in the log. The newline comes first on a terminal only."""
    sigterm_at_step(1)
    quiet = [o for o in TINY if o != "logging.progress=false"]
    assert _train("--train-data", str(store), "--run-dir", str(tmp_path / "r"), *quiet, "train.max_steps=50") == 143
    err = capfd.readouterr().err
    assert "\ncookmind train: SIGTERM: stopping when the step under way ends, then saving\n" in err
    assert "\n\n" not in err and "pretrain:   0% 0/50" in err


def test_a_resume_shows_its_progress_bar_unless_this_command_asks_for_quiet(tmp_path, store, monkeypatch, capsys):
    """A run started with --quiet saved logging.progress=false in its config.yaml, and `--resume auto` took it with
    the run's settings: the resumed run, started without --quiet at a terminal, showed no progress at all (the note
    listed it among the run's settings kept). The bar is this command's, as --quiet is: a resume shows it unless
    this command says --quiet (or logging.progress=false)."""
    monkeypatch.chdir(tmp_path)
    tiny = [o for o in TINY if not o.startswith("logging.progress")]
    argv = ["--train-data", str(store), "--quiet", "train.max_steps=1", *tiny]
    assert _train("--run-dir", "named", *argv) == 0
    assert _train(*argv) == 0  # a run of the preset's default run directory, found by --resume auto
    assert yaml.safe_load(Path("named/config.yaml").read_text())["logging"]["progress"] is False
    capsys.readouterr()
    for found in (["--run-dir", "named"], ["--train-data", str(store)]):
        resume = [*found, "--resume", "auto", "train.max_steps=2"]
        assert cli.resolve_config(_args(*resume)).logging.progress is True, found
        assert cli.resolve_config(_args(*resume, "--quiet")).logging.progress is False, found
        assert cli.resolve_config(_args(*resume, "logging.progress=false")).logging.progress is False, found
        assert _train(*resume) == 0
        err = capsys.readouterr().err
        assert "pretrain: 100% 2/2" in err and "logging.progress" not in err, err


def test_a_resume_from_a_checkpoint_path_alone_names_the_run_that_saved_it(tmp_path, store, capsys):
    """`--resume RUN/checkpoints/step_N` with nothing else (as a user copies the path the stop printed) said "no
    training data: pass --train-data STORE": the default preset was taken, not the settings of the run that saved the
    checkpoint. It now names that run and the command that resumes it."""
    run = tmp_path / "run"
    assert _run_after_tiny(store, "--run-dir", str(run), "train.max_steps=2", "checkpoint.every=1") == 0
    ckpt = run / "checkpoints" / "step_00000001"
    capsys.readouterr()
    assert _train("--resume", str(ckpt)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"cookmind train: error: --resume {ckpt} takes its settings from --run-dir: the run that saved it is {run} "
        f"(its config.yaml); resume it with --run-dir {run} --resume {ckpt} (or --resume auto, its newest "
        "checkpoint), or pass --train-data STORE and the settings to train a new run from it"
    ), err


def test_a_warmup_as_long_as_the_run_is_said_in_one_line(tmp_path, store, capsys):
    # optim.warmup_steps >= train.max_steps: the learning rate rose through the whole run, never reaching its decay
    # (nor, past max_steps, optim.lr), without a word
    lr = ["optim.lr=0.001", "optim.schedule=cosine"]
    assert _run(store, "--run-dir", str(tmp_path / "a"), *lr, "optim.warmup_steps=8", "train.max_steps=4") == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "optim.warmup_steps" in ln]
    assert notes == [
        "cookmind train: optim.warmup_steps=8 is not below train.max_steps=4: the learning rate rises through the "
        "whole run (to 0.0005 at its last step, of optim.lr=0.001) and never decays; lower optim.warmup_steps (a "
        "few percent of the steps is usual) or raise train.max_steps"
    ], notes
    assert _run(store, "--run-dir", str(tmp_path / "b"), *lr, "optim.warmup_steps=3", "train.max_steps=4") == 0
    assert "optim.warmup_steps" not in capsys.readouterr().err


def test_the_train_package_reads_torchruns_local_rank_through_one_rule():
    # the stop note's "once a node" read LOCAL_RANK itself beside cookmind.cli.a_nodes_other_rank, the one rule the
    # other once-a-node lines follow (and which also asks whether there are several ranks at all)
    import cookmind.train

    package = Path(cookmind.train.__file__).parent
    readers = [p.name for p in sorted(package.glob("*.py")) if "LOCAL_RANK" in p.read_text()]
    assert readers == [], readers


def test_the_package_reads_torchruns_rank_through_one_rule():
    # "who speaks" read RANK inline in three places (the run directory note, init_from's shape note), beside
    # cookmind.cli's a_nodes_other_rank; every such read is cookmind.cli's not_global_rank_zero now, and only the
    # launch itself (cookmind.parallel.process_group, cookmind.cli) reads torchrun's variables
    import cookmind

    package = Path(cookmind.__file__).parent
    reads = re.compile(r"""environ(\.get\(|\[)\s*["'](LOCAL_)?RANK["']""")
    launch = ("cli.py", "parallel/process_group.py")
    readers = sorted(
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if reads.search(p.read_text()) and p.relative_to(package).as_posix() not in launch
    )
    assert readers == [], readers


@pytest.mark.parametrize(
    "env, other",
    [
        ({}, False),  # one process
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, False),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, True),
        ({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"}, True),  # a second node's first rank: not rank 0
        ({"WORLD_SIZE": "1", "RANK": "3"}, False),  # a stray RANK in a single process's environment
    ],
)
def test_not_global_rank_zero_follows_torchruns_variables(monkeypatch, env, other):
    from cookmind.cli import not_global_rank_zero

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert not_global_rank_zero() is other


def test_the_run_directory_note_is_said_by_global_rank_zero_alone(monkeypatch, capsys, store, tmp_path):
    def stopped(cfg):
        raise cli._StoppedAtStart(signal.SIGTERM)

    monkeypatch.setattr("cookmind.train.trainer.Trainer", stopped)
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", "0")  # each rank the first of its node
        args = _args("--train-data", str(store), "--run-dir", str(tmp_path / f"run{rank}"), *TINY)
        assert cli.main(args) == 128 + signal.SIGTERM
        said[rank] = capsys.readouterr().err
    assert "run directory" in said["0"] and "run directory" not in said["1"]


def test_a_stop_note_into_a_closed_stderr_does_not_end_the_run(monkeypatch):
    """The stop handler wrote its note by os.write with no guard: with stderr gone (`cookmind train ... 2>&1 | head`
    ended, a closed terminal) the handler raised BrokenPipeError into whatever the step was doing, and the run
    ended on it instead of stopping after the step with its checkpoint. The note is cookmind.terminal's
    say_from_handler now, which serve's handler uses too."""
    from types import SimpleNamespace

    from cookmind import terminal

    def gone(fd, data):
        raise BrokenPipeError(32, "Broken pipe")

    run = SimpleNamespace(_stop_reason=None, dist=SimpleNamespace(is_main=True), step=0)
    run.cfg = SimpleNamespace(train=SimpleNamespace(max_steps=5))
    run.request_stop = lambda reason: setattr(run, "_stop_reason", reason)
    old = Trainer._install_signal_handlers(run)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        monkeypatch.setattr(os, "write", gone)
        handler(signal.SIGTERM, None)  # raised BrokenPipeError
        terminal.say_from_handler("cookmind serve: stopping")  # nothing to tell: nothing raised either
    finally:
        Trainer._restore_signal_handlers(old)
    assert run._stop_reason == "signal SIGTERM"


def test_a_note_from_a_signal_handler_is_one_write_of_the_line(monkeypatch):
    from cookmind import terminal

    writes = []
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append((fd, data)) or len(data))
    monkeypatch.setattr(os, "isatty", lambda fd: False)
    terminal.say_from_handler("cookmind train: SIGTERM: stopping")
    monkeypatch.setattr(os, "isatty", lambda fd: True)  # a terminal: a newline ends the progress bar's line first
    terminal.say_from_handler("cookmind train: SIGTERM: stopping")
    assert writes == [(2, b"cookmind train: SIGTERM: stopping\n"), (2, b"\ncookmind train: SIGTERM: stopping\n")]


def _sigterm_as_the_trainer_starts(monkeypatch) -> None:
    """SIGTERM to this process as the Trainer starts to set the run up (before fit's handlers)."""
    init = Trainer.__init__

    def init_and_kill(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return init(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", init_and_kill)


def test_a_sigterm_as_the_run_starts_says_it_stopped_before_its_first_step(tmp_path, store):
    # In a subprocess: the default handler ended the process without a word (exit -15), the user left to guess
    # whether a step ran or anything was saved
    import subprocess
    import sys
    import textwrap

    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import sys
        import pytest
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_train_cli as t
        with pytest.MonkeyPatch.context() as mp:
            t._sigterm_as_the_trainer_starts(mp)
            sys.exit(t._run({str(store)!r}, "--run-dir", {str(run)!r}, "train.max_steps=5"))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.splitlines()[-1] == (
        "cookmind train: SIGTERM came as the run was starting: stopped before its first step; nothing was saved"
    ), proc.stderr[-2000:]
    assert not run.exists()  # the run directory is made last, once the run can start


def test_a_ctrl_c_as_the_run_starts_says_it_stopped_before_its_first_step(monkeypatch, capsys, tmp_path, store):
    # a SIGTERM there said "stopped before its first step; nothing was saved", a Ctrl-C only "cookmind train:
    # interrupted", leaving the user to guess whether a step ran or anything was saved
    monkeypatch.delenv("COOKMIND_DEBUG", raising=False)

    def ctrl_c(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "__init__", ctrl_c)
    run = tmp_path / "run"
    assert _train("--train-data", str(store), "--run-dir", str(run), *TINY) == 128 + signal.SIGINT
    assert capsys.readouterr().err.splitlines()[-1] == (
        "cookmind train: SIGINT came as the run was starting: stopped before its first step; nothing was saved"
    )
    assert not run.exists()


def test_a_floor_ratio_a_constant_schedule_never_reaches_is_noted(monkeypatch, capsys, store, tmp_path):
    # optim.min_lr_ratio is the cosine's floor: given with optim.schedule=constant it was taken and ignored, saying
    # nothing (a note, not a refusal: a resume that follows the schedule warning's advice repeats its command with
    # optim.schedule=constant added)
    def stopped(cfg):
        raise cli._StoppedAtStart(signal.SIGTERM)

    monkeypatch.setattr("cookmind.train.trainer.Trainer", stopped)
    said = {}
    for schedule in ("constant", "cosine"):
        args = _args("--train-data", str(store), "--run-dir", str(tmp_path / schedule), *TINY)
        args.overrides += [f"optim.schedule={schedule}", "optim.min_lr_ratio=0.05"]
        assert cli.main(args) == 128 + signal.SIGTERM
        said[schedule] = capsys.readouterr().err
    assert (
        "cookmind train: optim.min_lr_ratio=0.05 changes nothing with optim.schedule=constant (the learning rate "
        "stays at optim.lr after its warmup; the ratio is the cosine schedule's floor): set optim.schedule=cosine to "
        "decay to it, or leave it out\n"
    ) in said["constant"]
    assert "min_lr_ratio" not in said["cosine"]
