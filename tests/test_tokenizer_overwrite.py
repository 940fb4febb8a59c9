"""`cookmind tokenizer train|import|export|encode` never replace what they did not make (#17.3) or read."""

from __future__ import annotations

import json

from tokenizer_fixtures import run_cli, save_tokenizer

from cookmind import cli
from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

TEXT = "the cook stirs the soup and the cat sits on the mat. " * 40


def _gpt2_files(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    vocab, merges = train_bpe(corpus, 290, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    src = tmp_path / "gpt2"
    src.mkdir()
    saved = save_tokenizer(Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS), tmp_path / "saved")
    assert run_cli(["export", "--tokenizer", str(saved), "--out", str(src), "--format", "gpt2"]) == 0
    return corpus, src


def test_train_refuses_an_existing_tokenizer_without_overwrite(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "tok"
    assert run_cli(["train", "--input", str(corpus), "--vocab-size", "300", "--out", str(out), "--workers", "1"]) == 0
    before = (out / "tokenizer.json").read_bytes()
    assert run_cli(["train", "--input", str(corpus), "--vocab-size", "280", "--out", str(out), "--workers", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "tokenizer.json").read_bytes() == before
    # a folder holding only an HF tokenizer.json (not ours): refused even with --overwrite
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "tokenizer.json").write_text("{}")
    assert (
        run_cli(
            ["train", "--input", str(corpus), "--vocab-size", "280", "--out", str(hf), "--overwrite", "--workers", "1"]
        )
        == 2
    )
    assert (hf / "tokenizer.json").read_text() == "{}"
    assert (
        run_cli(
            ["train", "--input", str(corpus), "--vocab-size", "280", "--out", str(out), "--overwrite", "--workers", "1"]
        )
        == 0
    )
    assert Tokenizer.load(out).vocab_size == 280


def test_import_refuses_to_overwrite_and_never_replaces_its_own_input(tmp_path, capsys):
    _, src = _gpt2_files(tmp_path)
    argv = ["import", "--vocab", str(src / "vocab.json"), "--merges", str(src / "merges.txt")]
    out = tmp_path / "imported"
    assert run_cli([*argv, "--out", str(out)]) == 0
    stamp = (out / "cookmind_tokenizer.json").stat().st_mtime_ns
    assert run_cli([*argv, "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "cookmind_tokenizer.json").stat().st_mtime_ns == stamp
    assert run_cli([*argv, "--out", str(out), "--overwrite"]) == 0
    assert run_cli([*argv, "--out", str(src), "--overwrite"]) == 2  # the input's own folder
    assert sorted(p.name for p in src.iterdir()) == ["merges.txt", "vocab.json"]
    assert json.loads((out / "cookmind_tokenizer.json").read_text())["merges"]


def test_export_refuses_to_replace_files_without_overwrite(tmp_path, capsys):
    byte_tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    tok_dir = save_tokenizer(byte_tok, tmp_path / "saved")
    out = tmp_path / "model"
    out.mkdir()
    (out / "tokenizer.json").write_text("user's")
    assert run_cli(["export", "--tokenizer", str(tok_dir), "--out", str(out)]) == 2
    assert "tokenizer.json" in capsys.readouterr().err and (out / "tokenizer.json").read_text() == "user's"
    assert run_cli(["export", "--tokenizer", str(tok_dir), "--out", str(out), "--overwrite"]) == 0
    assert (out / "tokenizer.json").read_text() != "user's"


def test_overwrite_names_a_users_file_in_a_tokenizer_folder_and_is_offered_only_where_it_works(tmp_path, capsys):
    """A tokenizer folder the user added a file to is refused naming it; `--out afile` said "pass --overwrite",
    which then refused too: the first refusal now offers --overwrite only where it would work."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    argv = ["train", "--input", str(corpus), "--vocab-size", "280", "--workers", "1", "--out"]
    out = tmp_path / "tok"
    assert run_cli([*argv, str(out)]) == 0
    (out / "NOTES.md").write_text("mine")
    capsys.readouterr()  # the first run's progress lines (a log keeps them)
    assert run_cli([*argv, str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds NOTES.md, which a tokenizer folder never has" in err and err.count("\n") == 1
    assert (out / "NOTES.md").read_text() == "mine"
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert run_cli([*argv, str(afile)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a tokenizer folder" in err and "pass --overwrite" not in err
    assert afile.read_text() == "mine"


def test_encode_never_writes_over_the_tokenizer_it_reads(tmp_path, capsys):
    """`tokenizer encode --output TOK/cookmind_tokenizer.json --overwrite` wrote the ids over the tokenizer it was
    encoding with (every later use: 'not valid JSON'): the tokenizer's files are inputs, as --input is."""
    tok_dir = save_tokenizer(Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS), tmp_path / "t")
    before = {p.name: p.read_bytes() for p in tok_dir.iterdir()}
    argv = ["tokenizer", "encode", "--tokenizer", str(tok_dir), "--text", "hi", "--output"]
    for name in before:
        assert cli.main([*argv, str(tok_dir / name), "--overwrite"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("cookmind tokenizer encode: error:") and "is also the input" in err, err
        assert err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in tok_dir.iterdir()} == before
    # a new file is no tokenizer file: written ("hi" is bytes 104 105 to a byte-level tokenizer)
    assert cli.main([*argv, str(tmp_path / "ids.txt")]) == 0
    assert (tmp_path / "ids.txt").read_text() == "104 105\n"


def test_export_never_replaces_the_files_its_tokenizer_was_read_from(tmp_path, capsys):
    """`tokenizer export --tokenizer HF --out HF --format hf --overwrite` replaced a Hugging Face folder's own
    tokenizer.json and tokenizer_config.json (its chat template, its added tokens' settings) with our rewrite."""
    _, src = _gpt2_files(tmp_path)  # a GPT-2 folder: vocab.json + merges.txt, read by `--tokenizer src`
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    assert run_cli(["export", "--tokenizer", str(src), "--out", str(src), "--format", "gpt2", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "vocab.json" in err and err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    # files the tokenizer was not read from may go beside it
    assert run_cli(["export", "--tokenizer", str(src), "--out", str(src), "--format", "hf"]) == 0
    assert sorted(p.name for p in src.iterdir()) == sorted([*before, "tokenizer.json", "tokenizer_config.json"])
    hf_before = (src / "tokenizer.json").read_bytes()
    # now `--tokenizer src` reads tokenizer.json (before vocab.json, as transformers): that one is refused
    assert run_cli(["export", "--tokenizer", str(src), "--out", str(src), "--format", "hf", "--overwrite"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err
    assert (src / "tokenizer.json").read_bytes() == hf_before
