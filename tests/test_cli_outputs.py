"""Commands that write one file (`eval --out`, `tokenizer encode --output`, `curate train-classifier --output`)
never destroy an input and replace an existing file only with --overwrite; the refusal comes before any work."""

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
