"""Run a function on N gloo ranks in spawned processes and collect what each rank returns, and the shared
setting of the tests that compare several processes with one (no tests here).

The ranks start from a fork server that imported torch and cookmind once per test session: a rank is then a fork
of a fresh interpreter (no threads, no test's state) that starts in a fraction of a second, where a spawned one
imports torch and cookmind anew (~3 s each, both ranks at once on a 2-core CI runner).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def find_free_port() -> int:
    """A TCP port free on this host right now, for MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data_parallel_overrides(root: Path, max_steps: int) -> list[str]:
    """A store of 12 random 60-token sequences under ``root`` and the overrides of a tiny CPU run over it with
    gradient accumulation 2: what the tests that compare ranks (DDP, two nodes) with one process share."""
    import numpy as np
    from lm_fixtures import tiny_cli_overrides

    from cookmind.store import write_store

    rng = np.random.default_rng(0)
    write_store(
        Path(root) / "seq", "seq", [{"sequence": rng.integers(1, 64, size=60)} for _ in range(12)], vocab_size=64
    )
    return [
        f"data.train_path={Path(root) / 'seq'}",
        "data.window_size=16",
        f"train.max_steps={max_steps}",
        "train.seed=3",
        "train.device=cpu",
        "optim.lr=1e-2",
        "optim.warmup_steps=1",
        "train.grad_accum_steps=2",
        "logging.progress=false",
        "logging.report=false",
        "checkpoint.every=0",
        "eval.every=0",
        *tiny_cli_overrides(),
    ]


def torchrun_cmd(*args: str, nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` local processes on a free port, then ``args``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(find_free_port()),
        *args,
    ]


# What the fork server imports once; the ranks fork from it with these loaded.
PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.checkpoint", "cookmind.train", "gloo_fixtures"]


def _with_env(rank: int, fn, env: dict, *args) -> None:
    os.environ.clear()  # the fork server's environment is the one of when it started: take the caller's now
    os.environ.update(env)
    fn(rank, *args)


def spawn_ranks(fn, args: tuple, nprocs: int, env: dict | None = None) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)``, the processes forked from the session's fork server
    (see the module docstring) with ``env`` as their environment (default: the caller's of now)."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # takes effect when the server starts, at the first call
    env = dict(os.environ) if env is None else env
    mp.start_processes(_with_env, args=(fn, env, *args), nprocs=nprocs, join=True, start_method="forkserver")


def _main_runs(rank: int, main, world: int, runs: list, ports: list, cwd: str, out_dir: str) -> None:
    import contextlib
    import io

    os.chdir(cwd)
    printed = []
    for argv, port in zip(runs, ports):
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(list(argv))
        if code != 0:  # raised, the launch stops the other ranks too, as torchrun does when a rank fails
            raise RuntimeError(f"rank {rank}: {' '.join(argv)} exited with {code}; stdout: {out.getvalue()}")
        printed.append(out.getvalue())
    torch.save(printed, os.path.join(out_dir, f"main-rank{rank}.pt"))


def main_on_ranks(main, runs: list[list[str]], out_dir, env: dict, nproc: int = 2, cwd=None) -> list[list[str]]:
    """``main(argv)`` for each ``argv`` of ``runs`` in turn, as ``torchrun --nproc_per_node nproc`` runs a program
    whose entry point it is (``cookmind.cli.main`` for ``-m cookmind``, a bench script's ``main``): ``nproc``
    processes with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT per run)
    in environment ``env``, in ``cwd`` (default ``out_dir``). The processes are forked from the fork server once
    for all the runs, without torchrun's launcher: tests/test_multinode.py and test_bench_scaling.py launch
    through torchrun itself. A run that returns non-zero fails the launch. Returns what each rank printed, per run.
    """
    ports = []
    while len(ports) < len(runs):  # distinct: a run's store may still hold its port when the next one starts
        ports += {find_free_port()} - set(ports)
    spawn_ranks(_main_runs, (main, nproc, runs, ports, str(cwd or out_dir), str(out_dir)), nproc, env=env)
    return [torch.load(Path(out_dir) / f"main-rank{r}.pt") for r in range(nproc)]


def _rank_main(rank: int, fn, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank)
        gc.collect()  # drop the scenarios' DDP objects (and their finished work handles) first
        dist.barrier()  # neither rank tears the group down while the other still talks to it
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def run_on_gloo_ranks(fn, world: int, out_dir) -> list:
    """fn(rank) on `world` spawned processes joined in one gloo group; each rank's return value, in rank
    order. fn must be a module-level function (the children import it)."""
    spawn_ranks(_rank_main, (fn, world, find_free_port(), str(out_dir)), world)
    return [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(world)]
