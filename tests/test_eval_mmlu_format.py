"""`cookmind eval mmlu --scoring generate` counts the answers that name no letter, as GSM8K's format_rate does."""

from __future__ import annotations

import json

import pytest
from test_align_fixtures import CharTok, OracleLM

pytestmark = pytest.mark.usefixtures("one_thread")

ANSWERS = {  # question -> what the model says; the letter each names, by hand
    "Q1?": " The answer is B",  # B: right
    "Q2?": " I am not sure",  # none
    "Q3?": " C",  # C: wrong (A)
    "Q4?": " hmm, hard",  # none
}


def _respond(prompt):
    return next(said for q, said in ANSWERS.items() if q in prompt)


def test_mmlu_generate_counts_answers_with_no_readable_letter_in_json_stderr_and_out(tmp_path, monkeypatch, capsys):
    """Two of four answers named no letter: they were graded wrong, with nothing to tell them from wrong letters
    (GSM8K reports format_rate). The metrics say 2 (num_no_letter) and a format_rate of 2/4, the --out records say
    which, and a line on stderr says so."""
    import cookmind.infer.loading
    from cookmind.cli import main

    monkeypatch.setattr(
        cookmind.infer.loading, "load_for_inference", lambda *a, **k: (OracleLM(_respond, "Answer:"), CharTok())
    )
    (tmp_path / "mmlu" / "test").mkdir(parents=True)
    rows = [f"{q},xx,zz,qq,ww,{'B' if q == 'Q1?' else 'A'}" for q in ANSWERS]
    (tmp_path / "mmlu" / "test" / "toy_test.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "mmlu.jsonl"
    argv = ["eval", "mmlu", "m", "--data", str(tmp_path / "mmlu"), "--scoring", "generate", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert metrics["num_questions"] == 4 and metrics["micro_accuracy"] == 0.25
    assert metrics["num_no_letter"] == 2 and metrics["format_rate"] == 0.5
    assert json.loads(out.with_suffix(".metrics.json").read_text())["num_no_letter"] == 2
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["predicted"] for r in records] == ["B", None, "C", None]
    assert [r["no_letter"] for r in records] == [False, True, False, True]
    assert "2 of 4 answers named no letter" in captured.err and "(num_no_letter)" in captured.err, captured.err
    # letter scoring always picks a letter: no such count to report
    assert main(["eval", "mmlu", "m", "--data", str(tmp_path / "mmlu"), "--quiet"]) == 0
    assert "num_no_letter" not in json.loads(capsys.readouterr().out)


def test_mmlu_says_which_subject_files_held_no_question(tmp_path, monkeypatch, capsys):
    """A subject whose CSV is empty (a download cut short) was left out of the per-subject scores and the macro
    average without a word: two subjects asked for, one scored, nothing said why. The metrics now list it as
    subjects_empty and a line on stderr names it."""
    import cookmind.infer.loading
    from cookmind.cli import main

    monkeypatch.setattr(
        cookmind.infer.loading, "load_for_inference", lambda *a, **k: (OracleLM(_respond, "Answer:"), CharTok())
    )
    (tmp_path / "mmlu" / "test").mkdir(parents=True)
    (tmp_path / "mmlu" / "test" / "toy_test.csv").write_text("Q1?,xx,zz,qq,ww,B\n")
    (tmp_path / "mmlu" / "test" / "cut_test.csv").write_text("")
    assert main(["eval", "mmlu", "m", "--data", str(tmp_path / "mmlu"), "--scoring", "generate", "--quiet"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert metrics["per_subject"] == {"toy": 1.0} and metrics["subjects_empty"] == ["cut"]
    assert "1 subject file(s) held no question (cut)" in captured.err, captured.err


def test_mmlu_generate_answers_run_to_max_new_tokens_and_the_metrics_say_it(tmp_path, monkeypatch, capsys):
    """`--scoring generate` cut every answer at 16 tokens with no flag to raise it: a model that reasons before its
    letter was graded as naming none. --max-new-tokens sets the cap (default 16), and the metrics record it."""
    import cookmind.infer.loading
    from cookmind.cli import main

    said = " Let me think this through with care. The answer is B"  # 53 characters (CharTok: a token each)
    monkeypatch.setattr(
        cookmind.infer.loading, "load_for_inference", lambda *a, **k: (OracleLM(lambda p: said, "Answer:"), CharTok())
    )
    (tmp_path / "mmlu" / "test").mkdir(parents=True)
    (tmp_path / "mmlu" / "test" / "toy_test.csv").write_text("Q1?,xx,zz,qq,ww,B\n")
    argv = ["eval", "mmlu", "m", "--data", str(tmp_path / "mmlu"), "--scoring", "generate", "--quiet"]
    assert main(argv) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["max_new_tokens"] == 16 and metrics["num_no_letter"] == 1  # " Let me think thi": no letter
    assert main([*argv, "--max-new-tokens", "64"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["max_new_tokens"] == 64 and metrics["micro_accuracy"] == 1.0 and metrics["num_no_letter"] == 0
    # letter scoring generates nothing: the flag is refused, not ignored
    assert main([*argv[:5], "--quiet", "--max-new-tokens", "64"]) != 0
    assert "--max-new-tokens is used only with --scoring generate" in capsys.readouterr().err
