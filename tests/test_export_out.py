"""Folders commands write (export/import --hf, tokenizer train/import/export, pack, eval --out) never go inside a
training run's checkpoints folder, where training prunes, deletes and picks "the newest checkpoint"."""

from __future__ import annotations

import shutil

import pytest
from lm_fixtures import CORPUS, tiny_lm

from cookmind.cli import main
from cookmind.model import save_model
from cookmind.model.model_io import latest_checkpoint


@pytest.fixture
def run(tmp_path, tok_dir):
    """runs/x: a run (config.yaml) with one checkpoint, step 10, holding its tokenizer."""
    step = tmp_path / "runs" / "x" / "checkpoints" / "step_00000010"
    save_model(step, tiny_lm(vocab_size=320, max_position_embeddings=64))  # tok_dir: 320 tokens
    for name in ("cookmind_tokenizer.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, step / name)
    (tmp_path / "runs" / "x" / "config.yaml").write_text("train: {}\n")
    return step


def _refused(argv, capsys, out, stage):
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind {stage}: error: ") and err.count("\n") == 1, err
    assert "checkpoints folder" in err and "checkpoint.keep_last" in err, err
    assert not out.exists(), out
    return err


def test_export_and_import_refuse_an_out_in_a_runs_checkpoints_folder_and_say_where_instead(run, capsys):
    """`export --hf runs/x runs/x/checkpoints/step_00000020` wrote an export that the next load took as the run's
    newest checkpoint, and one in step_N/sub or checkpoints/hf sat where keep_last pruning and train --overwrite
    delete. Each is refused in one line naming a folder beside the run instead."""
    runs, ckpts = run.parents[2], run.parent
    for out in (run / "sub", ckpts / "hf", ckpts / "step_00000020"):
        err = _refused(["export", "--hf", str(runs / "x"), str(out)], capsys, out, "export")
        assert f"e.g. {runs / ('x-' + out.name)}" in err, err
    assert latest_checkpoint(runs / "x") == run  # still the run's own step 10
    assert main(["export", "--hf", str(runs / "x"), str(runs / "x-hf")]) == 0  # beside the run: written
    capsys.readouterr()
    out = ckpts / "step_00000030"
    err = _refused(["import", "--hf", str(runs / "x-hf"), str(out)], capsys, out, "import")
    assert f"e.g. {runs / 'x-step_00000030'}" in err
    assert latest_checkpoint(runs / "x") == run


def test_tokenizer_pack_and_eval_outputs_in_a_runs_checkpoints_folder_are_refused(run, tmp_path, tok_dir, capsys):
    ckpts = run.parent
    before = (run / "tokenizer.json").read_bytes()
    tok_json = tmp_path / "tok.json"
    shutil.copy(tok_dir / "tokenizer.json", tok_json)
    (tmp_path / "c.txt").write_text(CORPUS)
    out = ckpts / "tok"
    argv = ["tokenizer", "import", "--tokenizer-json", str(tok_json), "--out", str(out)]
    _refused(argv, capsys, out, "tokenizer import")
    argv = ["tokenizer", "train", "--input", str(tmp_path / "c.txt"), "--vocab-size", "300", "--out", str(out)]
    _refused([*argv, "--quiet"], capsys, out, "tokenizer train")
    out = run / "hf"  # into the checkpoint itself: --overwrite replaced its tokenizer.json
    argv = ["tokenizer", "export", "--tokenizer", str(tok_dir), "--out", str(run), "--format", "hf", "--overwrite"]
    _refused(argv, capsys, out, "tokenizer export")
    assert (run / "tokenizer.json").read_bytes() == before
    out = ckpts / "data"
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / "c.txt")]
    _refused([*argv, "--out", str(out)], capsys, out, "pack")
    out = ckpts / "eval.jsonl"
    _refused(["eval", "ppl", str(run), "--data", str(tmp_path / "c.txt"), "--out", str(out)], capsys, out, "eval ppl")


def test_a_folder_named_checkpoints_that_is_no_runs_takes_an_export(tmp_path):
    """A user's own folder called checkpoints (no step_N folders, no run's config.yaml beside it) is no run's."""
    save_model(tmp_path / "m", tiny_lm(max_position_embeddings=64))
    assert main(["export", "--hf", str(tmp_path / "m"), str(tmp_path / "checkpoints" / "m-hf")]) == 0
    assert (tmp_path / "checkpoints" / "m-hf" / "model.safetensors").is_file()


def test_encode_and_curate_outputs_in_a_runs_checkpoints_folder_are_refused(run, tmp_path, tok_dir, capsys):
    # the kind left after the folder outputs: a file output (tokenizer encode --output) and curate run's --output
    # went into a checkpoint, where keep_last pruning then kept that checkpoint with a warning or deleted the output
    out = run / "ids.bin"
    argv = ["tokenizer", "encode", "--tokenizer", str(tok_dir), "--text", "hi", "--output", str(out)]
    _refused(argv, capsys, out, "tokenizer encode")
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.html").write_text("<html><body><p>A page about soup and bread.</p></body></html>")
    out = run.parent / "clean"
    argv = ["curate", "run", "--input", str(tmp_path / "web"), "--output", str(out), "--quiet"]
    _refused(argv, capsys, out, "curate run")


