"""Where this process sits in the job: torchrun's process group (NCCL on GPUs, gloo on CPUs) or one process.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without them the run is one process and no group is made.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from cookmind.cli import rank_name
from cookmind.device import resolve_device


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """More than one process: gradients and stop flags are exchanged."""
        return self.world_size > 1


def init_distributed(device: str = "auto", backend: str = "auto", group_of_one: bool = False) -> DistInfo:
    """Join the job torchrun started (RANK / WORLD_SIZE / LOCAL_RANK); a single process needs no group.

    device: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` (see ``resolve_device``). backend: ``auto`` (nccl on
    CUDA, gloo elsewhere) | ``nccl`` | ``gloo``. The CUDA device is set before the group is made, and NCCL is
    bound to it, so each process drives one GPU. A group made already (by a test, a launcher) is joined as it is.
    group_of_one: a single process gets a group of one rank too (FSDP2 needs one), over an in-memory store.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local, what="train.device")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    global _JOINED
    if dist.is_initialized():
        _JOINED = True
        return DistInfo(dist.get_rank(), dist.get_world_size(), local, dev)
    if world == 1 and not group_of_one:
        return DistInfo(0, 1, local, dev)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    elif backend == "nccl" and dev.type != "cuda":  # torch: "doesn't have NCCL built in", or NCCL's own traceback
        raise ValueError(
            f"parallel.backend=nccl needs CUDA devices, but train.device is {dev.type} here; "
            "set parallel.backend=gloo (or auto)"
        )
    if backend == "nccl" and not dist.is_nccl_available():
        raise ValueError("parallel.backend=nccl: this torch was built without NCCL; set parallel.backend=gloo")
    bind = {"device_id": dev} if dev.type == "cuda" else {}  # NCCL binds this rank's GPU up front
    if world == 1:
        bind["store"] = dist.HashStore()  # no rendezvous: nobody else joins
    else:
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise ValueError(f"WORLD_SIZE={world} but {var} is unset; launch with torchrun --nproc_per_node N")
        _wait_for_every_rank(world)
    dist.init_process_group(
        backend=backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=30), **bind
    )
    _JOINED = True
    return DistInfo(rank, world, local, dev)


# Keys of torchrun's store for the ranks' own roll call before the group is made (a fresh store each attempt).
_ARRIVED, _FAILED = "cookmind/arrived", "cookmind/failed"
_FAILED_RANKS, _HEARD = "cookmind/failed-ranks", "cookmind/heard"


def _launcher_store(seconds: float = 60) -> dist.TCPStore | None:
    """A client of the store torchrun's launcher holds for this attempt's workers (on the node of group rank 0),
    or None outside torchrun: there the store is rank 0's own, made as the group is. ``seconds``: how long a call
    waits for it."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=seconds))


def _wait_for_every_rank(world: int) -> None:
    """Under torchrun, before torch's rendezvous: wait until every rank has come this far, or until one says it
    cannot start (``tell_other_ranks``). A rank that stopped before joining (its config missing on its node) left
    the others waiting in the rendezvous for it, up to the group's 30-minute timeout, never saying why."""
    import time

    store = _launcher_store()
    if store is None:
        return
    store.add(_ARRIVED, 1)
    deadline = time.monotonic() + 30 * 60  # then torch's own rendezvous waits and says it timed out
    while store.add(_ARRIVED, 0) < world and time.monotonic() < deadline:
        if store.check([_FAILED]):
            store.add(_HEARD, 1)
            said = store.get(_FAILED).decode()
            raise RankFailed(said, reason=said.partition(" could not start: ")[2] or said)
        time.sleep(0.1)


def tell_other_ranks(reason: str) -> None:
    """Under torchrun, a rank that cannot start before it has joined the process group tells the ranks waiting
    for it (``_wait_for_every_rank``) why, and waits up to 10 s for them to hear it: its launcher may hold the
    store and end with it. A no-op in a group, outside torchrun, or where the store is gone."""
    import time

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or dist.is_initialized():
        return
    try:
        store = _launcher_store()
        if store is None:
            return
        said = f"rank {rank_name()} (on {socket.gethostname()}) could not start: {reason}"
        store.compare_set(_FAILED, "", said)  # the first rank that failed is the one named
        failed = store.add(_FAILED_RANKS, 1)
        deadline = time.monotonic() + 10
        while store.add(_HEARD, 0) + failed < world and time.monotonic() < deadline:
            time.sleep(0.1)
            failed = store.add(_FAILED_RANKS, 0)
    except (RuntimeError, OSError, ValueError):  # the store's launcher has gone: no rank is left to tell
        pass


_SAID = "cookmind/said"  # + the node's launch, the attempt and the reason: a rank of that node has claimed it


def say_once_per_node(reason: str, say_it) -> None:
    """Call ``say_it`` (which prints ``reason``'s line) on one rank of this node only, under torchrun with more than
    one rank: the first of the node's ranks to have ``reason`` to say says it; the others wait until it has (up to
    10 s: their exit would end the job, the saying rank with it) and say nothing. One error met by every rank (a
    bad config key, a missing data file) was printed once per rank, the same line N times; a reason another rank
    gave (``RankFailed.reason``) is said once too, by whichever of its node's ranks comes first. A node is one
    torchrun launch (its ``GROUP_RANK``), with its own output: each node says it once. Outside torchrun, or where
    the launcher's store cannot be reached, ``say_it`` is called."""
    import hashlib
    import time

    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        say_it()
        return
    node = os.environ.get("GROUP_RANK", socket.gethostname())
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"{_SAID}/{node}/{attempt}/{hashlib.sha256(reason.encode('utf-8', 'replace')).hexdigest()[:16]}"
    try:
        store = _launcher_store(seconds=10)
        first = store is None or store.add(key, 1) == 1
    except (RuntimeError, OSError, ValueError):  # the launcher's store has gone: say it here
        store, first = None, True
    if first:
        say_it()
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            if store is not None:
                store.set(f"{key}/done", "1")
        return
    deadline = time.monotonic() + 10
    with contextlib.suppress(RuntimeError, OSError, ValueError):
        while not store.check([f"{key}/done"]) and time.monotonic() < deadline:
            time.sleep(0.05)


def all_reduce_flag(flag: bool, info: DistInfo) -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def min_max_over_ranks(value: int, info: DistInfo) -> tuple[int, int]:
    """The smallest and largest of ``value`` over all ranks (``(value, value)`` for one process): a check that
    every rank, on every node, decided alike."""
    if not info.enabled:
        return value, value
    t = torch.tensor([-value, value], dtype=torch.int64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return -int(t[0]), int(t[1])


def sum_over_ranks(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The sum of ``t`` over all ranks (``t`` itself for one process); a mean divides it by ``info.world_size``."""
    if not info.enabled:
        return t
    t = t.clone()
    dist.all_reduce(t)
    return t


def rank0_value(value, info: DistInfo):
    """Rank 0's ``value`` (any picklable object) on every rank; ``value`` itself for one process. For what each
    rank would otherwise decide on its own and could decide differently, e.g. a run directory named by the clock."""
    if not info.enabled or not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def differences_from_rank0(values: dict, info: DistInfo) -> list[str]:
    """Where a flat dict differs between ranks: one 'KEY is A on rank 0 (on HOST) but B on rank R (on HOST)' per
    key (the first rank that differs), the same list on every rank; [] for one process. The hosts say which node to
    fix: the c10d rendezvous numbers the nodes as they join, not by --node-rank. All ranks must call it."""
    if not info.enabled or not dist.is_initialized():
        return []
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (socket.gethostname(), values))
    hosts = [host for host, _ in gathered]
    dicts = [d for _, d in gathered]
    first, out = dicts[0], []
    for key in sorted(set().union(*dicts)):
        for rank, other in enumerate(dicts[1:], 1):
            if other.get(key) != first.get(key):
                out.append(
                    f"{key} is {first.get(key)!r} on rank 0 (on {hosts[0]}) but {other.get(key)!r} on rank {rank} "
                    f"(on {hosts[rank]})"
                )
                break
    return out


_GLOO_SOURCE = re.compile(r"^\[[^\]]*/gloo/[^\]]*\]\s*")  # "[.../gloo/transport/tcp/pair.cc:553] "


# what a collective or the store says when the other end has gone: gloo's TCP pair, its receive timeout, the store
_PEER_GONE = re.compile(r"(closed|reset) by peer|broken pipe|timed out waiting|socket timeout", re.IGNORECASE)


def lost_peer_reason(exc: BaseException) -> str | None:
    """Where ``exc`` is a collective's or the store's error for a peer that has gone (gloo's "Connection closed by
    peer" or "Connection reset by peer", a broken pipe, a receive's or the store's timeout): its first sentence,
    named by its backend ("gloo: Connection closed by peer [10.0.0.2]:4493"); else None, for every other error,
    gloo's assertions, NCCL's CUDA errors and a port in use among them (they keep their traceback). torch says more
    (a C++ source path, "This is typically caused by a remote worker crashing ... GLHF!") after a traceback through
    the autograd engine or the collective that noticed."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if not _PEER_GONE.search(first):
        return None
    if _GLOO_SOURCE.match(first):
        return "gloo: " + _GLOO_SOURCE.sub("", first).split(". ", 1)[0].rstrip(".")
    if isinstance(exc, dist.DistError):
        return f"{type(exc).__name__}: {first.split('. ', 1)[0].rstrip('.')}"
    return None


class RankFailed(ValueError):
    """Another rank could not go on (``stop_together``): raised on the ranks that could, with its reason (the
    message names the rank too; ``reason`` is the rank's own one-line error)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = message if reason is None else reason


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        from cookmind.cli import os_error_line

        return os_error_line(exc)
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def stop_together(info: DistInfo, what: str) -> Iterator[None]:
    """Run the block on every rank; where it raises on any rank, it raises on every rank. The rank that failed
    raises its own error; the others ``RankFailed``: "rank R (on HOST) could not WHAT: its one-line reason" (the
    first rank that failed). Without it a rank that stopped (a store missing on its node, a full disk) left the
    others to die in their next collective with gloo's "Connection closed by peer" traceback, or to wait in it
    until NCCL's timeout, never saying why.

    Every rank must enter the block, and the block must hold no collective a failing rank could skip (the
    others would wait in it). One all-gather of a small object on leaving it, a barrier as well."""
    error: Exception | None = None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every kind is reported to the other ranks, then raised again here
        error = exc
    raise_together(info, None if error is None else (what, error))


def raise_together(info: DistInfo, failure: tuple[str, Exception] | None) -> None:
    """Every rank calls it, each with what it could not do and its error, or None; where any rank has a failure,
    every rank raises: that rank its own error, the others ``RankFailed`` naming the first rank that failed, its
    host, what it could not do and its one-line reason. One all-gather of a small object (a barrier as well)."""
    if info.enabled and dist.is_initialized():
        said: list = [None] * dist.get_world_size()
        mine = None if failure is None else (socket.gethostname(), failure[0], _reason(failure[1]))
        try:
            dist.all_gather_object(said, mine)
        except Exception:
            if failure is not None:  # another rank is gone (killed, out of memory): this rank says its own error
                raise failure[1]  # noqa: B904 - the collective's error stays its context
            raise
        failed = [(rank, s) for rank, s in enumerate(said) if s is not None]
        if failed and failure is None:
            rank, (host, what, reason) = failed[0]
            raise RankFailed(f"rank {rank} (on {host}) could not {what}: {reason}", reason=reason)
    if failure is not None:
        raise failure[1]


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op for one process)."""
    if info.enabled and dist.is_initialized():
        dist.barrier()


def destroy_distributed() -> None:
    """Leave the process group (a no-op when there is none)."""
    if dist.is_initialized():
        dist.destroy_process_group()


_JOINED = False  # whether this process made or joined a process group (init_distributed)


def end_process(code: int):
    """End a cookmind program (``cookmind``, ``python -m cookmind``, a bench script's torchrun worker) with exit
    status ``code``: ``SystemExit``, except in a process that was in a process group. That one ends as
    multiprocessing's children do: the atexit handlers run and the output is flushed while the interpreter is
    whole, then ``os._exit``, without Python's finalization. A group can outlive destroy_process_group (torch's
    DTensor caches hold FSDP's mesh, and the mesh the group), and a gloo worker thread still freeing its last
    collective's tensors needs the GIL: taken during finalization, the thread is ended and the process aborts,
    SIGABRT after a completed run, which torchrun reports as a failed job."""
    if not _JOINED:
        raise SystemExit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone
            pass
    os._exit(0 if code is None else code if isinstance(code, int) else 1)  # as SystemExit reads its code
