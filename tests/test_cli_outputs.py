"""Commands that write files (`eval --out`, `tokenizer encode --output`, `curate train-classifier --output`,
`curate dedup --output`, `curate crawl --output`) never destroy an input and replace an existing file only with
--overwrite; the refusal comes before any work."""

from __future__ import annotations

import json

import pytest

from cookmind.cli import main

ROWS = [{"text": f"buy cheap pills now deal {i}", "label": "spam"} for i in range(10)]
ROWS += [{"text": f"the soup simmered in the garden {i}", "label": "good"} for i in range(10)]


def _commands(tmp_path, tok_dir, out):
    """Each command with its input file (a user's data) and ``out`` as its output."""
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    missing_model = str(tmp_path / "no-model")  # the refusal must come before the model is even looked for
    return data, {
        "eval": ["eval", "gsm8k", "--model", missing_model, "--data", str(data), "--quiet", "--out", str(out)],
        "encode": ["tokenizer", "encode", "--tokenizer", str(tok_dir), "--input", str(data), "--output", str(out)],
        "classifier": ["curate", "train-classifier", "--input", str(data), "--output", str(out), "--bucket", "64"],
    }


@pytest.mark.parametrize("command", ["eval", "encode", "classifier"])
def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, tok_dir, capsys, command):
    data, commands = _commands(tmp_path, tok_dir, tmp_path / "data.jsonl")
    before = data.read_bytes()
    assert main(commands[command]) == 2
    assert main(commands[command] + ["--overwrite"]) == 2  # not even when told to overwrite
    err = capsys.readouterr().err
    assert "is also the input" in err and "data.jsonl" in err
    assert data.read_bytes() == before


@pytest.mark.parametrize("command", ["eval", "encode", "classifier"])
def test_an_existing_output_needs_overwrite(tmp_path, tok_dir, capsys, command):
    out = tmp_path / "mine.txt"
    out.write_text("the user's own file\n")
    _, commands = _commands(tmp_path, tok_dir, out)
    assert main(commands[command]) == 2
    assert "already exists; choose another output path or pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "the user's own file\n"
    if command != "eval":  # eval then runs (and here stops at the missing model)
        assert main(commands[command] + ["--overwrite"]) == 0
        assert out.read_bytes() != b"the user's own file\n"


@pytest.mark.parametrize("method", ["lines", "minhash"])
def test_dedup_never_writes_over_its_inputs_or_one_output_twice(tmp_path, capsys, method):
    docs = tmp_path / "docs"
    (docs / "a").mkdir(parents=True)
    (docs / "b").mkdir()
    for sub, text in (("a", "one cat\nsat here\n"), ("b", "one cat\nran away\n")):
        (docs / sub / "doc.txt").write_text(text)
    (docs / "a" / "other.txt").write_text("one cat\nsat here\n")
    a_files = [str(docs / "a" / "doc.txt"), str(docs / "a" / "other.txt")]
    before = {p: open(p).read() for p in a_files}
    dedup = ["curate", "dedup", "--method", method, "--input"]
    # the inputs' own folder as --output would rewrite them in place
    assert main([*dedup, *a_files, "--output", str(docs / "a"), "--overwrite"]) == 2
    assert "doc.txt lies inside --output" in capsys.readouterr().err
    assert {p: open(p).read() for p in a_files} == before
    # a/doc.txt and b/doc.txt would both be written to out/doc.txt
    both = [str(docs / "a" / "doc.txt"), str(docs / "b" / "doc.txt")]
    assert main([*dedup, *both, "--output", str(tmp_path / "out")]) == 2
    assert "share the file name(s) doc.txt" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main([*dedup, *a_files, "--output", str(tmp_path / "out")]) == 0
    assert main([*dedup, *a_files, "--output", str(tmp_path / "out")]) == 2  # its own earlier output: say so
    assert "already exists; choose another output path or pass --overwrite" in capsys.readouterr().err
    assert main([*dedup, *a_files, "--output", str(tmp_path / "out"), "--overwrite"]) == 0


