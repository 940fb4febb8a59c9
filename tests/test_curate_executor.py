"""curate's local process pool stops at once on a failed shard or a Ctrl-C: it ran every queued shard first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each task but a failing one sleeps SLOW seconds and leaves a marker when it starts; two workers take TASKS of them.
# Run to the end, the queue takes (TASKS - 1) / 2 * SLOW = 10 s; stopped at once, about one task's time or less.
TASKS, SLOW = 11, 2.0

_SCRIPT = f"""
import sys, time
from pathlib import Path
from cookmind.curate.executors import LocalExecutor

def task(marks, i, fail):
    Path(marks, str(i)).touch()
    if i == fail:
        raise ValueError("shard-00000.jsonl:3: not valid JSON")
    time.sleep({SLOW})
    return i

if __name__ == "__main__":
    marks, fail = sys.argv[1], int(sys.argv[2])
    t0 = time.monotonic()
    try:
        LocalExecutor(workers=2, progress=False).map(task, [(marks, i, fail) for i in range({TASKS})], "curate")
    except ValueError as exc:
        print("error", round(time.monotonic() - t0, 1), exc, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", round(time.monotonic() - t0, 1), flush=True)
        sys.exit(130)
    print("done", flush=True)
"""


def _ctrl_c_as_a_terminal_gives_it():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background test run's children start with SIGINT ignored


def _popen(script: Path, *args: str) -> subprocess.Popen:
    """``script`` run with this checkout's cookmind, in a process group of its own, Ctrl-C at its default."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_gives_it,
    )


def _outcome(proc: subprocess.Popen, hung: str) -> tuple[str, str]:
    """``proc``'s output once it ends (a test failure saying ``hung`` if it has not in 60 s); whatever it left in
    its process group (a worker still asleep) is killed either way."""
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(hung)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _start(tmp_path: Path, fail: int) -> tuple[subprocess.Popen, Path]:
    script, marks = tmp_path / "pool.py", tmp_path / "marks"
    script.write_text(_SCRIPT)
    marks.mkdir()
    return _popen(script, str(marks), str(fail)), marks


