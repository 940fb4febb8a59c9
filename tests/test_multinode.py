"""Two nodes on loopback: two torchrun launches of one process each, joined by the c10d rendezvous
(``--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``, gloo), train to the same weights as one process
with the same global batch (#18 item 3)."""

import contextlib
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gloo_fixtures import data_parallel_overrides, find_free_port, run_on_gloo_ranks
from lm_fixtures import tiny_cli_overrides

from cookmind.model import load_model
from cookmind.store import write_store
from cookmind.train import TrainConfig, Trainer
from cookmind.train import cli as train_cli
from cookmind.train.callbacks import Callback
from cookmind.train.checkpoint import find_latest_checkpoint

REPO = Path(__file__).resolve().parents[1]


def node_cmd(node_rank: int, port: int, *args: str) -> list[str]:
    """One node's launch, exactly as the README's multi-node section writes it (1 process on this node)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--node-rank",
        str(node_rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "cookmind-test",
        "--max-restarts",
        "0",
        "-m",
        "cookmind",
        "train",
        *args,
    ]


def test_two_nodes_on_loopback_equal_one_process(tmp_path, keep_threads):
    common = data_parallel_overrides(tmp_path, max_steps=4)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")
    # both "nodes" see one filesystem (tmp_path): rank 0 writes the run directory and the checkpoints
    args = ["--config", str(cfg_file), "--run-dir", str(tmp_path / "two"), "train.micro_batch_size=2", *common]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    port = find_free_port()
    procs = [
        subprocess.Popen(node_cmd(r, port, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    summaries = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    assert len(summaries) == 1, "only global rank 0 prints the summary, on whichever node it landed"
    assert summaries[0]["steps"] == 4 and summaries[0]["tokens"] == 4 * 2 * 2 * 2 * 16  # steps x accum x nodes x B x T
    ckpts = sorted((tmp_path / "two" / "checkpoints").iterdir())
    assert len(ckpts) == 1 and ckpts[0].name.startswith("step_"), f"one checkpoint per job, not per node: {ckpts}"
    assert json.loads((ckpts[0] / "meta.json").read_text())["world_size"] == 2

    torch.set_num_threads(1)  # keep_threads restores the count
    one = TrainConfig.load(str(cfg_file), [*common, f"logging.run_dir={tmp_path / 'one'}", "train.micro_batch_size=4"])
    Trainer(one).fit()
    a = load_model(ckpts[0]).state_dict()
    b = load_model(find_latest_checkpoint(tmp_path / "one" / "checkpoints")).state_dict()
    init = Trainer(TrainConfig.load(str(cfg_file), [*common, f"logging.run_dir={tmp_path / 'x'}"])).bare_model
    assert max((a[k] - init.state_dict()[k]).abs().max().item() for k in a) > 1e-3, "training changed the weights"
    # fp32 on CPU; the two-rank mean of gradients sums in another order than one batch of 4: not bit for bit
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)


def _resume_on_rank(rank: int, root: str) -> str:
    """Rank r resumes from its own node's checkpoints (no shared filesystem): only node 0's hold one. (The run
    directory is the same on every rank; its own checkpoint.dir stands for what another node's disk holds.)"""
    own = [f"logging.run_dir={root}/node0", f"checkpoint.dir={root}/node{rank}/checkpoints"]
    cfg = TrainConfig.load(None, [*_tiny_run(root), *own, "checkpoint.resume=auto"])
    try:
        Trainer(cfg)
    except ValueError as exc:  # a one-line error at the CLI, not a traceback
        return str(exc)
    return "resumed without an error"


def _tiny_run(root: str) -> list[str]:
    return [
        f"data.train_path={root}/seq",
        "data.window_size=16",
        "train.max_steps=2",
        "train.device=cpu",
        "logging.progress=false",
        "logging.report=false",
        *tiny_cli_overrides(),
    ]


def test_ranks_that_find_different_checkpoints_refuse_to_resume(tmp_path, keep_threads):
    # Nodes without a shared filesystem: rank 0 wrote the checkpoints on its node; rank 1 would start afresh
    # from other weights and the job would train two models. Both ranks must stop and say why.
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    Trainer(TrainConfig.load(None, [*_tiny_run(str(tmp_path)), f"logging.run_dir={tmp_path}/node0"])).fit()
    msgs = run_on_gloo_ranks(functools.partial(_resume_on_rank, root=str(tmp_path)), 2, tmp_path)
    for rank, msg in enumerate(msgs):
        assert msg.startswith("--resume auto (checkpoint.resume): the ranks found different checkpoints (no "), msg
        assert "the ranks found different checkpoints (no checkpoint, step 2" in msg, msg
        assert f"rank {rank} found {'step 2' if rank == 0 else 'none'}" in msg and "filesystem every node shares" in msg


def _clock_run_dir_on_rank(rank: int, root: str) -> str:
    """The run directory a Trainer uses when two ranks a second apart named a default one by the clock."""
    run_dir = f"logging.run_dir={root}/run-20261204-20193{rank}"
    return str(Trainer(TrainConfig.load(None, [*_tiny_run(root), run_dir])).run_dir)


def test_every_rank_takes_rank0s_run_directory(tmp_path, keep_threads):
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    dirs = run_on_gloo_ranks(functools.partial(_clock_run_dir_on_rank, root=str(tmp_path)), 2, tmp_path)
    assert dirs == [str(tmp_path / "run-20261204-201930")] * 2
    assert (tmp_path / "run-20261204-201930").is_dir() and not (tmp_path / "run-20261204-201931").exists()


def test_torchrun_without_a_run_dir_names_one_directory_once(tmp_path):
    # `cookmind train` without --run-dir names runs/<name>-<UTC time> from each rank's clock: one directory, one
    # line saying which, for the whole job
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(f"logging:\n  run_dir: {tmp_path / 'runs' / 'job'}\n")
    port = find_free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)]
    cmd += ["-m", "cookmind", "train", "--config", str(cfg_file), *_tiny_run(str(tmp_path))]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "run directory" in line]
    made = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(made) == 1 and made[0].startswith("job-"), made
    assert said == [f"cookmind train: run directory {tmp_path / 'runs' / made[0]}"], said


def _config_on_rank(rank: int, root: str, on_rank1: tuple[str, ...] = ("optim.lr=0.01", "train.max_steps=3")) -> str:
    """Node 1 launched with overrides node 0 lacks (by default another learning rate and another max_steps)."""
    mine = list(on_rank1) if rank == 1 else []
    try:
        Trainer(TrainConfig.load(None, [*_tiny_run(root), f"logging.run_dir={root}/run", *mine]))
    except ValueError as exc:
        return str(exc)
    return "started without an error"


