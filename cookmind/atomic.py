"""Atomic writes for every file and directory cookmind makes: a temporary name, fsync, rename.

A reader never sees half a file, a crash never leaves one under the final name, and a disk that
fills up gives one line naming the path instead of a traceback. Temporary names carry our PID and
host (``.NAME.tmp-PID@HOST``), so the next run can remove the ones whose writer died
(``clean_stale_temps``) without touching a live writer's. Nothing here imports other cookmind
packages: every layer may use it.

    write_text(path, text) / write_bytes / write_json / write_jsonl     one call
    with writing(path) as f: ...                                        a file written in pieces
    with temp_path(path) as tmp: torch.save(obj, tmp)                   a library that wants a path
    with building_dir(path, replace=..., is_ours=..., own_file=...) as tmp: ...   a directory built whole
    check_output_file(out, inputs, overwrite)                           before a command writes one file
    refuse_nested(src, out, what)                                       before a command writes a folder from one
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

_HOST = socket.gethostname().split(".")[0] or "host"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)@(?P<host>.+)$")
_LOW_SPACE = 1 << 20  # below this many free bytes a failed write is taken for a full disk
# a failed write whose errno says another reason than space (/proc, a read-only mount, report no free bytes too)
_OTHER_REASONS = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
    errno.ENAMETOOLONG,
}


class DiskFullError(OSError):
    """The disk filled up while writing: the message names the path and says what to do."""


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temporary names (``.NAME.tmp-PID@HOST``, ``.NAME.old-PID@HOST``)."""
    return _TEMP.match(name) is not None


