"""`cookmind eval --out`: never a file the command reads (the model's, the tokenizer's, the data)."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from lm_fixtures import CORPUS, tiny_lm

from cookmind.cli import main
from cookmind.model import save_model


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def run_with_data(tmp_path, tok_dir):
    """A run with one checkpoint (its tokenizer inside), a tokenizer folder of its own, and data for each task."""
    step = tmp_path / "runs" / "pre" / "checkpoints" / "step_00000010"
    save_model(step, tiny_lm(vocab_size=320, max_position_embeddings=256))
    for name in ("cookmind_tokenizer.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, step / name)
    shutil.copytree(tok_dir, tmp_path / "tok", ignore=shutil.ignore_patterns("corpus.txt"))
    (tmp_path / "t.txt").write_text(CORPUS[:400])
    (tmp_path / "g.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    (tmp_path / "mmlu" / "test").mkdir(parents=True)
    (tmp_path / "mmlu" / "test" / "virology_test.csv").write_text("Short?,a,b,c,d,A\n")
    return tmp_path, step


DATA = {"ppl": "t.txt", "gsm8k": "g.jsonl", "mmlu": "mmlu"}


@pytest.mark.parametrize("task", ["ppl", "gsm8k", "mmlu"])
def test_eval_out_naming_a_file_of_the_model_or_tokenizer_is_refused_even_with_overwrite(run_with_data, task, capsys):
    """`eval ppl runs/pre --out runs/pre/checkpoints/step_N/model.safetensors --overwrite` replaced the weights
    with the per-window JSONL: only --data was protected. Every file the command reads is refused, before the
    model loads, in one line, and left as it was."""
    root, step = run_with_data
    extra = ["--max-new-tokens", "2", "--template", "plain"] if task == "gsm8k" else []
    names = ("model.safetensors", "config.json", "tokenizer.json", "cookmind_tokenizer.json")
    targets = [step / name for name in names]
    targets += [step / "eval.jsonl"]  # not a file of the checkpoint yet, but inside the folder the model is read from
    for out in targets:
        before = {p: _digest(p) for p in step.iterdir()}
        argv = ["eval", task, str(root / "runs" / "pre"), "--data", str(root / DATA[task]), "--quiet"]
        assert main([*argv, *extra, "--out", str(out), "--overwrite"]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind eval {task}: error: --out {out} ") and err.count("\n") == 1, err
        assert str(step) in err and "choose an --out outside" in err, err
        assert f"e.g. {root / 'runs' / 'pre'}/" in err, err  # beside the checkpoints, in the run folder
        assert {p: _digest(p) for p in step.iterdir()} == before  # nothing written there, nothing replaced
    tok = root / "tok"  # --tokenizer's folder is read too
    before = _digest(tok / "tokenizer.json")
    argv = ["eval", task, str(step), "--tokenizer", str(tok), "--data", str(root / DATA[task]), "--quiet"]
    assert main([*argv, *extra, "--out", str(tok / "tokenizer.json"), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval {task}: error: --out {tok / 'tokenizer.json'} ") and str(tok) in err, err
    assert _digest(tok / "tokenizer.json") == before


def test_eval_out_inside_the_data_folder_is_refused_and_one_beside_the_checkpoints_is_written(run_with_data, capsys):
    """MMLU's --data is a folder the command reads every CSV of: an --out in it is refused. An --out elsewhere in
    the run folder (runs/pre/eval.jsonl) is written as before."""
    root, step = run_with_data
    csv = root / "mmlu" / "test" / "virology_test.csv"
    argv = ["eval", "mmlu", str(step), "--data", str(root / "mmlu"), "--quiet", "--overwrite", "--out"]
    assert main([*argv, str(csv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval mmlu: error: --out {csv} ") and err.count("\n") == 1, err
    assert csv.read_text() == "Short?,a,b,c,d,A\n"
    out = root / "runs" / "pre" / "eval.jsonl"
    argv = ["eval", "ppl", str(root / "runs" / "pre"), "--data", str(root / "t.txt"), "--quiet", "--out", str(out)]
    assert main(argv) == 0
    rows = out.read_text().splitlines()  # 400 bytes are fewer than 256 tokens: one window, one row
    assert len(rows) == 1 and (root / "runs" / "pre" / "eval.metrics.json").is_file()


@pytest.mark.parametrize("name", ["report.md", "config.yaml", "metrics.jsonl", "loss.png"])
def test_eval_out_naming_a_training_runs_own_file_is_refused_even_with_overwrite(run_with_data, name, capsys):
    """`eval ppl runs/pre --out runs/pre/report.md --overwrite` replaced the run's report (config.yaml: what
    `--resume auto` reads) with per-window JSON lines. A run's own files are refused, in one line; a file of that
    name in a folder that is no run's is replaced with --overwrite as before."""
    root, _ = run_with_data
    run = root / "runs" / "pre"
    (run / "config.yaml").write_text("train: {objective: pretrain}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    (run / "report.md").write_text("# pre\n")
    (run / "loss.png").write_bytes(b"png")
    before = {p.name: _digest(p) for p in run.iterdir() if p.is_file()}
    argv = ["eval", "ppl", str(run), "--data", str(root / "t.txt"), "--quiet", "--overwrite", "--out"]
    assert main([*argv, str(run / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval ppl: error: --out {run / name} is the training run's own {name}"), err
    assert err.count("\n") == 1 and f"e.g. {run / 'eval.jsonl'}" in err, err
    assert {p.name: _digest(p) for p in run.iterdir() if p.is_file()} == before
    mine = root / "notes"
    mine.mkdir()
    (mine / name).write_text("old")
    assert main([*argv, str(mine / name)]) == 0
    assert (mine / name).read_text().startswith('{"window": 0')


def test_eval_out_in_a_sharded_lora_checkpoints_base_model_folder_is_refused(tmp_path, capsys):
    """A sharded LoRA checkpoint holds the adapter only: eval reads its base (train.init_from in its meta.json, here
    a Hugging Face folder outside any run) too, so `--out BASE/model.safetensors --overwrite` replaced the base's
    weights. The checkpoint is laid out by hand as a LoRA run saves it (meta.json's config, dcp/.metadata)."""
    import json

    from cookmind.model.hf import export_hf

    save_model(tmp_path / "init", tiny_lm())
    export_hf(tmp_path / "init", tmp_path / "init_hf")
    step = tmp_path / "lora" / "checkpoints" / "step_00000001"
    (step / "dcp").mkdir(parents=True)
    (step / "dcp" / ".metadata").write_bytes(b"")
    (step / "config.json").write_text((tmp_path / "init" / "config.json").read_text())
    config = {"train": {"init_from": str(tmp_path / "init_hf")}, "lora": {"enabled": True, "r": 4, "alpha": 8.0}}
    (step / "meta.json").write_text(json.dumps({"step": 1, "config": config}))
    weights = tmp_path / "init_hf" / "model.safetensors"
    before = _digest(weights)
    (tmp_path / "t.txt").write_text(CORPUS[:200])
    argv = ["eval", "ppl", str(step), "--data", str(tmp_path / "t.txt"), "--quiet", "--overwrite"]
    assert main([*argv, "--out", str(weights)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval ppl: error: --out {weights} is in {tmp_path / 'init_hf'}, "), err
    assert "train.init_from" in err and _digest(weights) == before


def test_eval_gsm8k_chat_template_out_on_a_hugging_face_folder_records_the_prompt_text(run_with_data, capsys):
    """`eval gsm8k HF_FOLDER --template chat --out F` stopped after the generation with a traceback ("Object of type
    BatchEncoding is not JSON serializable"): transformers 5's apply_chat_template returns ids by default, and the
    record's prompt was that object. The record holds the ChatML text, as it does for a cookmind checkpoint."""
    import json

    from cookmind.model.hf import export_hf

    root, step = run_with_data
    export_hf(step, root / "hf")
    out = root / "g-hf.jsonl"
    argv = ["eval", "gsm8k", str(root / "hf"), "--data", str(root / "g.jsonl"), "--template", "chat", "--quiet"]
    assert main([*argv, "--max-new-tokens", "2", "--device", "cpu", "--out", str(out)]) == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    assert record["prompt"] == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("task", ["ppl", "gsm8k", "mmlu"])
def test_eval_out_under_a_file_is_refused_before_the_evaluation(run_with_data, task, monkeypatch, capsys):
    """`eval gsm8k --out notes.txt/x.jsonl` evaluated every problem and then stopped: 'notes.txt: is a file, not a
    folder'. The --out path is checked with the others, before the model loads."""
    import cookmind.infer.loading as loading

    root, step = run_with_data
    (root / "notes.txt").write_text("mine")
    monkeypatch.setattr(loading, "load_model_dir", lambda *a, **k: pytest.fail("the model loaded"))
    extra = ["--max-new-tokens", "2", "--template", "plain"] if task == "gsm8k" else []
    out = root / "notes.txt" / "x.jsonl"
    argv = ["eval", task, str(step), "--data", str(root / DATA[task]), "--quiet", "--out", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err == f"cookmind eval {task}: error: --out {out}: {root / 'notes.txt'} is a file, not a folder; choose "
        "another path or move it away\n"
    ), err
    assert (root / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("task", ["ppl", "gsm8k", "mmlu"])
def test_eval_metrics_name_the_checkpoint_a_run_resolved_to_and_the_tokenizer_given(run_with_data, task, capsys):
    """`eval TASK runs/pre` scored the run's newest checkpoint but its metrics said only "model": "runs/pre": once the
    run trained on, nothing told which weights a metrics file measured; --tokenizer, which changes every score, went
    unrecorded too. The metrics name the checkpoint the run resolved to and the tokenizer given."""
    import json

    root, step = run_with_data
    newer = step.parent / "step_00000020"
    shutil.copytree(step, newer)
    out = root / f"{task}.jsonl"
    argv = ["eval", task, str(root / "runs" / "pre"), "--data", str(root / DATA[task]), "--quiet", "--device", "cpu"]
    argv += ["--tokenizer", str(root / "tok"), "--out", str(out)]
    argv += ["--max-new-tokens", "2", "--template", "chat"] if task == "gsm8k" else []
    assert main(argv) == 0, capsys.readouterr().err
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert metrics["model"] == str(root / "runs" / "pre")
    assert metrics["checkpoint"] == str(newer) and metrics["tokenizer"] == str(root / "tok")
    assert json.loads(capsys.readouterr().out) == metrics