def test_ranks_started_with_different_configs_refuse_with_the_keys(tmp_path, keep_threads):
    # it trained two models apart (another lr) with no warning, or hung at the end (another max_steps)
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    msgs = run_on_gloo_ranks(functools.partial(_config_on_rank, root=str(tmp_path)), 2, tmp_path)
    assert msgs[0] == msgs[1], msgs
    assert msgs[0].startswith("the ranks were started with different configs: optim.lr is ")
    # the host of each rank: c10d numbers the nodes as they join, so "rank 1" need not be the --node-rank 1 launch
    at = f"(on {socket.gethostname()})"
    lr_and_steps = f"on rank 0 {at} but 0.01 on rank 1 {at}; train.max_steps is 2 on rank 0 {at} but 3 on rank 1 {at}."
    assert lr_and_steps in msgs[0], msgs[0]
    assert msgs[0].endswith("Start every node and process with the same --config and overrides")


def test_a_config_difference_names_the_flag_the_user_typed_and_the_key(tmp_path, keep_threads):
    # the user typed --resume auto on one node; the refusal named only checkpoint.resume, which they never wrote
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    msgs = run_on_gloo_ranks(
        functools.partial(_config_on_rank, root=str(tmp_path), on_rank1=("checkpoint.resume=auto",)), 2, tmp_path
    )
    at = f"(on {socket.gethostname()})"
    expected = f"--resume (checkpoint.resume) is None on rank 0 {at} but 'auto' on rank 1 {at}."
    assert msgs[0] == msgs[1] and expected in msgs[0], msgs


def _run_dir_or_refusal(rank: int, root: str, dirs: tuple[str, str]) -> str:
    try:
        trainer = Trainer(TrainConfig.load(None, [*_tiny_run(root), f"logging.run_dir={root}/{dirs[rank]}"]))
    except ValueError as exc:
        return str(exc)
    return f"started in {trainer.run_dir}"


def test_a_node_given_another_run_dir_than_rank0_refuses_with_both(tmp_path, keep_threads):
    # node 0 was started with --run-dir runs/job, node 1 without (runs/<preset>-<UTC time>): rank 0 was node 1, and
    # the whole job trained in runs/tiny-cpu-20261204-201938 with no word about runs/job
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    stamped = ("runs/tiny-cpu-20261204-201938", "runs/job")
    msgs = run_on_gloo_ranks(functools.partial(_run_dir_or_refusal, root=str(tmp_path), dirs=stamped), 2, tmp_path)
    at = f"(on {socket.gethostname()})"
    expected = (
        f"--run-dir (logging.run_dir) is '{tmp_path}/runs/tiny-cpu-<UTC time>' on rank 0 {at} but "
        f"'{tmp_path}/runs/job' on rank 1 {at}."
    )
    assert msgs[0] == msgs[1] and expected in msgs[0], msgs
    assert not (tmp_path / "runs").exists()
    # each rank's clock names its own directory without --run-dir: rank 0's is the job's, as before
    clocks = ("runs/tiny-cpu-20261204-201938", "runs/tiny-cpu-20261204-201940")
    msgs = run_on_gloo_ranks(functools.partial(_run_dir_or_refusal, root=str(tmp_path), dirs=clocks), 2, tmp_path)
    assert msgs == [f"started in {tmp_path}/{clocks[0]}"] * 2, msgs


def _start_in(rank: int, root: str) -> str:
    try:
        Trainer(TrainConfig.load(None, [*_tiny_run(root), f"logging.run_dir={root}/busy", "checkpoint.overwrite=true"]))
    except ValueError as exc:  # the other ranks' RankFailed, naming rank 0's reason
        return f"{type(exc).__name__}: {exc}"
    except FileExistsError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "started"


def test_every_rank_stops_when_rank0_finds_its_run_directory_taken(tmp_path, keep_threads):
    """Only rank 0 checks the folder and takes the lock: the others waited at the barrier for a rank that had
    stopped (with --overwrite, where only rank 0 checks the folder)."""
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    msgs = run_on_gloo_ranks(functools.partial(_start_in, root=str(tmp_path)), 2, tmp_path)
    assert msgs[0].startswith("FileExistsError: ") and "holds files a training run did not write (notes.txt)" in msgs[0]
    assert msgs[1].startswith("RankFailed: rank 0 (on "), msgs
    assert msgs[1].endswith(" could not start: " + msgs[0].removeprefix("FileExistsError: ")), msgs


def _data_on_rank(rank: int, root: str) -> str:
    """Each "node" in its own folder: the same relative data.train_path, another store on node 1."""
    os.chdir(f"{root}/node{rank}")
    args = [a for a in _tiny_run(root) if not a.startswith("data.train_path=")]
    try:
        Trainer(TrainConfig.load(None, ["data.train_path=seq", *args, f"logging.run_dir={root}/run"]))
    except ValueError as exc:
        return str(exc)
    return "started without an error"


def test_ranks_that_read_different_data_at_the_same_path_refuse_to_start(tmp_path, keep_threads):
    """Nodes whose store at the configured path held other data trained apart without a word (each rank on its own
    data; only rank 0's store was recorded in the checkpoints, and a resume was refused later). Every rank now
    refuses at start-up, naming the stores."""
    rng = np.random.default_rng(0)
    for node, size in ((0, 60), (1, 40)):
        (tmp_path / f"node{node}").mkdir()
        rows = [{"sequence": rng.integers(1, 64, size=size)} for _ in range(8)]
        write_store(tmp_path / f"node{node}" / "seq", "seq", rows, vocab_size=64)
    msgs = run_on_gloo_ranks(functools.partial(_data_on_rank, root=str(tmp_path)), 2, tmp_path)
    assert msgs[0] == msgs[1], msgs
    assert msgs[0].startswith("the ranks read different data: the train store at seq is "), msgs[0]
    at = f"(on {socket.gethostname()})"
    assert f"on rank 0 {at} but " in msgs[0] and f"on rank 1 {at}" in msgs[0], msgs[0]
    assert "Give every node the same store" in msgs[0] and "\n" not in msgs[0]


def _run_and_say(rank: int, root: str, run) -> None:
    """``run()`` on this rank; writes what stopped it, as the CLI reads it (the exception's type and one-line
    message), to ``root/said{rank}``; then the process ends at once, as the CLI's does after an error (it never
    reaches the harness's barrier: a rank still waiting in a collective sees its peer leave)."""
    said = "ran without an error"
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised
        said = f"{type(exc).__name__}: {exc}"
    Path(f"{root}/said{rank}").write_text(said)
    os._exit(0)


