"""Worker processes, one way for every stage that uses them (tokenizer training and encoding, pack, curate).

- Workers start from a forkserver (spawn where there is none), not by forking the caller: a fork of a threaded
  caller (torch/OpenMP, a server, a thread pool) can leave a lock held in the child forever.
- Workers ignore Ctrl-C. It reaches the whole process group, and the parent is the one that stops (the CLI prints
  one line); each worker printed a KeyboardInterrupt traceback of its own around it.
- The forkserver starts with SIGINT blocked (a signal mask, which fork and exec keep), so neither it nor a worker
  it forks can be stopped half-way by a Ctrl-C before ``ignore_ctrl_c`` has run: a pack stopped in that moment
  printed import tracebacks, and a worker stopped there exited without a word. A mask, unlike an ignored
  disposition, is per thread: a pool started from a thread (tokenizer training starts its pool beside its own
  counting) is held back too. The caller's Ctrl-C is not lost: in a process of one thread it arrives once the
  server is up; where another thread (a progress bar's) takes the signal, it may stop the start half-way, which
  is what a Ctrl-C asks for (the server, holding it back, ends when its caller does).
- ``stop_pool`` ends a pool in bounded time: ``Pool.terminate`` waits forever for a worker that was stopped (by
  it, or by anything) half-way through sending a result, and a Ctrl-C to a pack or a tokenizer training hung
  silently in CI that way (sessions 22 and 28); curate's ``ProcessPoolExecutor`` exit could wait the same way.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
from collections.abc import Callable, Iterator

STOP_WAIT_S = 5.0  # how long stop_pool lets Pool.terminate run before it kills the workers itself


def pool_context():
    """The multiprocessing context worker pools start from (its forkserver started, with Ctrl-C held back)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()  # first: its start (inside the server's) unblocks SIGINT when it is done
    held = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the mask as it is (blocking nothing: it cannot raise)
    try:  # blocking runs the handlers of signals already pending, which may raise: the finally must restore it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        # a blocked signal stays blocked across fork and exec: the new server and every worker it forks hold
        # Ctrl-C back from their first instruction (a no-op once the server is up)
        forkserver.ensure_running()
    finally:  # a Ctrl-C this thread got meanwhile is delivered now
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return mp.get_context("forkserver")


def ignore_ctrl_c() -> None:
    """A pool worker's initializer (or its first call): SIGINT is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # ignored now: one held back is dropped, and what the worker starts
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # gets the usual mask


@contextlib.contextmanager
def worker_pool(processes: int, initializer: Callable = ignore_ctrl_c, initargs: tuple = ()) -> Iterator:
    """A ``multiprocessing.Pool`` from ``pool_context`` whose exit, an error's or a Ctrl-C's included, is
    ``stop_pool``'s (the Pool's own exit is ``Pool.terminate``, which can hang)."""
    pool = pool_context().Pool(processes, initializer=initializer, initargs=initargs)
    try:
        yield pool
    finally:
        stop_pool(pool)


def stop_pool(pool, wait: float = STOP_WAIT_S) -> None:
    """``pool.terminate()``, in at most about ``wait`` seconds. Terminate first stops the task handler and sends
    each worker its end, then waits for the thread reading results to finish a message; a worker killed (or stuck)
    half-way through writing a result leaves that message unfinished, and terminate waits for it forever while the
    caller never prints its line. Here terminate runs in a thread; past ``wait`` the workers are killed and the
    thread is left to end with the process (it holds no output). Nothing a stage writes depends on the pool's
    exit: every output is under a temporary name until the stage completes."""
    stopper = threading.Thread(target=pool.terminate, name="pool-stop", daemon=True)
    stopper.start()
    stopper.join(wait)
    if stopper.is_alive():
        for proc in list(getattr(pool, "_pool", ())):  # the workers (a private list, in every Python we support)
            if proc.exitcode is None:
                proc.kill()
        for proc in list(getattr(pool, "_pool", ())):
            proc.join(wait)
