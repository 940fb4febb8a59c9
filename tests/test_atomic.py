"""cookmind.atomic: temporary names that carry our PID, rename into place, refusals, stale clean-up, full disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from cookmind import atomic


def test_write_helpers_leave_only_the_final_file(tmp_path):
    atomic.write_text(tmp_path / "a.txt", "héllo\n")
    atomic.write_json(tmp_path / "b.json", {"x": [1, 2]})
    atomic.write_jsonl(tmp_path / "c.jsonl", [{"i": 0}, {"i": 1}])
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    assert json.loads((tmp_path / "b.json").read_text()) == {"x": [1, 2]}
    assert [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()] == [{"i": 0}, {"i": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json", "c.jsonl"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic.writing(target) as f:
        f.write("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_temp_names_carry_our_pid(tmp_path):
    assert f".x.tmp-{os.getpid()}@" in atomic.temp_name(tmp_path / "x").name


def test_replace_dir_replaces_only_what_the_caller_recognises(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "user.txt").write_text("precious")

    def build():
        with atomic.building_dir(final, replace=True, is_ours=lambda p: (p / "ours").is_file(), what="thing") as t:
            (t / "ours").write_text("new")

    with pytest.raises(FileExistsError, match="is a folder, not a thing"):
        build()
    assert (final / "user.txt").read_text() == "precious"
    (final / "user.txt").unlink()
    (final / "ours").write_text("old")
    build()
    assert (final / "ours").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def _dead_pid() -> int:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(dead.stdout)


def test_stale_temporaries_of_dead_writers_are_removed_live_ones_kept(tmp_path):
    dead_pid = _dead_pid()
    host = atomic.temp_name(tmp_path / "x").name.split("@", 1)[1]
    stale = tmp_path / f".step_00000010.tmp-{dead_pid}@{host}"
    stale.mkdir()
    (stale / "optimizer.pt").write_bytes(b"x" * 100)
    live = tmp_path / f".store.tmp-{os.getppid()}@{host}"  # our parent is alive
    live.mkdir()
    other_host = tmp_path / f".store.tmp-{dead_pid}@not-{host}"  # maybe alive elsewhere on a shared disk
    other_host.mkdir()
    user = tmp_path / ".tmp-notes"
    user.mkdir()
    assert atomic.clean_stale_temps(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other_host.exists() and user.exists()


def test_a_full_disk_is_one_line_naming_the_path(tmp_path):
    target = tmp_path / "big.bin"
    with pytest.raises(atomic.DiskFullError) as info, atomic.temp_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    message = str(info.value)
    assert "no space left on device" in message and str(target) in message and "\n" not in message


@pytest.mark.parametrize("code", [errno.ENOENT, errno.EACCES, errno.EROFS, errno.ENOTDIR])
def test_a_write_refused_for_another_reason_is_not_called_a_full_disk(tmp_path, monkeypatch, code):
    """`eval gsm8k --out /proc/x.jsonl` (ENOENT) said 'no space left on device while writing /proc/x.jsonl': /proc, as
    a read-only mount, reports no free bytes, and a failed write there was taken for a full disk. An OSError whose
    errno says another reason keeps it."""
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda p: type("U", (), {"free": 0})())
    assert atomic.is_disk_full(OSError(errno.EIO, "I/O error"), tmp_path)  # no reason given: free space decides
    assert atomic.is_disk_full(RuntimeError("file write failed"), tmp_path)  # torch.save's words
    assert not atomic.is_disk_full(OSError(code, os.strerror(code)), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_single_file_write_removes_its_own_stale_temporaries_only(tmp_path):
    """A SIGKILLed `tokenizer encode --output big.bin` left .big.bin.tmp-PID@HOST, and a successful rerun kept it:
    only directory writers cleaned up. A write now removes the dead writers' temporaries of its own file."""
    dead_pid = _dead_pid()
    host = atomic.temp_name(tmp_path / "x").name.split("@", 1)[1]
    stale = tmp_path / f".big.bin.tmp-{dead_pid}@{host}"
    stale.write_bytes(b"x" * 100)
    live = tmp_path / f".big.bin.tmp-{os.getppid()}@{host}"  # a live writer of the same file: kept
    live.write_bytes(b"y")
    other = tmp_path / f".other.bin.tmp-{dead_pid}@{host}"  # another output's: left to its own writer
    other.write_bytes(b"z")
    prefix = tmp_path / f".big.tmp-{dead_pid}@{host}"  # a name that only starts like ours
    prefix.write_bytes(b"w")
    atomic.write_bytes(tmp_path / "big.bin", b"new")
    assert not stale.exists() and live.exists() and other.exists() and prefix.exists()
    assert (tmp_path / "big.bin").read_bytes() == b"new"


def test_foreign_file_names_the_first_file_a_command_did_not_write(tmp_path):
    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "a.bin").write_text("")
    own = {"meta.json", "shard", "shard/a.bin"}.__contains__
    assert atomic.foreign_file(tmp_path, own) is None
    (tmp_path / "shard" / "user.txt").write_text("mine")
    assert atomic.foreign_file(tmp_path, own) == "shard/user.txt"
    (tmp_path / "empty").mkdir()
    assert atomic.foreign_file(tmp_path, own) == "empty"


def test_writing_many_files_into_one_folder_reads_the_folder_once(tmp_path, monkeypatch):
    """Each single-file write looked for its killed predecessor's temporary by listing the whole folder: thousands
    of files into one folder cost thousands of listings (14 ms a write at 5000 files). The folder is read once a
    process (and again only for a file whose dead writer left a temporary, which is then removed)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = atomic.temp_name(tmp_path / "f7.txt").name.replace(f"-{os.getpid()}@", f"-{dead.pid}@")
    (tmp_path / stale).write_text("half")
    listings, scandir, iterdir = [], os.scandir, atomic.Path.iterdir

    def counting_scandir(path="."):
        listings.append(str(path))
        return scandir(path)

    def counting_iterdir(self):
        listings.append(str(self))
        return iterdir(self)

    monkeypatch.setattr(atomic.os, "scandir", counting_scandir)
    monkeypatch.setattr(atomic.Path, "iterdir", counting_iterdir)
    for i in range(50):
        atomic.write_text(tmp_path / f"f{i}.txt", str(i))
    assert listings.count(str(tmp_path)) == 2  # once, and once more for f7's dead writer's temporary (it was 50)
    assert not (tmp_path / stale).exists() and (tmp_path / "f7.txt").read_text() == "7"