def test_a_failing_shard_stops_the_pool_without_running_the_queued_shards(tmp_path):
    # a bad record in shard 0 was reported only after every other queued shard had run (12 s with no output on
    # these 11 tasks; hours on a real crawl), the progress bar standing still meanwhile
    proc, marks = _start(tmp_path, fail=0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert out.startswith("error ") and "shard-00000.jsonl:3" in out
    started = len(list(marks.iterdir()))
    assert started <= 4, f"{started} of {TASKS} tasks ran after the first one failed"
    assert float(out.split()[1]) < (TASKS - 1) / 2 * SLOW / 2, out


def test_ctrl_c_stops_the_pool_without_running_the_queued_shards(tmp_path):
    if "forkserver" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip("no forkserver on this platform: workers are spawned")
    # Ctrl-C ran every queued shard of the stage before `cookmind curate run: interrupted` came (the workers ignore
    # it, and the pool's exit waited for its queue)
    proc, marks = _start(tmp_path, fail=-1)
    deadline = time.monotonic() + 60
    while len(list(marks.iterdir())) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # both workers are in their first task
    assert proc.poll() is None, proc.communicate()
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it: to the whole process group
    out, err = _outcome(proc, "the process hung after Ctrl-C")
    waited = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert out.startswith("interrupted"), out
    started = len(list(marks.iterdir()))
    assert started <= 4, f"{started} of {TASKS} tasks ran after Ctrl-C"
    assert waited < SLOW * 2, f"{waited:.1f} s from Ctrl-C to exit"


def test_one_large_input_shows_its_documents_read_under_the_shard_bar(tmp_path, capsys, monkeypatch):
    """One JSONL file is one shard: the shard bar sat at 0/1 for the whole stage; a second bar counts the documents
    read, and is gone (its line cleared) when the shard is done."""
    import json as _json

    from cookmind import progress
    from cookmind.curate import executors
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import run_pipeline

    monkeypatch.setattr(executors, "DOC_BAR_SECONDS", 0, raising=False)  # draw every update, not every half second
    monkeypatch.setattr(progress, "LINE_SECONDS", 0)  # capsys is no terminal: the bars are lines, one every update
    src = tmp_path / "big.jsonl"
    src.write_text("".join(_json.dumps({"text": f"Soup number {i} of the day."}) + "\n" for i in range(700)))
    run_pipeline(CurateConfig(stages=[{"extract": {}}]), [str(src)], tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert "documents: " in err and "700 docs" in err and "0/1" in err
    assert not executors.INLINE["bars"] and not executors.INLINE["progress"]


_HALF_SENT = """
import os, signal, struct, sys, threading, time
from cookmind.curate.executors import LocalExecutor

def task(i):
    if i == 0:
        # what a worker killed while sending its result leaves: the start of a message in the result pipe (its
        # length says 1 MiB, 7 bytes follow); the reader waits for the rest, which never comes
        frame = sys._getframe(1)
        while not {"outqueue", "result_queue"} & frame.f_locals.keys():
            frame = frame.f_back
        queue = frame.f_locals.get("outqueue") or frame.f_locals["result_queue"]
        with queue._wlock:
            os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"partial")
    time.sleep(3600)

if __name__ == "__main__":
    threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # the user's Ctrl-C, meanwhile
    t0 = time.monotonic()
    try:
        LocalExecutor(workers=2, progress=False).map(task, [(i,) for i in range(4)], "curate")
    except KeyboardInterrupt:
        print("interrupted", round(time.monotonic() - t0, 1), flush=True)
        sys.exit(130)
"""


def test_ctrl_c_ends_the_pool_when_a_worker_left_half_a_result(tmp_path):
    """The pool's exit waited forever for the rest of a result a stopped worker had half sent (its reader blocks,
    and this process holds the pipe's other end): a Ctrl-C to a curate run could hang as pack's and tokenizer
    training's did (CI, session 28). It ends in bounded time, as theirs (cookmind.pools.stop_pool)."""
    if "forkserver" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip("no forkserver on this platform: workers are spawned")
    script = tmp_path / "half.py"
    script.write_text(_HALF_SENT)
    proc = _popen(script)
    out, err = _outcome(proc, "the pool's exit hung after Ctrl-C")
    assert proc.returncode == 130, err
    assert out.startswith("interrupted"), out


def test_the_document_bar_counts_the_documents_each_batch_has_been_through_the_stages(tmp_path, capsys, monkeypatch):
    """The document bar counted documents as they were read: a shard's documents are read a batch ahead of the
    stages, and a batch of HTML pages is read in a moment, so the bar sat at 0 while the stages worked through it (an
    HTML shard of up to 256 pages is one batch). It now counts the documents done: while the stages work on a batch,
    it shows those of the batches before it, every one of them drawn."""
    import json as _json

    from cookmind import progress
    from cookmind.curate import executors, runner
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.stages import ExtractStage

    monkeypatch.setattr(executors, "DOC_BAR_SECONDS", 0, raising=False)  # draw every update, not every half second
    monkeypatch.setattr(progress, "LINE_SECONDS", 0)  # capsys is no terminal: the bars are lines, one every update
    shown = []  # what the bar shows each time the stages begin a batch

    def process_batch(self, docs, stats):
        shown.append(executors.INLINE["bars"][-1].last_print_n)
        return [self.process(doc, stats) for doc in docs]

    monkeypatch.setattr(ExtractStage, "process_batch", process_batch)
    n = 2 * runner.BATCH + 5
    src = tmp_path / "big.jsonl"
    src.write_text("".join(_json.dumps({"text": f"Soup number {i} of the day."}) + "\n" for i in range(n)))
    runner.run_pipeline(CurateConfig(stages=[{"extract": {}}]), [str(src)], tmp_path / "out", progress=True)
    assert shown == [0, runner.BATCH, 2 * runner.BATCH]
    err = capsys.readouterr().err
    assert f"documents: {n} docs" in err  # the last batch's documents counted too
    assert runner.BATCH <= 64  # an HTML shard (256 pages) advances at least four times


def test_the_bars_in_a_pipe_or_a_log_are_plain_lines(tmp_path, capsys):
    """Into a pipe (capsys's stderr is not a terminal) curate run wrote its bars as on a terminal: carriage returns,
    and the document bar drawn under the shard bar with cursor moves (ESC[A), an empty "documents: 0 docs" bar for
    every shard. Each bar is plain lines now, the last one its end; a document bar that lasts less than
    LINE_SECONDS (a small shard's) writes none."""
    import json as _json

    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import run_pipeline

    for i in range(3):
        (tmp_path / f"in-{i}.jsonl").write_text(_json.dumps({"text": f"Soup number {i} of the day."}) + "\n")
    inputs = [str(tmp_path / f"in-{i}.jsonl") for i in range(3)]
    run_pipeline(CurateConfig(stages=[{"extract": {}}]), inputs, tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err and "documents" not in err
    lines = err.splitlines()
    assert lines[0].startswith("curate extract:   0% 0/3") and lines[-1].startswith("curate extract: 100% 3/3")