def _said_on_ranks(root: Path, fn, **kwargs) -> list[str]:
    """``fn(rank, root=..., **kwargs)`` on two gloo ranks (fn ends in ``_run_and_say``): what each rank said."""
    with contextlib.suppress(Exception):  # the ranks end without the harness's last barrier
        run_on_gloo_ranks(functools.partial(fn, root=str(root), **kwargs), 2, root)
    return [(root / f"said{r}").read_text() if (root / f"said{r}").exists() else "(nothing)" for r in (0, 1)]


def _start_on_node(rank: int, root: str, extra: tuple = ()) -> None:
    """Each "node" in its own folder, started with the same relative paths."""
    os.chdir(f"{root}/node{rank}")
    args = [a for a in _tiny_run(root) if not a.startswith("data.train_path=")]
    cfg = TrainConfig.load(None, ["data.train_path=seq", *args, *extra, f"logging.run_dir={root}/run"])
    _run_and_say(rank, root, lambda: Trainer(cfg))


def _two_nodes(root: Path, node1_has: tuple[str, ...]) -> None:
    rng = np.random.default_rng(0)
    rows = [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)]
    for node, names in ((0, ("seq", "val")), (1, node1_has)):
        (root / f"node{node}").mkdir()
        for name in names:
            write_store(root / f"node{node}" / name, "seq", rows, vocab_size=64)


def test_a_node_missing_its_training_store_stops_every_rank_with_that_error(tmp_path, keep_threads):
    """Node 1 lacks the store: it said so and left; node 0 went on to the next collective and died there with
    gloo's 'Connection closed by peer' traceback, never saying why. Every rank now stops with node 1's reason."""
    _two_nodes(tmp_path, node1_has=())
    msgs = _said_on_ranks(tmp_path, _start_on_node)
    said = "--train-data (data.train_path): seq: no such store; make one with `cookmind pack --out seq`"
    assert msgs[1] == f"StoreError: {said}", msgs
    assert msgs[0].startswith("RankFailed: rank 1 (on "), msgs
    assert msgs[0].endswith(f" could not start: {said}"), msgs


def test_a_node_missing_its_validation_store_stops_every_rank_with_that_error(tmp_path, keep_threads):
    # the validation store is opened after the model is wrapped for data parallelism: a later point of start-up
    _two_nodes(tmp_path, node1_has=("seq",))
    msgs = _said_on_ranks(tmp_path, _start_on_node, extra=("data.val_path=val", "eval.every=1"))
    assert "val" in msgs[1] and "Connection closed" not in msgs[1], msgs
    assert msgs[0].startswith("RankFailed: rank 1 (on ") and msgs[1].split(": ", 1)[1] in msgs[0], msgs


def _save_fails_on_rank0(rank: int, root: str) -> None:
    """Rank 0's disk fills as it saves step 1's checkpoint (DiskFullError, as cookmind.atomic raises it)."""
    from cookmind.atomic import DiskFullError
    from cookmind.train import trainer as trainer_module

    def full(*args, **kwargs):
        raise DiskFullError(f"{root}/run/checkpoints: the disk is full; free space and resume")

    if rank == 0:
        trainer_module.save_checkpoint = full
    cfg = TrainConfig.load(None, [*_tiny_run(root), f"logging.run_dir={root}/run", "checkpoint.every=1"])
    _run_and_say(rank, root, lambda: Trainer(cfg).fit())


def test_a_checkpoint_rank0_cannot_save_stops_every_rank_with_its_reason(tmp_path, keep_threads):
    # rank 0 alone writes checkpoints: rank 1 went on to the next step's all-reduce and died in gloo's traceback
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _save_fails_on_rank0)
    full = f"{tmp_path}/run/checkpoints: the disk is full; free space and resume"
    assert said[0] == f"DiskFullError: {full}", said
    assert said[1].startswith("RankFailed: rank 0 (on "), said
    assert said[1].endswith(f" could not save step_00000001: {full}"), said


def _sigterm_rank1_before_step2(trainer, rank: int) -> None:
    """Rank 1 sends itself a SIGTERM as it launches step 2 (a scheduler preempting its node)."""
    import signal

    launch = trainer._launch_step

    def launch_and_kill():
        if rank == 1 and trainer.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return launch()

    trainer._launch_step = launch_and_kill


def _sigterm_to_rank1(rank: int, root: str) -> tuple:
    """A SIGTERM that reaches one node only (a scheduler preempting it), before step 2."""

    trainer = Trainer(TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=6", f"logging.run_dir={root}/run"]))
    _sigterm_rank1_before_step2(trainer, rank)
    summary = trainer.fit()
    return summary["status"], summary["steps"], trainer.stop_reason


def test_a_sigterm_to_one_node_stops_every_rank_by_that_signal(tmp_path, keep_threads):
    """Every rank stopped at the same step, but rank 0, which got no signal, said 'stopped by a stop request' and
    exited 3 while rank 1 exited 143: each rank now stops by the signal one of them got (the CLI's exit status and
    line follow stop_reason)."""
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    got = run_on_gloo_ranks(functools.partial(_sigterm_to_rank1, root=str(tmp_path)), 2, tmp_path)
    assert got == [("stopped", 2, "signal SIGTERM")] * 2, got


def _sigterm_to_node1_through_the_cli(rank: int, root: str) -> tuple:
    """Two nodes of one process each (LOCAL_RANK 0 on both): node 1 gets a SIGTERM before step 2."""
    import contextlib
    import io

    import cookmind.parallel

    os.environ["LOCAL_RANK"] = "0"
    cookmind.parallel.destroy_distributed = lambda: None  # the harness tears the group down
    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=6", f"logging.run_dir={root}/run"])
    trainer = Trainer(cfg)
    _sigterm_rank1_before_step2(trainer, rank)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), trainer.handling_signals():
        status = train_cli._fit_and_report(trainer, cfg)
    return status, [line for line in err.getvalue().splitlines() if "stopped by" in line]


def test_every_node_says_its_run_stopped_and_how_to_resume(tmp_path, keep_threads):
    # a SIGTERM to one node of two: node 0's log (rank 1) held only torchrun's "exitcode: 143", no cookmind line
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    got = run_on_gloo_ranks(functools.partial(_sigterm_to_node1_through_the_cli, root=str(tmp_path)), 2, tmp_path)
    line = (
        f"cookmind train: stopped by signal SIGTERM at step 2; checkpoint saved, continue with --resume auto "
        f"--run-dir {tmp_path}/run"
    )
    assert got == [(128 + 15, [line])] * 2, got


