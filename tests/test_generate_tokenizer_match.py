"""generate/chat/serve/eval refuse a --tokenizer other than the one the checkpoint carries (issue #17.9)."""

from __future__ import annotations

import shutil

import pytest
import torch
from lm_fixtures import MICRO, tiny_config

from cookmind.cli import main as cli_main
from cookmind.infer.loading import load_for_inference
from cookmind.model import CookMindLM, save_model
from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

TEXT_A = "the cook stirs the soup and tastes it. " * 30
TEXT_B = "numbers like 12 and 345 add up: 12 + 345 = 357. " * 30


def _tokenizer(tmp_path, name, text):
    (tmp_path / f"{name}.txt").write_text(text)
    vocab, merges = train_bpe(tmp_path / f"{name}.txt", 275, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).save(tmp_path / name)
    return tmp_path / name


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A checkpoint carrying tokenizer A, and a tokenizer B of the same size (so nothing crashes by itself)."""
    tmp_path = tmp_path_factory.mktemp("match")
    tok_a, tok_b = _tokenizer(tmp_path, "tok_a", TEXT_A), _tokenizer(tmp_path, "tok_b", TEXT_B)
    assert Tokenizer.load(tok_a).vocab_size == Tokenizer.load(tok_b).vocab_size
    torch.manual_seed(0)
    model = CookMindLM(tiny_config(**MICRO, vocab_size=275, max_position_embeddings=32))
    ckpt = save_model(tmp_path / "ckpt", model)
    Tokenizer.load(tok_a).save(ckpt)  # what a training checkpoint holds
    return ckpt, tok_a, tok_b


def test_mismatched_tokenizer_is_refused_naming_both(setup):
    ckpt, tok_a, tok_b = setup
    with pytest.raises(ValueError) as info:
        load_for_inference(ckpt, tokenizer_path=tok_b)
    message = str(info.value)
    assert str(ckpt) in message and str(tok_b) in message
    assert Tokenizer.load(tok_a).fingerprint()[:16] in message and Tokenizer.load(tok_b).fingerprint()[:16] in message
    with pytest.raises(ValueError, match="tokenizer"):  # evals load through the same loader
        load_for_inference(ckpt, tokenizer_path=tok_b, hf_native=True)


def test_the_carried_or_an_identical_tokenizer_loads(setup):
    ckpt, tok_a, _ = setup
    fingerprint = Tokenizer.load(tok_a).fingerprint()
    assert load_for_inference(ckpt)[1].fingerprint() == fingerprint  # --tokenizer stays optional
    assert load_for_inference(ckpt, tokenizer_path=tok_a)[1].fingerprint() == fingerprint
    hf_only = tok_a.parent / "tok_a_hf"  # the same tokenizer in Hugging Face files only (e.g. from an export)
    hf_only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_a / name, hf_only / name)
    assert load_for_inference(ckpt, tokenizer_path=hf_only)[1].fingerprint() == fingerprint


def test_generate_cli_reports_the_mismatch_in_one_line(setup, capsys):
    ckpt, _, tok_b = setup
    rc = cli_main(
        ["generate", "--model", str(ckpt), "--tokenizer", str(tok_b), "--prompt", "the cook", "--max-new-tokens", "2"]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "cookmind generate: error:" in err and str(tok_b) in err


def test_a_tokenizer_larger_than_a_model_that_carries_none_is_refused_naming_both_sizes(setup, tmp_path, capsys):
    """A model folder with no tokenizer (nothing to compare) and a --tokenizer of more tokens than its vocabulary
    loaded, and generate then died in a traceback (IndexError: index 15496 is out of bounds for dimension 0 with
    size 1575), as every chat message and every request to serve did: the ids past the model's rows name nothing."""
    ckpt, tok_a, _ = setup
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(ckpt / name, bare / name)
    (tmp_path / "big.txt").write_text(TEXT_A + TEXT_B)
    vocab, merges = train_bpe(tmp_path / "big.txt", 400, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).save(tmp_path / "big")
    big = Tokenizer.load(tmp_path / "big").vocab_size
    assert big > 275
    argv = ["generate", str(bare), "--tokenizer", str(tmp_path / "big"), "--prompt", "numbers like 345", "--raw"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind generate: error: --tokenizer {tmp_path / 'big'} has {big} tokens, more than")
    assert "vocabulary of 275" in err and err.count("\n") == 1, err
    assert load_for_inference(bare, tokenizer_path=tok_a)[0].config.vocab_size == 275  # one that fits still loads


@pytest.mark.parametrize("hf_native", [False, True])
def test_a_hugging_face_model_folder_refuses_another_tokenizer_as_a_checkpoint_does(setup, tmp_path, hf_native):
    """A checkpoint refused a --tokenizer other than its own, but a Hugging Face model folder (its tokenizer.json, no
    cookmind_tokenizer.json) was compared with nothing: eval and generate ran the model on another tokenizer's ids
    without a word. Its tokenizer.json is its own, and another is refused alike (transformers' loading too)."""
    ckpt, tok_a, tok_b = setup
    hf = tmp_path / "hf"
    assert cli_main(["export", "--hf", str(ckpt), str(hf)]) == 0
    (hf / "cookmind_tokenizer.json").unlink()  # as a Hugging Face model's own folder holds it: tokenizer.json only
    assert (hf / "tokenizer.json").is_file()
    with pytest.raises(ValueError) as info:
        load_for_inference(hf, tokenizer_path=tok_b, hf_native=hf_native)
    assert str(hf) in str(info.value) and str(tok_b) in str(info.value)
    load_for_inference(hf, tokenizer_path=tok_a, hf_native=hf_native)  # the same tokenizer still loads
