"""One training run per run directory at a time: rank 0 holds an OS lock on ``RUN_DIR/.lock`` while it trains.

Two runs writing one directory interleave their metrics and checkpoints (a ``--resume auto`` started while the first
still runs, or a torchrun job relaunched while the workers of a killed launcher train on). The lock is ``flock`` on
an open file: the OS drops it when its process ends, however it ends, so a killed run never leaves a stale lock.
Within one process the directory's lock is taken once and kept until ``release_run_dir`` (Trainer.close).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from cookmind.run_layout import RUN_LOCK as LOCK_NAME

_HELD: dict[Path, object] = {}  # run directory -> the open lock file, in this process


def lock_run_dir(run_dir: str | os.PathLike) -> None:
    """Take ``run_dir``'s lock, or raise FileExistsError naming the process that holds it. A folder that does not
    exist yet is left alone (a run that cannot start leaves no run directory): the Trainer locks again once it
    has made it."""
    import fcntl

    run_dir = Path(run_dir).resolve()
    if run_dir in _HELD or not run_dir.is_dir():
        return
    f = open(run_dir / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the run: the lock lives as long as the file
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise FileExistsError(
            f"run directory {run_dir} is in use by a cookmind train still running ({holder}): two runs in one "
            "directory would interleave their checkpoints and metrics; wait for it to end (or stop it), or choose "
            "another --run-dir"
        ) from None
    except OSError:  # a filesystem without locks (some NFS mounts): the run goes on unguarded, as before
        f.close()
        return
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    _HELD[run_dir] = f


def release_run_dir(run_dir: str | os.PathLike) -> None:
    """Let go of ``run_dir``'s lock if this process holds it."""
    f = _HELD.pop(Path(run_dir).resolve(), None)
    if f is not None:
        f.close()