def _resume_past_a_damaged_checkpoint(rank: int, root: str) -> list[str]:
    import warnings

    from cookmind.model.model_io import CheckpointWarning

    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=3", f"logging.run_dir={root}/run"])
    cfg.checkpoint.resume = "auto"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(cfg)
    assert trainer.step == 1, "resumed from the older, whole checkpoint"
    return sorted({str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)})


def test_a_skipped_checkpoint_is_said_by_rank_0_not_by_every_rank(tmp_path, keep_threads):
    # every rank looks for the newest whole checkpoint, and each printed the same "skipping checkpoint" line
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    run = [*_tiny_run(str(tmp_path)), f"logging.run_dir={tmp_path}/run", "checkpoint.every=1"]
    Trainer(TrainConfig.load(None, run)).fit()
    weights = tmp_path / "run" / "checkpoints" / "step_00000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    said = run_on_gloo_ranks(functools.partial(_resume_past_a_damaged_checkpoint, root=str(tmp_path)), 2, tmp_path)
    assert len(said[0]) == 1 and said[0][0].startswith(f"skipping checkpoint {weights.parent}: "), said
    assert said[1] == [], said


def _rank0_fails_at(rank: int, root: str, where: str) -> None:
    """Rank 0 alone evaluates (without FSDP) and writes the report: either fails there with an OSError."""
    from cookmind.train import report
    from cookmind.train import trainer as trainer_module

    def fail(*args, **kwargs):
        raise OSError(f"{where} failed on rank 0")

    if rank == 0 and where == "evaluation":
        trainer_module.Trainer._val_loss = fail
    if rank == 0 and where == "report":
        report.write_report = fail
    overrides = ["eval.every=1", "logging.report=true"]
    cfg = TrainConfig.load(None, [*_tiny_run(root), f"logging.run_dir={root}/run", *overrides])
    _run_and_say(rank, root, lambda: Trainer(cfg).fit())


def test_an_evaluation_or_report_rank0_cannot_make_stops_every_rank_with_its_reason(tmp_path, keep_threads):
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    for where, what in (("evaluation", "evaluate at step 1"), ("report", "write the report")):
        said = _said_on_ranks(tmp_path, _rank0_fails_at, where=where)
        assert said[0] == f"OSError: {where} failed on rank 0", said
        assert said[1].startswith("RankFailed: rank 0 (on "), said
        assert said[1].endswith(f" could not {what}: {where} failed on rank 0"), said
        for r in (0, 1):
            (tmp_path / f"said{r}").unlink()
        shutil.rmtree(tmp_path / "run")


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _two_nodes_stderr(args: list[list[str]], cwds: list) -> tuple[list[str], list[int]]:
    """Launch node 0 and node 1 (each ``node_cmd`` with its own arguments, in its own folder) and return their stderr
    and exit statuses; node 0 first, so that its launcher holds the rendezvous store, as the endpoint's node."""
    import time

    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    port = find_free_port()
    procs = []
    try:
        for node in (0, 1):
            popen = subprocess.Popen(
                node_cmd(node, port, *args[node]), cwd=cwds[node], env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            procs.append(popen)
            deadline = time.monotonic() + 60
            while node == 0 and not _listening(port) and time.monotonic() < deadline:
                time.sleep(0.1)
        errs = [p.communicate(timeout=90)[1] for p in procs]
        return errs, [p.returncode for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_a_node_that_fails_before_joining_the_group_stops_the_others(tmp_path):
    """Node 1 cannot even read its config (the file is on node 0 only): it stopped before joining the process
    group, and node 0 waited in the rendezvous for a rank that would never come, up to the group's 30-minute
    timeout. Node 0 now stops at once with node 1's reason."""

    common = data_parallel_overrides(tmp_path, max_steps=2)
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
    (tmp_path / "node0" / "cfg.yaml").write_text("{}\n")
    args = ["--config", "cfg.yaml", "--run-dir", str(tmp_path / "run"), "train.micro_batch_size=2", *common]
    errs, _ = _two_nodes_stderr([args, args], [tmp_path / "node0", tmp_path / "node1"])
    said = [[line for line in err.splitlines() if line.startswith("cookmind train: error:")] for err in errs]
    assert said[1] == [f"cookmind train: error: config file 'cfg.yaml' not found: {said[1][0].split(': ', 3)[3]}"]
    assert len(said[0]) == 1 and said[0][0].startswith("cookmind train: error: rank 1 (on "), errs[0][-3000:]
    assert said[0][0].endswith(" could not start: " + said[1][0].removeprefix("cookmind train: error: ")), said


def test_a_node_launched_with_a_bad_flag_stops_the_others(tmp_path):
    """Node 1 launched with a flag `cookmind train` does not know: its usage error ended it before it joined the
    process group, without telling the others, and node 0 waited in the rendezvous for it up to the group's
    30-minute timeout, as for a config file missing on a node. Node 0 now stops at once with node 1's reason."""

    common = data_parallel_overrides(tmp_path, max_steps=2)
    args = ["--run-dir", str(tmp_path / "run"), "train.micro_batch_size=2", *common]
    errs, codes = _two_nodes_stderr([args, [*args, "--bogus-flag"]], [tmp_path, tmp_path])
    said = [[line for line in err.splitlines() if line.startswith("cookmind train: error:")] for err in errs]
    assert said[1] == ["cookmind train: error: unrecognized arguments: --bogus-flag"], errs[1][-3000:]
    assert said[0] == [f"cookmind train: error: rank 1 (on {socket.gethostname()}) could not start: unrecognized "
                       "arguments: --bogus-flag"], errs[0][-3000:]  # fmt: skip
    assert all(code != 0 for code in codes)


@pytest.mark.parametrize(
    "bad, said",
    [
        ("train.bogus_key=1", "override 'train.bogus_key=1': unknown key in section 'train' 'bogus_key'; valid: "),
        (
            "data.train_path={root}/gone",
            "--train-data (data.train_path): {root}/gone: no such store; "
            "make one with `cookmind pack --out {root}/gone`",
        ),
        ("--bogus-flag", "unrecognized arguments: --bogus-flag"),
    ],
    ids=["config key", "data file", "flag"],
)
def test_a_start_up_error_every_rank_meets_is_said_once_not_once_a_rank(tmp_path, bad, said):
    """`torchrun --nproc-per-node 2 -m cookmind train` with a bad config key (before the process group), a missing
    data file (in it) or a bad flag (argparse's usage error): every rank printed the error, the same line once per
    rank. One of the node's ranks says it now, and every rank still stops, none with status 0."""
    root = str(tmp_path)
    port = find_free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)]
    cmd += ["-m", "cookmind", "train", *_tiny_run(root), f"logging.run_dir={root}/run", bad.format(root=root)]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("cookmind train: error: ")]
    assert len(errors) == 1 and errors[0].startswith("cookmind train: error: " + said.format(root=root)), done.stderr
    assert done.stderr.count("usage: cookmind train") == (bad == "--bogus-flag"), done.stderr
    # torchrun's summary: each rank's exit status (a rank still waiting as another exits is ended by SIGTERM)
    statuses = [int(s) for s in re.findall(r"^\s+exitcode\s+: (-?\d+)", done.stderr, re.MULTILINE)]
    assert done.returncode != 0 and len(statuses) == 2 and 2 in statuses and 0 not in statuses, done.stderr[-3000:]