def test_a_crawl_is_written_over_an_earlier_one_only_with_overwrite_and_leaves_no_stale_shard(tmp_path, capsys):
    """`curate crawl` into a folder holding a crawl is refused (the earlier one kept byte for byte); with
    --overwrite a crawl of fewer shards replaces it whole: an earlier shard left beside it would be read as this
    crawl's (the same seeded pages twice). Each shard is gzip'd JSON lines; the pages add up to --num-pages."""
    import gzip

    out = tmp_path / "crawl"
    argv = ["curate", "crawl", "--output", str(out), "--num-pages", "30"]
    assert main(argv + ["--shards", "3"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(argv + ["--shards", "2"]) == 2
    assert "holds a crawl already" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "crawl-9.jsonl.gz").write_bytes(b"a file of the user's")  # not a name the crawl writes: refused
    assert main(argv + ["--shards", "2", "--overwrite"]) == 2
    assert "crawl-9.jsonl.gz is not a crawl file" in capsys.readouterr().err
    assert (out / "crawl-9.jsonl.gz").read_bytes() == b"a file of the user's"
    (out / "crawl-9.jsonl.gz").unlink()
    assert main(argv + ["--shards", "2", "--overwrite"]) == 0
    shards = sorted(out.glob("crawl-*.jsonl.gz"))
    assert [p.name for p in shards] == ["crawl-00000.jsonl.gz", "crawl-00001.jsonl.gz"]
    ids = [json.loads(line)["id"] for p in shards for line in gzip.open(p, "rt")]
    assert sorted(ids) == [f"page-{i:06d}" for i in range(30)]


def test_a_rerun_removes_the_temporary_a_killed_run_left_of_its_output(tmp_path, tok_dir):
    """A SIGKILLed `tokenizer encode --output big.bin` left .big.bin.tmp-PID@HOST; a successful rerun kept it,
    though `cookmind` promises the next run removes such files. A temporary of another output is not ours to take."""
    import os
    import subprocess
    import sys

    from cookmind.atomic import temp_name

    text = tmp_path / "big.txt"
    text.write_text("the soup simmered in the garden\n" * 50)
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stale = temp_name(tmp_path / "big.bin").name.replace(f"-{os.getpid()}@", f"-{killed.pid}@")
    (tmp_path / stale).write_bytes(b"half of the ids")
    (tmp_path / stale.replace("big.bin", "other.bin")).write_bytes(b"another output's")
    killed.kill()
    killed.wait()
    argv = ["tokenizer", "encode", "--tokenizer", str(tok_dir), "--input", str(text), "--output"]
    assert main([*argv, str(tmp_path / "big.bin")]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["big.txt", "big.bin", stale.replace("big.bin", "other.bin")])


def test_crawl_refuses_a_folder_of_the_users_files_even_with_overwrite(tmp_path, capsys):
    """A manifest.json alone is no crawl: a folder holding the user's notes.txt and manifest.json is named for what
    it is (not "holds a crawl already") and kept byte for byte, with or without --overwrite."""
    out = tmp_path / "userdir"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "manifest.json").write_text('{"mine": true}')
    for extra in ([], ["--overwrite"]):
        assert main(["curate", "crawl", "--output", str(out), "--num-pages", "30", *extra]) == 2
        err = capsys.readouterr().err
        assert "not a crawl folder (notes.txt is not a crawl file)" in err and "holds a crawl" not in err
        assert len(err.strip().splitlines()) == 1
    assert {p.name: p.read_text() for p in out.iterdir()} == {"notes.txt": "mine", "manifest.json": '{"mine": true}'}


def test_crawl_overwrite_is_whole_or_nothing(tmp_path, monkeypatch):
    """--overwrite builds the new crawl in a temporary folder and renames it into place: a crash mid-way (here the
    third shard fails) leaves the earlier crawl byte for byte, with no new shard and no temporary file beside it."""
    import gzip

    import cookmind.synthetic.crawl as crawl

    out = tmp_path / "big"
    crawl.write_crawl(out, num_pages=40, seed=0, num_shards=4)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    opened, real_open = [], gzip.open

    def failing_open(*args, **kwargs):
        opened.append(args[0])
        if len(opened) == 3:
            raise OSError("killed")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(crawl.gzip, "open", failing_open)
    with pytest.raises(OSError, match="killed"):
        crawl.write_crawl(out, num_pages=40, seed=7, num_shards=4, replace=True)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]
    assert crawl.write_crawl(out, num_pages=40, seed=7, num_shards=2, replace=True)["seed"] == 7
    assert sorted(p.name for p in out.iterdir()) == ["crawl-00000.jsonl.gz", "crawl-00001.jsonl.gz", "manifest.json"]


def test_crawl_shows_its_progress_and_quiet_none(tmp_path, capsys):
    """curate crawl drew no bar (its --quiet said "crawl draws none"): 200,000 pages took a silent minute. It counts
    the pages made and the pages written now, as lines here (capsys's stderr is no terminal); --quiet shows none."""
    assert main(["curate", "crawl", "--output", str(tmp_path / "c"), "--num-pages", "40"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["num_pages"] == 40
    lines = err.splitlines()
    assert any(line.startswith("crawl: make pages: 100% 40/40") for line in lines), err
    assert lines[-1].startswith("crawl: write shards: 100% 40/40") and "page/s" in lines[-1] and "\r" not in err
    assert main(["curate", "crawl", "--output", str(tmp_path / "q"), "--num-pages", "40", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_every_progress_bar_goes_through_cookmind_progress():
    """curate, pack and train drew their bars through cookmind.progress (plain lines in a pipe or a log, a bar on a
    terminal sized 0 x 0), while eval, tokenizer train/encode and the pretokenizer still made raw tqdm bars: carriage
    returns and redraws into every log. No module but cookmind.progress makes a tqdm bar."""
    import re
    from pathlib import Path

    import cookmind

    root = Path(cookmind.__file__).parent
    raw = re.compile(r"^\s*(from tqdm(\.\w+)? import|import tqdm)", re.M)
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if raw.search(p.read_text(encoding="utf-8")))
    assert found == ["progress.py"], found


def test_a_bar_in_a_log_writes_at_most_one_line_every_line_seconds_whatever_refreshes_it(monkeypatch):
    """pack set its bar's postfix after every chunk of 256 documents, and each set_postfix_str refreshed the bar: in a
    pipe every refresh became a line (81 lines in under a second for 20,000 documents, thousands for a million),
    where the bar promises one every LINE_SECONDS. A refresh within LINE_SECONDS of the last line writes none; the
    first line and the last count (at close) are written."""
    import io

    from cookmind import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    bar = progress.progress_bar(total=1000, desc="pack", file=log)
    for i in range(1000):
        clock[0] = i * 0.05  # 50 s in all: a line at the start, one at 30 s, and the last
        bar.update(1)
        bar.set_postfix_str(f"{i} docs")  # refresh=True: tqdm's default
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and 2 <= len(lines) <= 3, lines
    assert lines[-1].startswith("pack: 100% 1000/1000"), lines
