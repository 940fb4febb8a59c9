"""A single input file given as a pipe (`--config <(cookmind curate default-config)`, a FIFO, /dev/stdin) is read,
not refused as "no such file": it exists and is no folder, only not a regular file. Inputs a command reads more than
once, or names its documents by (pack's and curate's --input), are refused as pipes, saying so."""

from __future__ import annotations

import contextlib
import json
import os
import threading

import numpy as np
import pytest

from cookmind.cli import main


@contextlib.contextmanager
def fifo_with(path, data: bytes):
    """A FIFO at ``path`` that a thread writes ``data`` into once a reader opens it."""
    os.mkfifo(path)

    def write():
        try:
            with open(path, "wb") as f:
                f.write(data)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield str(path)
    finally:
        if writer.is_alive():  # nobody read it (the command refused it): let the writer through
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(5)


def test_curate_run_reads_its_config_from_a_pipe(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "Soup of the day."}) + "\n")
    with fifo_with(tmp_path / "cfg", b"stages: [extract]\noutput_format: jsonl\n") as cfg:
        argv = ["curate", "run", "--config", cfg, "--input", str(src), "--output", str(tmp_path / "o"), "--quiet"]
        assert main(argv) == 0
    assert [json.loads(line)["text"] for line in open(tmp_path / "o" / "shard-00000.jsonl")] == ["Soup of the day."]


def test_train_reads_its_config_from_a_pipe(tmp_path):
    from cookmind.train.config import TrainConfig

    with fifo_with(tmp_path / "cfg", b"train: {max_steps: 7}\n") as cfg:
        assert TrainConfig.load(cfg).train.max_steps == 7  # was "config preset '.../cfg' not found"


def test_tokenizer_encode_reads_its_input_from_a_pipe(tmp_path, tok_dir):
    from cookmind.tokenizer import Tokenizer

    text = "the soup simmered in the garden\n" * 3
    out = tmp_path / "o.bin"
    with fifo_with(tmp_path / "text", text.encode()) as src:
        assert main(["tokenizer", "encode", "--tokenizer", str(tok_dir), "--input", src, "--output", str(out)]) == 0
    assert Tokenizer.load(tok_dir).decode(np.fromfile(out, dtype="<u4").tolist()) == text


@pytest.mark.parametrize("command", ["pack", "curate"])
def test_pack_and_curate_name_a_pipe_input_as_a_pipe_not_a_missing_file(tmp_path, tok_dir, capsys, command):
    fifo = tmp_path / "in.txt"
    os.mkfifo(fifo)
    argv = {
        "pack": ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(fifo)],
        "curate": ["curate", "run", "--input", str(fifo)],
    }[command] + ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "in.txt is a pipe" in err and "does not exist" not in err and len(err.strip().splitlines()) == 1


def test_eval_gsm8k_reads_its_problems_from_a_pipe(tmp_path):
    # `cookmind eval gsm8k --data <(zcat test.jsonl.gz)` was "GSM8K file /dev/fd/63 not found" (Path.is_file)
    from cookmind.evals.gsm8k import load_gsm8k

    rows = [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}, {"question": "1+1?", "answer": "#### 2"}]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with fifo_with(tmp_path / "gsm8k.fifo", data) as path:
        problems = load_gsm8k(path)
    assert [p["question"] for p in problems] == ["What is 2 + 3?", "1+1?"]
