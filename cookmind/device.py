"""Which device a command runs on: one rule for training (``train.device``) and for generate, chat, serve and eval
(``--device``). ``auto`` (or nothing given) is this process's GPU when CUDA is present, else the CPU."""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported in the functions: the parsers read DEVICE_HELP, and --help loads no torch
    import torch

# the --device help of every command that takes one: the values resolve_device accepts
DEVICE_HELP = "auto, cpu, cuda or cuda:N (default auto: this process's GPU when CUDA is present, else the CPU)"


def resolve_device(name: str | None = "auto", local_rank: int = 0, what: str = "--device") -> torch.device:
    """``auto``/None -> ``cuda:<local_rank>`` when CUDA is present, else the CPU; ``cuda`` -> ``cuda:<local_rank>``.

    A name torch does not know, or CUDA asked for where there is none, is a ValueError naming ``what`` (the key or
    flag the user set) and what to pass instead: the CLI prints it as one line.
    """
    import torch

    if name is None or name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    given = f"{what} {name}" if what.startswith("--") else f"{what}={name}"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"{given} is not a device; pass auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):  # a device torch knows (mps, xpu, ...): a traceback at the first tensor
        raise ValueError(f"{given}: cookmind runs on the CPU or CUDA GPUs; pass auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fix = "pass cpu or auto" if what.startswith("--") else f"set {what}=cpu (or auto) to run on the CPU"
            raise ValueError(f"{given} but CUDA is not available here; {fix}")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{given}: device {device} (LOCAL_RANK={local_rank}) but only {torch.cuda.device_count()} "
                "CUDA devices are visible; launch at most that many processes per node"
            )
    return device


def cuda_missing(name: str, flag: str = "--device") -> str | None:
    """The line a benchmark's parser errors with when ``flag name`` asks for CUDA where there is none, else None."""
    import torch

    if str(name).startswith("cuda") and not torch.cuda.is_available():
        return f"{flag} {name}: CUDA is not available here; pass {flag} cpu, or run this on a GPU machine"
    return None


def inference_dtype(dtype: str | None, device: torch.device) -> str | None:
    """The dtype a served model loads in when none is given: bf16 on a GPU, else the checkpoint's own."""
    return dtype or ("bfloat16" if device.type == "cuda" else None)


@contextlib.contextmanager
def collector_paused():
    """Run Python's garbage collector once, then keep it off until the block ends: wrap CUDA-graph captures in it.

    torch no longer collects garbage when a capture begins. An object freed inside a capture (an engine of an
    earlier request or test, kept alive by a reference cycle until a collection pass) runs CUDA calls a capture
    forbids: freeing its graphs, events or pinned buffers spoils the capture, and the next launch fails with
    "operation failed due to a previous error during capture". Collecting first and pausing the collector until
    the captures end keeps every such free outside them. One collection for a loop of captures, not one each.
    Blocks may overlap (the server's engine thread captures while a training step is captured in another): the
    collector comes back on when the last one ends, and only if it was on when the first began.
    """
    global _pauses, _was_enabled
    with _pause_lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
        _pauses += 1
        gc.collect()
        gc.disable()
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


_pause_lock = threading.Lock()
_pauses = 0  # collector_paused blocks running now, in any thread
_was_enabled = True  # whether the collector was on when the first of them began