SFT_LENGTHS = (16, 4, 12, 6, 5, 10, 7, 9)  # the records' lengths, in the store's order


def _sft_tokens_on_rank(rank: int, root: str, counts: tuple[int, ...] | None = None) -> int:
    """Two steps of SFT over the store in its order (data.shuffle=false), 2 records per rank per step; with
    ``counts``, the objective says each of rank r's micro-batches held ``counts[r]`` tokens."""
    cfg = TrainConfig.load(
        None,
        [
            f"data.train_path={root}/sft",
            "train.objective=sft",
            "data.window_size=16",
            "data.shuffle=false",
            "train.micro_batch_size=2",
            "train.max_steps=2",
            "train.device=cpu",
            "logging.progress=false",
            "logging.report=false",
            "logging.log_every=1",
            f"logging.run_dir={root}/run",
            *tiny_cli_overrides(),
        ],
    )
    trainer = Trainer(cfg)
    if counts is not None:
        trainer.objective.num_tokens = lambda batch: counts[rank]
    summary = trainer.fit()
    trainer.close()
    return summary["tokens"]


def test_the_tokens_of_a_two_rank_sft_run_are_what_both_ranks_processed(tmp_path, keep_threads):
    """Each rank pads its SFT batch to its own longest record: the ranks process different counts. The logged
    tokens were rank 0's count x 2 (64 + 28 where the ranks processed 44 + 34), and with them tokens_per_s, mfu
    and the checkpoint's tokens_seen."""
    rng = np.random.default_rng(0)
    records = [
        {"sequence": rng.integers(1, 64, size=n), "loss_mask": np.array([0, 0] + [1] * (n - 2))} for n in SFT_LENGTHS
    ]
    write_store(tmp_path / "sft", "sft", records, vocab_size=64)
    # the reference, from the data: step s gives records 4s..4s+3 round-robin to the ranks (rank r: 4s+r, 4s+r+2),
    # and each rank's batch of 2 is padded to its longer record
    steps = [sum(2 * max(SFT_LENGTHS[4 * s + r], SFT_LENGTHS[4 * s + r + 2]) for r in (0, 1)) for s in (0, 1)]
    assert steps == [44, 34]
    summaries = run_on_gloo_ranks(functools.partial(_sft_tokens_on_rank, root=str(tmp_path)), 2, tmp_path)
    assert summaries == [78, 78], summaries
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("split") == "train"]
    assert [r["tokens"] for r in train] == [44, 78], train
    for row, n in zip(train, steps):
        assert row["tokens_per_s"] * row["step_time_s"] == pytest.approx(n, rel=1e-4)
    meta = json.loads((find_latest_checkpoint(tmp_path / "run" / "checkpoints") / "meta.json").read_text())
    assert meta["tokens_seen"] == 78


BIG_COUNTS = ((1 << 33) + 7, (1 << 33) + 12_352)  # each rank's tokens of a micro-batch, past float32's 2**24


def test_token_counts_past_float32s_exact_range_sum_exactly_over_ranks(tmp_path, keep_threads):
    # float32 holds integers exactly only below 2**24 (a step of 8 ranks x 4M tokens): the counts must sum exactly
    rng = np.random.default_rng(0)
    records = [
        {"sequence": rng.integers(1, 64, size=n), "loss_mask": np.array([0, 0] + [1] * (n - 2))} for n in SFT_LENGTHS
    ]
    write_store(tmp_path / "sft", "sft", records, vocab_size=64)
    step = sum(BIG_COUNTS)
    assert float(torch.tensor(float(step), dtype=torch.float32)) != step  # what a float32 sum would have lost
    summaries = run_on_gloo_ranks(
        functools.partial(_sft_tokens_on_rank, root=str(tmp_path), counts=BIG_COUNTS), 2, tmp_path
    )
    assert summaries == [2 * step, 2 * step], summaries
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows if r.get("split") == "train"] == [step, 2 * step]


def _metrics_write_fails_on_rank0(rank: int, root: str) -> None:
    """Rank 0's disk fills as it logs step 2's row of metrics.jsonl."""
    import errno

    from cookmind.train.metrics import MetricsWriter

    real = MetricsWriter.write

    def write(self, record):
        if record.get("step") == 2 and record.get("split") == "train":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        real(self, record)

    if rank == 0:
        MetricsWriter.write = write
    run = [*_tiny_run(root), "train.max_steps=4", "logging.log_every=1", "checkpoint.every=2"]
    _run_and_say(rank, root, lambda: Trainer(TrainConfig.load(None, [*run, f"logging.run_dir={root}/run"])).fit())


def test_a_metrics_row_rank0_cannot_write_stops_every_rank_with_its_reason(tmp_path, keep_threads):
    # rank 0 alone writes metrics.jsonl: it stopped with its error, and rank 1 died in the next step's all-reduce
    # with gloo's "Connection closed by peer" traceback (under NCCL it waited there until the timeout)
    import time

    from cookmind.cli import os_error_line

    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    t0 = time.monotonic()
    said = _said_on_ranks(tmp_path, _metrics_write_fails_on_rank0)
    assert time.monotonic() - t0 < 60, "every rank stops at once, not at a collective's timeout"
    path = tmp_path / "run" / "metrics.jsonl"
    assert said[0] == f"OSError: [Errno 28] No space left on device: '{path}'", said
    reason = os_error_line(OSError(28, os.strerror(28), str(path)))
    assert said[1].startswith("RankFailed: rank 0 (on "), said
    assert said[1].endswith(f" could not end step 2 (MetricsCallback.on_step_end): {reason}"), said
    # step 2's checkpoint (due at that step's end) is not saved without its metrics row: a resume from it would go on
    # from a metrics.jsonl that lacks the row, and the run only stopped after it
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*")), "saved while a rank held a failure"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("split") == "train"] == [1], "no step after the failed one ran"


