"""Worker processes, one way for every stage that uses them (tokenizer training and encoding, pack, curate).

- Workers start from a forkserver (spawn where there is none), not by forking the caller: a fork of a threaded
  caller (torch/OpenMP, a server, a thread pool) can leave a lock held in the child forever.
- Workers ignore Ctrl-C. It reaches the whole process group, and the parent is the one that stops (the CLI prints
  one line); each worker printed a KeyboardInterrupt traceback of its own around it.
- The forkserver starts with SIGINT ignored (a disposition that exec and fork keep), so a Ctrl-C while it or a
  worker is still starting, before ``ignore_ctrl_c`` has run, cannot kill it half-way: a pack stopped in that
  moment printed import tracebacks (and one hung after a Ctrl-C in CI, session 22, likely the same race). The
  caller ignores Ctrl-C while the server starts (once a process, a fraction of a second): a Ctrl-C in that moment
  is lost, not half-handled.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading


def pool_context():
    """The multiprocessing context worker pools start from (its forkserver started, deaf to Ctrl-C)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():  # signal.signal works in the main thread only
        return mp.get_context("forkserver")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # an ignored signal stays ignored across exec: the new server and the workers it forks ignore Ctrl-C
        forkserver.ensure_running()  # from their first instruction (a no-op when the server is up already)
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)
    return mp.get_context("forkserver")


def ignore_ctrl_c() -> None:
    """A pool worker's initializer (or its first call): SIGINT is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
