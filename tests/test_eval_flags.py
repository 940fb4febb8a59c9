"""`cookmind eval`: flags that cannot work together are refused before the model loads, naming them."""

from __future__ import annotations

import json

import pytest
from lm_fixtures import tiny_lm

from cookmind.cli import main
from cookmind.model import save_model


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading the model fails the test: every refusal here must come first."""
    import cookmind.infer.loading

    def load(*a, **k):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", load)


def _error(argv, capsys):
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_ppl_stride_longer_than_the_window_is_refused_before_the_model_loads(tmp_path, no_model_load, capsys):
    """`eval ppl --stride 300 --window 256` said 'perplexity: stride 300 must be in 1..window (256)' once the model
    had loaded, naming neither flag nor what to change. Without --window the window is the model's context, read
    from its config.json (128 here): a --stride or --window beyond it is refused the same way."""
    model = tmp_path / "m"
    save_model(model, tiny_lm(max_position_embeddings=128))
    (tmp_path / "t.txt").write_text("some text to score " * 20)
    argv = ["eval", "ppl", str(model), "--data", str(tmp_path / "t.txt"), "--quiet"]
    err = _error([*argv, "--window", "100", "--stride", "120"], capsys)
    assert err.startswith("cookmind eval ppl: error: --stride 120 is longer than --window 100"), err
    assert "give --stride 100 or less, or --window 120 or more" in err, err
    err = _error([*argv, "--stride", "200"], capsys)  # the window defaults to the context, 128 tokens
    assert err.startswith("cookmind eval ppl: error: --stride 200 is longer than the window, 128 tokens"), err
    assert "give --stride 128 or less" in err and "--window 200 or more" not in err, err  # 200 > the context
    err = _error([*argv, "--window", "200"], capsys)
    assert err.startswith("cookmind eval ppl: error: --window 200 exceeds the model's context of 128 tokens"), err
    assert "--window 128 or less" in err, err


def test_gsm8k_sampling_and_template_flags_are_refused_before_the_model_loads(tmp_path, no_model_load, capsys):
    """--num-samples > 1 at temperature 0, a --k beyond --num-samples and a --template with no {question} were each
    refused only after the model had loaded (a model folder that does not exist was named first)."""
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    argv = ["eval", "gsm8k", str(tmp_path / "no-model"), "--data", str(data), "--quiet"]
    err = _error([*argv, "--num-samples", "2"], capsys)
    assert err.startswith("cookmind eval gsm8k: error: --num-samples 2 with greedy decoding (--temperature 0)"), err
    err = _error([*argv, "--num-samples", "2", "--temperature", "0.7", "--k", "1", "4"], capsys)
    assert err.startswith("cookmind eval gsm8k: error: --k 4: pass@4 needs 1..2 samples"), err
    err = _error([*argv, "--template", "Q: no placeholder"], capsys)
    assert err.startswith("cookmind eval gsm8k: error: --template 'Q: no placeholder' is neither one of"), err


@pytest.mark.parametrize("with_model_flag", [True, False])
def test_a_second_data_file_is_not_taken_for_the_model(tmp_path, capsys, no_model_load, with_model_flag):
    """`eval ppl --model runs/x --data a.txt b.txt` (pack and tokenizer train take several inputs) said "two models
    given ('runs/x' with --model and 'b.txt' as an argument)": the second file had become the positional model.
    Without --model, b.txt was taken for the model. The error now says --data takes one file and what to do."""
    model = tmp_path / "model"
    model.mkdir()
    files = []
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("Some held-out text.\n")
        files.append(str(tmp_path / name))
    argv = ["eval", "ppl", *(["--model", str(model)] if with_model_flag else []), "--data", *files]
    with pytest.raises(SystemExit) as exc:  # argparse's usage error, before anything loads
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "b.txt" in err and "is a file, not a model" in err and "two models" not in err
    assert "one" in err and "cookmind pack" in err  # the way to evaluate several files


def test_gsm8k_template_typed_with_backslash_n_puts_a_new_line_in_the_prompt(tmp_path, monkeypatch, capsys):
    """`--template 'Question: {question}\nAnswer:'` (lm-eval-harness's GSM8K prompt, as typed in a shell, where
    quotes keep the backslash) put a backslash and an 'n' into every prompt, one line where two were meant, and the
    model was scored on a prompt nobody wrote. The template's \\n and \\t are now a new line and a tab (\\\\ a
    backslash), in the prompt and in the metrics' template."""
    from test_align_fixtures import CharTok, OracleLM

    import cookmind.infer.loading

    model = OracleLM(lambda prompt: " 2", "Answer:")
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    out = tmp_path / "g_out.jsonl"
    typed = r"Question: {question}\nAnswer:\t(C:\\x)"  # what the shell hands over from '...\n...\t...\\...'
    argv = ["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--template", typed, "--out", str(out)]
    assert main(argv) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["template"] == "Question: {question}\nAnswer:\t(C:\\x)"
    assert json.loads(out.read_text())["prompt"] == "Question: 1+1?\nAnswer:\t(C:\\x)"


def test_gsm8k_chat_template_on_a_tokenizer_without_chatml_names_the_templates_that_work(monkeypatch, tmp_path, capsys):
    """`eval gsm8k --template chat` with a model whose tokenizer has no <|im_start|>/<|im_end|> (GPT-2's, imported)
    was refused with the tokenizer's own hint for other commands ("generate without --chat, pack --train-type
    seq"), not a word of eval's --template; a Hugging Face tokenizer without a chat template is told the templates
    that work. This one is too."""
    from test_align_fixtures import OracleLM

    import cookmind.infer.loading
    from cookmind.tokenizer import Tokenizer

    vocab = {i: bytes([i]) for i in range(256)} | {256: b"<|endoftext|>"}
    tok = Tokenizer(vocab, [], ["<|endoftext|>"])
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (OracleLM(lambda p: " 2"), tok))
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    err = _error(["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--template", "chat"], capsys)
    assert err.startswith("cookmind eval gsm8k: error: --template chat renders chats in ChatML"), err
    assert "use --template r1_zero, compact or plain" in err and "generate without --chat" not in err, err


def test_gsm8k_metrics_record_the_batch_size_that_with_the_seed_decides_the_samples(tmp_path, monkeypatch, capsys):
    """Sampled answers follow --seed and --batch-size together (each batch draws from its own generator), and the
    metrics recorded the seed but not the batch size: a metrics file could not say how to sample its answers
    again. It records batch_size and num_samples beside seed and temperature."""
    from test_align_fixtures import CharTok, OracleLM

    import cookmind.infer.loading

    model = OracleLM(lambda prompt: " 2", "Answer:")
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    argv = ["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--template", "plain", "--batch-size", "3"]
    assert main([*argv, "--num-samples", "2", "--temperature", "0.5", "--seed", "7"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert {k: metrics[k] for k in ("seed", "batch_size", "num_samples", "temperature")} == {
        "seed": 7,
        "batch_size": 3,
        "num_samples": 2,
        "temperature": 0.5,
    }