class Boom(Callback):
    """Raises in ``hook`` on rank 1 alone (at step ``at`` for the per-step hooks, the status for on_train_end). It
    runs no collective, and says so: its error is held to the step's end and reaches every rank."""

    runs_no_collective = True

    def __init__(self, hook: str, at):
        self.hook, self.at = hook, at

    def _fail(self, trainer, hook: str, at=None) -> None:
        if hook == self.hook and at == self.at and trainer.dist.rank == 1:
            raise ValueError(f"{hook} failed on rank 1")

    def on_train_begin(self, trainer):
        self._fail(trainer, "on_train_begin")

    def on_step_begin(self, trainer, step):
        self._fail(trainer, "on_step_begin", step)

    def on_step_end(self, trainer, step, metrics):
        self._fail(trainer, "on_step_end", step)

    def on_train_end(self, trainer, status):
        self._fail(trainer, "on_train_end", status)


def _callback_fails_on_rank1(rank: int, root: str, hook: str, at, max_steps: int) -> None:
    cfg = TrainConfig.load(None, [*_tiny_run(root), f"train.max_steps={max_steps}", f"logging.run_dir={root}/run"])
    _run_and_say(rank, root, lambda: Trainer(cfg, callbacks=[Boom(hook, at)]).fit())


@pytest.mark.parametrize(
    "hook, at, max_steps, what",
    [
        ("on_step_begin", 2, 4, "begin step 2 (Boom.on_step_begin)"),
        ("on_step_end", 2, 2, "end step 2 (Boom.on_step_end)"),  # the last step: no step's stop signal follows
        ("on_train_begin", None, 2, "begin training (Boom.on_train_begin)"),
        ("on_train_end", "completed", 2, "end training (Boom.on_train_end)"),
    ],
)
def test_a_callback_that_fails_on_one_rank_stops_every_rank_with_its_reason(
    tmp_path, keep_threads, hook, at, max_steps, what
):
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _callback_fails_on_rank1, hook=hook, at=at, max_steps=max_steps)
    assert said[1] == f"ValueError: {hook} failed on rank 1", said
    assert said[0].startswith("RankFailed: rank 1 (on "), said
    assert said[0].endswith(f" could not {what}: {hook} failed on rank 1"), said


class _LogsOnly(Boom):
    """A log-only callback (it needs no state, so steps are read deferred) whose ``needs_state_at`` raises on rank 1
    at step ``at`` when ``hook`` is "needs_state_at"."""

    def needs_state_at(self, trainer, step):
        self._fail(trainer, "needs_state_at", step)
        return False


def _needs_state_fails_on_rank1(rank: int, root: str) -> None:
    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=4", "eval.every=0", f"logging.run_dir={root}/run"])

    def run():
        trainer = Trainer(cfg, callbacks=[_LogsOnly("needs_state_at", 2)])
        for g in trainer.optimizer.param_groups:  # the device-side skip, as on CUDA: steps are read deferred
            g["fused"] = True
        trainer._skip_on_device = True
        trainer.fit()

    _run_and_say(rank, root, run)


def test_a_callbacks_needs_state_at_that_fails_on_one_rank_stops_every_rank_with_its_reason(tmp_path, keep_threads):
    # asked whether step 2 may be read after step 3 is queued, rank 1's callback raised: rank 1 stopped with its
    # error, and rank 0, which queued step 3, died in its all-reduce with gloo's "Connection closed by peer"
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _needs_state_fails_on_rank1)
    assert said[1] == "ValueError: needs_state_at failed on rank 1", said
    assert said[0].startswith("RankFailed: rank 1 (on "), said
    assert said[0].endswith(" could not end step 2 (_LogsOnly.needs_state_at): needs_state_at failed on rank 1"), said


def _batch_fails_on_rank1(rank: int, root: str, step: int, micro: int = 0, accum: int = 1) -> None:
    """Rank 1's read of the store fails (an I/O error on its node) as it loads micro-batch ``micro`` of step
    ``step`` (of ``accum``)."""
    import errno

    from cookmind.train import trainer as trainer_module

    real = trainer_module.Trainer._next_batch

    def next_batch(self):
        if self._micros_taken == (step - 1) * accum + micro:
            raise OSError(errno.EIO, os.strerror(errno.EIO), f"{root}/seq")
        return real(self)

    if rank == 1:
        trainer_module.Trainer._next_batch = next_batch
    accumulate = [f"train.grad_accum_steps={accum}", f"train.micro_batch_size={8 // accum}"]  # the same global batch
    run = [*_tiny_run(root), "train.max_steps=4", *accumulate, f"logging.run_dir={root}/run"]
    _run_and_say(rank, root, lambda: Trainer(TrainConfig.load(None, run)).fit())


@pytest.mark.parametrize("step", [1, 3])
def test_a_batch_one_rank_cannot_load_stops_every_rank_with_its_reason(tmp_path, keep_threads, step):
    # the next step's first batch loads while the step's work ends (the first step's, before it): a rank that failed
    # there left the others in the step's collectives
    from cookmind.cli import os_error_line

    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _batch_fails_on_rank1, step=step)
    assert said[1] == f"OSError: [Errno 5] Input/output error: '{tmp_path}/seq'", said
    reason = os_error_line(OSError(5, os.strerror(5), f"{tmp_path}/seq"))
    assert said[0].startswith("RankFailed: rank 1 (on "), said
    assert said[0].endswith(f" could not load a batch of step {step}: {reason}"), said


@pytest.mark.parametrize("step", [1, 3])
def test_a_later_micro_batch_one_rank_cannot_load_stops_every_rank_with_its_reason(tmp_path, keep_threads, step):
    # with train.grad_accum_steps=2 the step's second micro-batch was loaded between the first one's backward and
    # the second's (DDP's gradient all-reduce): the rank that failed there left the other in that collective, which
    # died with gloo's "Connection closed by peer" traceback
    from cookmind.cli import os_error_line

    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _batch_fails_on_rank1, step=step, micro=1, accum=2)
    assert said[1] == f"OSError: [Errno 5] Input/output error: '{tmp_path}/seq'", said
    reason = os_error_line(OSError(5, os.strerror(5), f"{tmp_path}/seq"))
    assert said[0].startswith("RankFailed: rank 1 (on "), said
    assert said[0].endswith(f" could not load a batch of step {step}: {reason}"), said


class _Unreadable:
    """A validation loader whose read of batch ``at`` fails (an I/O error on this node)."""

    def __init__(self, loader, at: int, path: str):
        self.loader, self.at, self.path = loader, at, path

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        import errno

        for i, batch in enumerate(self.loader):
            if i == self.at:
                raise OSError(errno.EIO, os.strerror(errno.EIO), self.path)
            yield batch