def test_a_users_folder_of_step_n_folders_is_no_runs_checkpoints_folder(tmp_path, capsys):
    """Any folder holding a step_N folder was taken for a checkpoints folder: an output beside the user's own
    step_1/ and step_2/ folders of notes (or in a folder called checkpoints/step_1 of them) was refused. A checkpoints
    folder is one whose step_N folders hold a checkpoint's files (meta.json, or config.json and weights)."""
    from cookmind.run_layout import checkpoints_folder_of

    exp = tmp_path / "exp"
    for name in ("step_1", "step_2"):
        (exp / name).mkdir(parents=True)
        (exp / name / "notes.txt").write_text("what I tried\n")
    (tmp_path / "checkpoints" / "step_1").mkdir(parents=True)  # a folder named checkpoints, no run beside it
    for out in (exp / "m-hf", exp / "step_3", exp / "step_1" / "m-hf", tmp_path / "checkpoints" / "step_1" / "hf"):
        assert checkpoints_folder_of(out) is None, out
    save_model(tmp_path / "m", tiny_lm(max_position_embeddings=64))
    assert main(["export", "--hf", str(tmp_path / "m"), str(exp / "m-hf")]) == 0
    # a checkpoint among them (a training save's meta.json, or a saved model) makes the folder a checkpoints folder
    (exp / "step_2" / "meta.json").write_text("{}")
    for out in (exp / "m2-hf", exp / "step_3", exp / "step_2" / "hf", exp / "step_1" / "hf"):
        assert checkpoints_folder_of(out) == exp, out
    (exp / "step_2" / "meta.json").unlink()
    save_model(exp / "step_2", tiny_lm(max_position_embeddings=64))
    assert checkpoints_folder_of(exp / "m2-hf") == exp
    _refused(["export", "--hf", str(tmp_path / "m"), str(exp / "m2-hf")], capsys, exp / "m2-hf", "export")


def test_export_and_import_to_an_out_under_a_file_say_the_file_is_no_folder(run, tmp_path, capsys):
    """`export --hf runs/x notes.txt/hf` said 'cookmind export: error: [Errno 17] File exists: 'notes.txt'' (the
    README promises "PATH: is a file, not a folder", as train, demo and eval say it)."""
    runs = run.parents[2]
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert main(["export", "--hf", str(runs / "x"), str(runs / "x-hf")]) == 0
    capsys.readouterr()
    for argv in (["export", "--hf", str(runs / "x")], ["import", "--hf", str(runs / "x-hf")]):
        assert main([*argv, str(notes / "out")]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"cookmind {argv[0]}: error: {notes / 'out'}: {notes} is a file, not a folder; choose another path or "
            "move it away\n"
        ), err
    assert notes.read_text() == "mine"


def test_export_and_import_refuse_an_out_inside_the_folder_they_read_or_holding_it(run, tmp_path, capsys):
    """`import --hf HF_DIR --out HF_DIR/sub` wrote a cookmind model inside the Hugging Face folder it read (and
    `export --hf CKPT CKPT/hf` an export inside the checkpoint). An output inside the folder read, or one holding
    it, is refused in one line before any work, naming both and a place beside the input instead."""
    runs = run.parents[2]
    hf = runs / "x-hf"
    assert main(["export", "--hf", str(runs / "x"), str(hf)]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in hf.iterdir())
    cases = [
        (["import", "--hf", str(hf), "--out", str(hf / "sub")], hf, hf / "sub", "inside", runs / "x-hf-import"),
        (["import", "--hf", str(hf), str(hf)], hf, hf, "the same folder as", runs / "x-hf-import"),
    ]
    for argv, src, out, how, instead in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err == (
            f"cookmind import: error: the output {out} is {how} {src}, the folder import --hf reads; "
            f"write it outside that folder, e.g. {instead}\n"
        ), err
    assert sorted(p.name for p in hf.iterdir()) == before
    ckpt = tmp_path / "model"  # a plain model folder (not a run's checkpoints folder)
    shutil.copytree(run, ckpt)
    assert main(["export", "--hf", str(ckpt), str(ckpt / "hf")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"cookmind export: error: the output {ckpt / 'hf'} is inside {ckpt}, the folder export --hf reads; "
        f"write it outside that folder, e.g. {tmp_path / 'model-hf'}\n"
    ), err
    assert not (ckpt / "hf").exists()
    # the input inside the output: --overwrite would replace the folder holding what it reads
    assert main(["import", "--hf", str(hf), str(runs), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"cookmind import: error: the output {runs} holds {hf}, the folder import --hf reads; "
        f"write it outside that folder, e.g. {runs / 'x-hf-import'}\n"
    ), err
    assert sorted(p.name for p in hf.iterdir()) == before


def test_import_of_a_lora_adapter_folder_says_it_is_an_adapter_and_how_to_serve_it(tmp_path, capsys):
    """`import --hf ADAPTER OUT` with a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) said
    "ADAPTER/config.json: missing; a Hugging Face model directory needs config.json", where generate and serve say it
    holds a LoRA adapter and how to serve it on its base."""
    import json

    adapter = tmp_path / "peft-baker"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "x-hf"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    assert main(["import", "--hf", str(adapter), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind import: error: {adapter} holds a LoRA adapter (adapter_config.json; trained on")
    assert f"--lora NAME={adapter}" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
