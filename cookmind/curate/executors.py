"""Where shard tasks run: inline, a local process pool, or Ray tasks on a Ray cluster.

Each executor maps a module-level function over argument tuples and returns results in order,
with a progress bar (tasks done, rate, ETA; plain lines in a pipe or a log: ``cookmind.progress``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from cookmind.pools import worker_pool
from cookmind.progress import progress_bar

# while LocalExecutor runs tasks in this process with a bar: document bars may be shown (and are closed after each)
INLINE: dict = {"progress": False, "bars": []}


def document_bar(docs, desc: str = "documents"):
    """``docs`` counted on a second bar, under the shard bar, while a task runs inline with progress (one large
    input file is one shard: the shard bar sat at 0/1 for the whole stage); ``docs`` itself otherwise (a worker
    process's bar would write over the driver's)."""
    if not INLINE["progress"]:
        return docs
    bar = progress_bar(docs, desc=desc, unit=" docs", position=1, leave=False, mininterval=DOC_BAR_SECONDS)
    INLINE["bars"].append(bar)  # closed when the task ends, an error too: before the error's line is printed
    return bar


def documents_done_bar(desc: str = "documents"):
    """A bar for a task that reads its documents ahead of its work on them (a batch at a time), to ``update(n)`` as
    ``n`` documents are done: counted as read, a batch read in a moment left it at 0 while the stages worked through
    it. None where no bar is shown (as ``document_bar``)."""
    if not INLINE["progress"]:
        return None
    # miniters=1: every batch may be drawn (tqdm would wait for as many documents as the largest update held)
    bar = progress_bar(desc=desc, unit=" docs", position=1, leave=False, mininterval=DOC_BAR_SECONDS, miniters=1)
    INLINE["bars"].append(bar)
    return bar


DOC_BAR_SECONDS = 0.5  # the document bar's least time between redraws


class LocalExecutor:
    """``workers`` processes (1: run inline, no process start-up cost)."""

    def __init__(self, workers: int = 1, progress: bool = True):
        self.workers = max(1, int(workers))
        self.progress = progress

    def map(self, fn: Callable, args_list: Sequence[tuple], desc: str) -> list:
        results: list = [None] * len(args_list)
        # closed on an error too: the error's line is printed after the bar's, not over it
        # a bar on a terminal, plain lines in a pipe or a log (cookmind.progress)
        with progress_bar(
            total=len(args_list), desc=desc, unit="shard", enabled=self.progress and bool(args_list)
        ) as bar:
            if self.workers == 1 or len(args_list) <= 1:
                INLINE["progress"] = not bar.disable
                try:
                    for i, args in enumerate(args_list):
                        try:
                            results[i] = fn(*args)
                        finally:  # an error's line is printed after the document bar is gone, too
                            while INLINE["bars"]:
                                INLINE["bars"].pop().close()
                        bar.update(1)
                finally:
                    INLINE["progress"] = False
            else:
                # a failed shard or a Ctrl-C stops the pool at once (worker_pool's exit, bounded): a
                # ProcessPoolExecutor's exit ran every queued task first (the error or `interrupted` came hours later
                # on a big crawl), and once its workers were terminated, waited forever for a result one had half
                # sent. A shard a worker was writing is left under a temporary name (its rewrite removes it) and has
                # no done file, so the next run does it again.
                tasks = [(fn, i, args) for i, args in enumerate(args_list)]
                with worker_pool(min(self.workers, len(args_list))) as pool:
                    for i, result in pool.imap_unordered(_run_task, tasks):
                        results[i] = result
                        bar.update(1)
        return results


def _run_task(task: tuple) -> tuple:
    """A worker's call of one shard task: (its index, its result)."""
    fn, i, args = task
    return i, fn(*args)


class RayExecutor:
    """Each task is a Ray task with one CPU; connects to ``address`` or starts a local Ray."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, progress: bool = True):
        import ray

        self.ray = ray
        self.progress = progress
        if not ray.is_initialized():
            repo_root = str(Path(__file__).resolve().parents[2])
            env = {"env_vars": {"PYTHONPATH": repo_root + os.pathsep + os.environ.get("PYTHONPATH", "")}}
            ray.init(
                address=address,
                num_cpus=num_cpus,
                runtime_env=env,
                include_dashboard=False,
                log_to_driver=False,
                ignore_reinit_error=True,
            )

    def map(self, fn: Callable, args_list: Sequence[tuple], desc: str) -> list:
        remote = self.ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(*args) for args in args_list]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        with progress_bar(
            total=len(refs), desc=desc + " (ray)", unit="shard", enabled=self.progress and bool(refs)
        ) as bar:
            while pending:
                done, pending = self.ray.wait(pending, num_returns=1)
                for ref in done:
                    results[index[ref]] = self.ray.get(ref)
                    bar.update(1)
        return results


def make_executor(kind: str, workers: int = 1, ray_address: str | None = None, progress: bool = True):
    """ "local" or "ray"."""
    if kind == "local":
        return LocalExecutor(workers, progress)
    if kind == "ray":
        return RayExecutor(ray_address, None if ray_address else workers, progress)
    raise ValueError(f"unknown executor {kind!r}; use 'local' or 'ray'")