def _val_batch_fails_on(rank: int, root: str, failing: int, fsdp: bool) -> None:
    """Rank ``failing`` cannot read its second validation batch at step 2's evaluation (of 4 batches: without FSDP
    rank 0 reads them all, with FSDP each rank every other one, rank 1 batches 1 and 3)."""
    import threading

    run = [*_tiny_run(root), "data.val_path=val", "eval.every=2", "train.max_steps=4", f"parallel.fsdp={fsdp}"]
    os.chdir(root)

    def hung():  # a rank left in a collective whose peer went on to another waits for gloo's 30-minute timeout
        Path(f"{root}/said{rank}").write_text("(waited in a collective)")
        os._exit(0)

    threading.Timer(60, hung).start()

    def go():
        trainer = Trainer(TrainConfig.load(None, [*run, f"logging.run_dir={root}/run"]))
        if rank == failing:
            trainer.val_loader.loader = _Unreadable(trainer.val_loader.loader, 1 + failing * 2, f"{root}/val")
        trainer.fit()

    _run_and_say(rank, root, go)


@pytest.mark.parametrize("fsdp, failing, what", [(True, 1, "load a validation batch"), (False, 0, "evaluate")])
def test_a_validation_batch_one_rank_cannot_read_stops_every_rank_with_its_reason(
    tmp_path, keep_threads, fsdp, failing, what
):
    # with FSDP every rank reads its share of the validation batches, and their forwards are collectives: rank 1
    # stopped with its error, and rank 0 waited in the gather of its next forward until gloo saw rank 1 gone (under
    # NCCL until the timeout). Without FSDP rank 0 alone evaluates.
    from cookmind.cli import os_error_line

    rng = np.random.default_rng(0)
    for name in ("seq", "val"):
        rows = [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)]
        write_store(tmp_path / name, "seq", rows, vocab_size=64)
    said = _said_on_ranks(tmp_path, _val_batch_fails_on, failing=failing, fsdp=fsdp)
    assert said[failing] == f"OSError: [Errno 5] Input/output error: '{tmp_path}/val'", said
    reason = os_error_line(OSError(5, os.strerror(5), f"{tmp_path}/val"))
    assert said[1 - failing].startswith(f"RankFailed: rank {failing} (on "), said
    assert said[1 - failing].endswith(f" could not {what} at step 2: {reason}"), said


def _sharded_save_fails_on_rank0(rank: int, root: str, file: str) -> None:
    """Rank 0's disk fills as it writes ``file`` of the final sharded checkpoint (every rank writes its shard)."""
    from cookmind.atomic import DiskFullError
    from cookmind.train import sharded_checkpoint

    real = sharded_checkpoint.write_json

    def write_json(path, *args, **kwargs):
        if Path(path).name == file:
            raise DiskFullError(f"{root}/run/checkpoints: the disk is full; free space and resume")
        return real(path, *args, **kwargs)

    if rank == 0:
        sharded_checkpoint.write_json = write_json
    run = [*_tiny_run(root), "checkpoint.format=sharded", "eval.every=0", f"logging.run_dir={root}/run"]
    _run_and_say(rank, root, lambda: Trainer(TrainConfig.load(None, run)).fit())


@pytest.mark.parametrize("file", ["config.json", "meta.json"])
def test_a_sharded_checkpoint_rank0_cannot_complete_stops_every_rank_with_its_reason(tmp_path, keep_threads, file):
    # every rank writes its shard, rank 0 alone the model's config.json (before the shards) and meta.json (after
    # them): it stopped with its error, and rank 1 waited in the shards' collectives or died in the next one
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _sharded_save_fails_on_rank0, file=file)
    full = f"{tmp_path}/run/checkpoints: the disk is full; free space and resume"
    assert said[0] == f"DiskFullError: {full}", said
    assert said[1].startswith("RankFailed: rank 0 (on "), said
    assert said[1].endswith(f" could not save step_00000002: {full}"), said


def _grpo_reward_fails_on_rank1(rank: int, root: str) -> None:
    """GRPO on two ranks, each rolling out and scoring its own problems: rank 1's reward function (the user's code)
    raises on one of step 2's answers."""
    from lm_fixtures import MICRO, tiny_config
    from test_align_fixtures import XYZ, x_fraction

    from cookmind.align.objective import GRPOConfig, GRPOObjective
    from cookmind.model import CookMindLM

    torch.manual_seed(0)
    model = CookMindLM(tiny_config(**MICRO, vocab_size=5, max_position_embeddings=32))
    trainers = []

    def reward(response, truth):
        if rank == 1 and trainers[0].step == 1:
            raise ValueError(f"the reward cannot score {response!r}")
        return x_fraction(response, truth)

    objective = GRPOObjective(
        GRPOConfig(group_size=2, max_new_tokens=2, template="{question}", stop_strings=()),
        reward_fn=reward,
        problems=[{"question": "?" * k, "answer": ""} for k in range(1, 9)],
    )
    cfg = TrainConfig.from_dict(
        {
            "train": {"objective": "grpo", "max_steps": 3, "micro_batch_size": 1, "device": "cpu", "seed": 0},
            "optim": {"lr": 1e-2, "schedule": "constant"},
            "parallel": {"backend": "gloo"},
            "logging": {"run_dir": f"{root}/run", "progress": False, "report": False},
        }
    )
    trainers.append(Trainer(cfg, model=model, objective=objective, tokenizer=XYZ()))
    _run_and_say(rank, root, trainers[0].fit)


def test_a_grpo_reward_that_fails_on_one_rank_stops_every_rank_with_its_reason(tmp_path, keep_threads):
    # each rank scores its own rollouts: rank 1 stopped with the reward's error, and rank 0 died in the step's
    # gradient all-reduce with gloo's "Connection closed by peer" traceback
    said = _said_on_ranks(tmp_path, _grpo_reward_fails_on_rank1)
    assert said[1].startswith("ValueError: the reward cannot score "), said
    assert said[0].startswith("RankFailed: rank 1 (on "), said
    assert said[0].endswith(" could not roll out step 2: " + said[1].removeprefix("ValueError: ")), said


def _rewind_fails_on_rank0(rank: int, root: str) -> None:
    """A resume: rank 0 cannot rewrite metrics.jsonl without the rows logged after the checkpoint's step."""
    import errno

    from cookmind.train.metrics import MetricsWriter

    def rewind(self, step):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self.path))

    if rank == 0:
        MetricsWriter.rewind = rewind
    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=3", f"logging.run_dir={root}/run"])
    cfg.checkpoint.resume = "auto"
    _run_and_say(rank, root, lambda: Trainer(cfg))


