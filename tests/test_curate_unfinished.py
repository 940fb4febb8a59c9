"""A curate output folder whose run stopped before its end (Ctrl-C, a crash) holds some of its shards and no report:
every command that reads such a folder (pack, tokenizer train, eval ppl, curate run itself) refuses it, saying how
many shards are there and how to finish the run, instead of reading part of the corpus without a word."""

from __future__ import annotations

import gzip
import json

import pytest

from cookmind.cli import main as cli_main
from cookmind.curate import runner as curate_runner

EXTRACT_ONLY = "stages:\n- extract: {}\n"  # one pass, no models: the final shards are written shard by shard


def _inputs(tmp_path):
    """Two JSON lines files (two shards), 3 and 2 documents."""
    for name, docs in (("a.jsonl", ["one cat", "two cats", "three cats"]), ("b.jsonl", ["four dogs", "five dogs"])):
        if not (tmp_path / name).exists():
            (tmp_path / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "c.yaml").write_text(EXTRACT_ONLY)
    return ["--config", str(tmp_path / "c.yaml"), "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]


def _interrupted_run(tmp_path, monkeypatch, capsys):
    """A curate run stopped by Ctrl-C while it wrote its second (last) output shard."""
    out = tmp_path / "cur"
    real = curate_runner.write_shard

    def write_shard(docs, path, fmt):
        if str(path) == str(out / "shard-00001.jsonl.gz"):
            raise KeyboardInterrupt
        return real(docs, path, fmt)

    monkeypatch.setattr(curate_runner, "write_shard", write_shard)
    assert cli_main(["curate", "run", *_inputs(tmp_path), "--output", str(out), "--quiet"]) == 130
    monkeypatch.setattr(curate_runner, "write_shard", real)
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.jsonl.gz"]  # the first shard only
    assert not (out / "report.json").exists()
    capsys.readouterr()
    return out


def _pack(tok_dir, folder):
    return ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(folder)]


def _one_line_refusal(capsys, stage, out):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"cookmind {stage}: error: "), err
    assert str(out) in err and "unfinished" in err and "1 of its 2 shards" in err, err
    assert "cookmind curate run" in err  # what to do: finish the run
    return err


@pytest.mark.parametrize("reader", ["pack", "tokenizer train", "curate run"])
def test_a_curate_output_whose_run_did_not_finish_is_refused_not_read_in_part(
    tmp_path, tok_dir, monkeypatch, capsys, reader
):
    out = _interrupted_run(tmp_path, monkeypatch, capsys)
    argv = {
        "pack": [*_pack(tok_dir, out), "--out", str(tmp_path / "s")],
        "tokenizer train": ["tokenizer", "train", "--input", str(out), "--vocab-size", "300"]
        + ["--out", str(tmp_path / "t")],
        "curate run": ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", str(out)]
        + ["--output", str(tmp_path / "c2")],
    }[reader]
    assert cli_main([*argv, "--quiet"]) == 2
    _one_line_refusal(capsys, reader, out)
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists() and not (tmp_path / "c2").exists()


def test_eval_ppl_data_of_an_unfinished_curate_output_is_refused(tmp_path, tok_dir, monkeypatch, capsys):
    from cookmind.evals.perplexity import evaluate_data
    from cookmind.tokenizer import Tokenizer

    out = _interrupted_run(tmp_path, monkeypatch, capsys)
    with pytest.raises(ValueError, match=r"unfinished .*1 of its 2 shards"):
        evaluate_data(None, Tokenizer.load(tok_dir), out)  # refused before the model is used


def test_once_the_run_is_finished_every_shard_is_read(tmp_path, tok_dir, monkeypatch, capsys):
    out = _interrupted_run(tmp_path, monkeypatch, capsys)
    assert cli_main(["curate", "run", *_inputs(tmp_path), "--output", str(out), "--quiet"]) == 0  # the same run
    docs = [json.loads(line) for p in sorted(out.glob("shard-*")) for line in gzip.open(p, "rt")]
    assert [d["text"] for d in docs] == ["one cat", "two cats", "three cats", "four dogs", "five dogs"]
    argv = [*_pack(tok_dir, out), "--out", str(tmp_path / "s")]
    assert cli_main([*argv, "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["num_records"] == 5


def test_a_finished_run_whose_lists_of_removed_documents_were_deleted_is_still_read(tmp_path, tok_dir, capsys):
    import shutil

    out = tmp_path / "cur"
    assert cli_main(["curate", "run", *_inputs(tmp_path), "--output", str(out), "--removed", "--quiet"]) == 0
    assert (out / "removed").is_dir()
    shutil.rmtree(out / "removed")  # looked at, then deleted to save room: the run had finished
    assert cli_main([*_pack(tok_dir, out), "--out", str(tmp_path / "s"), "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["num_records"] == 5


@pytest.mark.parametrize("reader", ["pack", "curate run"])
def test_a_run_stopped_before_its_first_shard_is_called_unfinished_too(tmp_path, tok_dir, monkeypatch, capsys, reader):
    # with no shard written, pack said the folder "holds no shard-* files ... name the input files instead"
    out = tmp_path / "cur"

    def write_shard(docs, path, fmt):
        raise KeyboardInterrupt

    monkeypatch.setattr(curate_runner, "write_shard", write_shard)
    assert cli_main(["curate", "run", *_inputs(tmp_path), "--output", str(out), "--quiet"]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    argv = {
        "pack": [*_pack(tok_dir, out), "--out", str(tmp_path / "s")],
        "curate run": ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", str(out)]
        + ["--output", str(tmp_path / "c2")],
    }[reader]
    assert cli_main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unfinished" in err and "0 of its 2 shards" in err and err.count("\n") == 1, err
