"""Worker processes, one way for every stage that uses them (tokenizer training and encoding, pack, curate).

- Workers start from a forkserver (spawn where there is none), not by forking the caller: a fork of a threaded
  caller (torch/OpenMP, a server, a thread pool) can leave a lock held in the child forever.
- Workers ignore Ctrl-C. It reaches the whole process group, and the parent is the one that stops (the CLI prints
  one line); each worker printed a KeyboardInterrupt traceback of its own around it.
"""

from __future__ import annotations

import multiprocessing as mp
import signal


def pool_context():
    """The multiprocessing context worker pools start from."""
    return mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


def ignore_ctrl_c() -> None:
    """A pool worker's initializer (or its first call): SIGINT is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