@pytest.mark.parametrize("saved", [True, False])
def test_a_metrics_file_rank0_cannot_rewind_on_resume_stops_every_rank_with_its_reason(tmp_path, keep_threads, saved):
    # rank 0 alone rewinds metrics.jsonl to the checkpoint's step (or drops all of it where an attempt saved none):
    # it stopped with its error, and rank 1 died in start-up's next collective
    from cookmind.cli import os_error_line

    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    if saved:
        Trainer(TrainConfig.load(None, [*_tiny_run(str(tmp_path)), f"logging.run_dir={tmp_path}/run"])).fit()
    said = _said_on_ranks(tmp_path, _rewind_fails_on_rank0)
    path = tmp_path / "run" / "metrics.jsonl"
    assert said[0] == f"PermissionError: [Errno 13] Permission denied: '{path}'", said
    assert said[1].startswith("RankFailed: rank 0 (on "), said
    what = f"resume from {tmp_path / 'run' / 'checkpoints' / 'step_00000002'}" if saved else "start"
    reason = os_error_line(PermissionError(13, os.strerror(13), str(path)))
    assert said[1].endswith(f" could not {what}: {reason}"), said


class _Vanishes(Callback):
    """Rank 0's process ends at step 2's end, as one killed (out of host memory) would. It exits 0: on a failing
    exit code the test's launcher (torch.multiprocessing) would stop rank 1 at once, before rank 1 could say what
    stopped it; rank 1 sees its peer gone either way."""

    def on_step_end(self, trainer, step, metrics):
        if step == 2 and trainer.dist.rank == 0:
            os._exit(0)


class _ReducesButFailsOnRank1(Callback):
    """A callback of the user's that all-reduces something at step 1's end (two float64s: 16 bytes, as the step's
    stop signal) and fails on rank 1 before it gets there."""

    def on_step_end(self, trainer, step, metrics):
        if step == 1:
            if trainer.dist.rank == 1:
                raise ValueError("the callback failed on rank 1")
            torch.distributed.all_reduce(torch.ones(2, dtype=torch.float64))


def _a_collective_callback_fails_on_rank1(rank: int, root: str) -> None:
    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=3", f"logging.run_dir={root}/run"])
    _run_and_say(rank, root, lambda: Trainer(cfg, callbacks=[_ReducesButFailsOnRank1()]).fit())


def test_a_callback_that_runs_collectives_and_fails_on_one_rank_is_not_held_into_another_collective(
    tmp_path, keep_threads
):
    # rank 1's error was held and it went on to the step's stop all-reduce, which paired with rank 0's all-reduce in
    # the callback: rank 1 read rank 0's float bits as a stop code ("4607182418800017408 is not a valid Signals").
    # A callback that does not say it runs no collective raises at once, as any code does
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _a_collective_callback_fails_on_rank1)
    assert said[1] == "ValueError: the callback failed on rank 1", said
    assert "Signals" not in said[0], said


def _rank0_vanishes_as_rank1_fails(rank: int, root: str) -> None:
    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=4", f"logging.run_dir={root}/run"])
    _run_and_say(rank, root, lambda: Trainer(cfg, callbacks=[_Vanishes(), Boom("on_step_end", 2)]).fit())


def test_a_rank_that_failed_says_its_own_error_when_another_rank_is_gone(tmp_path, keep_threads):
    # rank 1's callback failed and rank 0 died at the same step: rank 1 said gloo's "Connection closed by peer"
    # from the step's stop signal, not its own error
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _rank0_vanishes_as_rank1_fails)
    assert said == ["(nothing)", "ValueError: on_step_end failed on rank 1"], said


def _rank0_vanishes_under_the_cli(rank: int, root: str) -> None:
    """Rank 0's process ends at step 2's end (a node killed mid-run); rank 1 runs the CLI's ``_fit_and_report``,
    which says how the run ended: its stderr and exit status go to ``root/said1``."""
    import io

    from cookmind.train.cli import _fit_and_report

    cfg = TrainConfig.load(None, [*_tiny_run(root), "train.max_steps=6", f"logging.run_dir={root}/run"])
    err = io.StringIO()
    said = "ran without an error"
    try:
        with contextlib.redirect_stderr(err):
            code = _fit_and_report(Trainer(cfg, callbacks=[_Vanishes()]), cfg)
        said = f"{code}\n{err.getvalue()}"
    except Exception as exc:  # noqa: BLE001 - the test reads what the rank raised
        said = f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    Path(f"{root}/said{rank}").write_text(said)
    os._exit(0)


def test_a_rank_whose_peer_dies_mid_run_says_so_in_one_line(tmp_path, keep_threads):
    # a node killed mid-run (SIGKILL, out of host memory): the surviving ranks died in gloo's "Connection closed by
    # peer" traceback, through the autograd engine; each now says in one line what happened, at which step, and how
    # to continue, exiting 2
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(8)], vocab_size=64)
    said = _said_on_ranks(tmp_path, _rank0_vanishes_under_the_cli)
    assert said[0] == "(nothing)", said
    code, _, err = said[1].partition("\n")
    assert code == "2", said[1]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("cookmind train: error: rank 1 (on "), lines[0]
    assert " lost another rank at step 3 (gloo: " in lines[0] and " by peer" in lines[0], lines[0]  # closed or reset
    assert lines[0].endswith(f"continue with --resume auto --run-dir {tmp_path}/run once every node is back"), lines[0]


@pytest.mark.parametrize(
    "exc, want",
    [
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4493"
            ),
            "gloo: Connection closed by peer [10.0.0.2]:4493",
        ),
        (
            RuntimeError(
                "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [::1]:1: Connection reset "
                "by peer"
            ),
            "gloo: Read error [::1]:1: Connection reset by peer",
        ),
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for "
                "recv operation to complete"
            ),
            "gloo: Timed out waiting 1800000ms for recv operation to complete",
        ),
        (torch.distributed.DistStoreError("Socket Timeout"), "DistStoreError: Socket Timeout"),
        # not a peer gone: a desync's assertion, a CUDA error under NCCL, a port in use at start-up, any other error
        (
            RuntimeError(
                "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4"
            ),
            None,
        ),
        (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error"), None),
        (
            torch.distributed.DistNetworkError(
                "The server socket has failed to listen on any local network address. "
                "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE"
            ),
            None,
        ),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), None),
    ],
)
def test_only_a_collectives_error_for_a_peer_gone_reads_as_a_lost_rank(exc, want):
    """``lost_peer_reason`` turns a peer's loss into one line ("lost another rank ... continue with --resume"); any
    other distributed error must keep its own traceback, not be told to the user as a node that went away."""
    from cookmind.parallel.process_group import lost_peer_reason

    assert lost_peer_reason(exc) == want