def temp_name(path: str | os.PathLike, tag: str = "tmp") -> Path:
    """A hidden sibling of ``path`` that names this process (same directory, so the rename is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}@{_HOST}")


def is_disk_full(exc: BaseException, path: str | os.PathLike) -> bool:
    """Whether ``exc`` (from writing under ``path``) came from a full disk.

    Libraries report it differently (OSError ENOSPC; torch.save a RuntimeError "file write failed"),
    so a failed write also counts when the filesystem has under 1 MiB free.
    """
    if isinstance(exc, DiskFullError):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if "no space left" in str(exc).lower():
        return True
    if not isinstance(exc, (OSError, RuntimeError)):
        return False
    if isinstance(exc, OSError) and exc.errno in _OTHER_REASONS:  # said why: a read-only mount also has no free bytes
        return False
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free < _LOW_SPACE
    except OSError:
        return False


def disk_full_error(path: str | os.PathLike) -> DiskFullError:
    """The one-line error for a full disk while writing ``path``."""
    return DiskFullError(
        errno.ENOSPC,
        f"no space left on device while writing {path}; free some space "
        f"(old checkpoints, stores) or write somewhere else",
    )


@contextlib.contextmanager
def _disk_full_as_error(path: Path) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        if is_disk_full(exc, path):
            raise disk_full_error(path) from exc
        raise


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def temp_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path for a writer that wants a file name (torch.save, np.savez, save_file);
    on success it is fsynced and renamed to ``path``, on failure removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_own_stale_temps(path)  # what a killed earlier write of this file left behind
    tmp = temp_name(path)
    try:
        with _disk_full_as_error(path):
            yield tmp
            _fsync_file(tmp)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _umask() -> int:
    """The process's umask, read without setting it where Linux shows it (os.umask sets it: a file another thread
    created meanwhile would get the temporary mask)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """safetensors' ``save_file`` with the mode ``open()`` gives (0666 less the umask): save_file creates its
    file 0600 whatever the umask, so weights were readable by their owner only beside 0644 config files."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


@contextlib.contextmanager
def writing(path: str | os.PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[Any]:
    """Yield an open file whose contents appear at ``path`` only once the block ends without error."""
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    with temp_path(path) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f
        f.flush()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with writing(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with writing(path, "w", newline="") as f:
        f.write(text)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON (non-ASCII kept) to ``path`` atomically."""
    return write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> Path:
    """One JSON object per line, atomically."""
    with writing(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return Path(path)


def replace_dir(
    tmp_dir: str | os.PathLike,
    final: str | os.PathLike,
    replace: bool = False,
    is_ours: Callable[[Path], bool] | None = None,
    what: str = "output",
    own_file: Callable[[str], bool] | None = None,
) -> None:
    """Rename the finished ``tmp_dir`` to ``final``.

    Something already at ``final`` is replaced only when ``replace`` is set *and* it is a ``what`` (a token store,
    a tokenizer, ...) holding nothing else: ``is_ours(final)`` and, with ``own_file``, every file and folder in it
    (see ``foreign_file``). The old one is deleted whole, so we never delete what we did not make.
    """
    tmp_dir, final = Path(tmp_dir), Path(final)
    for f in tmp_dir.rglob("*"):
        if f.is_file():
            _fsync_file(f)
    if final.exists() or final.is_symlink():
        check_replaceable(final, replace, is_ours, what, own_file)
        old = temp_name(final, "old")
        os.replace(final, old)
        os.replace(tmp_dir, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, final)
    _fsync_dir(final.parent)


def foreign_file(folder: str | os.PathLike, own_file: Callable[[str], bool]) -> str | None:
    """The first file or folder under ``folder`` (walked in sorted order, depth first; a path relative to it,
    ``/``-separated, e.g. ``mydata/important.txt``) that ``own_file`` does not claim as one the command writes;
    None when it claims them all. Claimed folders are walked too: a file a user put inside one is found."""

    def walk(d: Path, rel: str) -> str | None:
        for entry in sorted(d.iterdir()):
            name = rel + entry.name
            inner = walk(entry, name + "/") if entry.is_dir() and not entry.is_symlink() else None
            if inner is not None:
                return inner
            if not own_file(name):
                return name
        return None

    return walk(Path(folder), "")


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The first folder on the way to ``path`` that exists and is a file (making ``path`` would fail on it: "[Errno
    17] File exists"), or None."""
    return next((d for d in reversed(Path(path).parents) if d.exists() and not d.is_dir()), None)


def check_replaceable(
    final: Path,
    replace: bool,
    is_ours: Callable[[Path], bool] | None,
    what: str,
    own_file: Callable[[str], bool] | None = None,
) -> None:
    """Raise FileExistsError unless ``final`` may be replaced (see ``replace_dir``); call it before long work.

    Without ``replace`` the refusal offers --overwrite only when --overwrite would work."""
    final = Path(final)
    if (blocked := file_in_the_way(final)) is not None:
        raise NotADirectoryError(f"{final}: {blocked} is a file, not a folder; choose another path or move it away")
    if not (final.exists() or final.is_symlink()):
        return
    if is_ours is None:
        raise FileExistsError(f"{final} already exists; choose another output path or move it away")
    foreign = None
    if own_file is not None and final.is_dir() and not final.is_symlink():
        foreign = foreign_file(final, own_file)
    ours = foreign is None and not final.is_symlink() and is_ours(final)
    if ours and not replace:
        raise FileExistsError(f"{final} already exists; choose another output path or pass --overwrite")
    if ours:
        return
    if foreign is not None and is_ours(final):
        raise FileExistsError(
            f"{final} holds {foreign}, which a {what} never has; --overwrite replaces only a folder holding nothing "
            f"but a {what}'s own files, so move {final / foreign} away or choose another output path"
        )
    kind = "a file" if final.is_file() else "a folder" if final.is_dir() else "something"
    raise FileExistsError(
        f"{final} exists and is {kind}, not a {what}; --overwrite replaces only a {what}, "
        f"so move it away or choose another output path"
    )


def check_output_file(
    out: str | os.PathLike, inputs: Iterable[str | os.PathLike], overwrite: bool, flag: str = "--out"
) -> None:
    """Refuse a file output that is one of ``inputs`` (writing it would destroy that input, even with
    ``overwrite``), that lies in a training run's checkpoints folder or is one of the run's own files (its
    config.yaml, metrics.jsonl, report.md, ...), or that already exists without ``overwrite``; call it before the
    command does any work."""
    from cookmind.run_layout import refuse_output_in_checkpoints, refuse_run_file

    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(f"{flag} {out} is a directory; name a file")
    if (blocked := file_in_the_way(out)) is not None:  # the write, after all the work, would fail on it
        raise NotADirectoryError(
            f"{flag} {out}: {blocked} is a file, not a folder; choose another path or move it away"
        )
    refuse_output_in_checkpoints(out, flag)  # where training prunes and deletes (checkpoint.keep_last)
    refuse_run_file(out, flag)  # a run's config.yaml, metrics.jsonl, report.md: the run's, even with overwrite
    for p in inputs:
        if out.exists() and Path(p).exists() and os.path.samefile(out, p):
            raise ValueError(f"{flag} {out} is also the input {p}; writing it would destroy it; choose another {flag}")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{flag} {out} already exists; choose another output path or pass --overwrite")


def refuse_nested(
    src: str | os.PathLike,
    out: str | os.PathLike,
    reads: str,
    suffix: str = "out",
    out_name: str = "the output",
    around: bool = True,
) -> None:
    """ValueError (one line) when the output folder ``out`` is the folder ``src`` a command reads (``reads``: "the
    folder import --hf reads"), lies inside it (the output lands among the files it was made from, and is read as
    one of them next time), or holds it (``--overwrite`` would replace the input with the output); call it before
    any work. The way out named: ``<src>-<suffix>`` beside the input; ``out_name`` names the output (``--run-dir``);
    ``around=False`` leaves an output holding ``src`` to the caller (a run's own checkpoints, read on resume)."""
    s, o = Path(os.path.abspath(src)), Path(os.path.abspath(out))
    s_real, o_real = s.resolve(), o.resolve()  # a symlink to the input is the input
    if o_real == s_real:
        how = "the same folder as"
    elif o_real.is_relative_to(s_real):
        how = "inside"
    elif around and s_real.is_relative_to(o_real):
        how = "holds"
    else:
        return
    instead = s.parent / f"{s.name}-{suffix}"
    where = f"is {how} {src}" if how != "holds" else f"holds {src}"
    raise ValueError(f"{out_name} {out} {where}, {reads}; write it outside that folder, e.g. {instead}")


@contextlib.contextmanager
def building_dir(
    final: str | os.PathLike,
    replace: bool = False,
    is_ours: Callable[[Path], bool] | None = None,
    what: str = "output",
    own_file: Callable[[str], bool] | None = None,
) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``final``; renamed into place when the block succeeds.

    An existing ``final`` is checked first (``check_replaceable``), so a refusal comes before the work.
    """
    final = Path(final)
    check_replaceable(final, replace, is_ours, what, own_file)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(final.parent)
    tmp = temp_name(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with _disk_full_as_error(final):
            yield tmp
            replace_dir(tmp, final, replace, is_ours, what, own_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


# directory -> the temporary names in it when this process first wrote a file there: a single-file write looks its
# own up here, so writing thousands of files into one folder lists it once, not once a file (14 ms a write at 5000)
_TEMPS_AT_FIRST_WRITE: dict[str, set[str]] = {}
_TEMPS_LOCK = threading.Lock()


def _clean_own_stale_temps(path: Path) -> None:
    """``clean_stale_temps(path.parent, path.name)``, reading the folder once a process (a temporary a writer that
    died during this process left is the next run's to remove)."""
    key = os.path.abspath(path.parent)
    # threads writing into one folder share its set: one discarding while another iterated raised "Set changed size
    # during iteration", so every read and change of the sets holds the lock (the removal itself does not)
    with _TEMPS_LOCK:
        seen = _TEMPS_AT_FIRST_WRITE.get(key)
        if seen is None:
            with os.scandir(path.parent) as entries:
                seen = {e.name for e in entries if e.name.startswith(".") and _TEMP.match(e.name)}
            _TEMPS_AT_FIRST_WRITE[key] = seen
        stale = any(_TEMP.match(t)["name"] == path.name for t in seen)
    if stale:
        gone = clean_stale_temps(path.parent, path.name)
        with _TEMPS_LOCK:
            seen.difference_update(g.name for g in gone)


def clean_stale_temps(directory: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove our temporary files and folders in ``directory`` whose writer (same host) is dead; return them.

    With ``name``, only the temporaries of that output (``.NAME.tmp-PID@HOST``): a single-file writer cleans up
    after its own killed predecessor without touching other outputs' temporaries.
    """
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    prefix = "." if name is None else f".{name}."
    for entry in directory.iterdir():
        m = _TEMP.match(entry.name) if entry.name.startswith(prefix) else None
        if not m or (name is not None and m["name"] != name) or m["host"] != _HOST:
            continue
        pid = int(m["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed
