"""`cookmind tokenizer export --format tiktoken` read back by tiktoken itself, on real text."""

from __future__ import annotations

import json

import pytest
from tokenizer_fixtures import run_cli, save_tokenizer

from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, load_gpt2_files, train_bpe

tiktoken = pytest.importorskip("tiktoken")


def _export_and_load(tok: Tokenizer, tmp_path):
    """The tokenizer exported for tiktoken through the CLI, then read as tiktoken reads such files: the ranks file
    with its own loader, the pattern and special tokens from the config beside it."""
    from tiktoken.load import load_tiktoken_bpe

    argv = ["export", "--tokenizer", str(save_tokenizer(tok, tmp_path / "tok")), "--out", str(tmp_path / "tt")]
    assert run_cli([*argv, "--format", "tiktoken"]) == 0
    ranks = load_tiktoken_bpe(str(tmp_path / "tt" / "tokenizer.tiktoken"))
    cfg = json.loads((tmp_path / "tt" / "tiktoken_config.json").read_text(encoding="utf-8"))
    specials = cfg["special_tokens"]
    return tiktoken.Encoding("export", pat_str=cfg["pat_str"], mergeable_ranks=ranks, special_tokens=specials)


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_a_tokenizer_trained_on_real_text_reads_back_in_tiktoken_with_its_ids(shared_data, tmp_path, pattern):
    corpus = shared_data / "text" / "corpus.en"
    vocab, merges = train_bpe(corpus, 1000, DEFAULT_SPECIAL_TOKENS, pattern=pattern, workers=1, progress=False)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS, pattern=pattern)
    enc = _export_and_load(tok, tmp_path)
    text = corpus.read_text(encoding="utf-8") + (shared_data / "text" / "tinystories_sample.txt").read_text()
    # the reference codec (our merge replay, the definition), not the fast path, which is tiktoken itself
    assert enc.encode_ordinary(text) == tok.encode_reference(text)
    assert enc.encode(text, allowed_special="all") == tok.encode_reference(text, allowed_special="all")
    assert enc.n_vocab == tok.vocab_size


def test_gpt2_reads_back_in_tiktoken_with_its_ids(shared_data, tmp_path):
    tok = load_gpt2_files(shared_data / "gpt2" / "vocab.json", shared_data / "gpt2" / "merges.txt")
    enc = _export_and_load(tok, tmp_path)
    text = (shared_data / "text" / "tinystories_sample.txt").read_text() + (
        shared_data / "text" / "corpus.en"
    ).read_text(encoding="utf-8")[:20000]
    assert enc.encode(text, allowed_special="all") == tok.encode_reference(text, allowed_special="all")


def test_a_tokenizer_tiktoken_cannot_encode_is_refused_not_exported_to_give_other_ids(tmp_path, capsys):
    """tiktoken merges by rank, and a rank is an id: a tokenizer whose ids do not grow in merge order (a Hugging Face
    tokenizer.json can have them so, and `tokenizer import` keeps its ids) cannot be written for it. Its export
    encoded "bcd" as "bc" "d" in tiktoken, where the tokenizer (and Hugging Face's tokenizers) give "b" "cd"."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"bc": len(vocab), "cd": len(vocab) + 1})  # "bc" the lower id, "cd" the first merge
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[("c", "d"), ("b", "c")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.save(str(tmp_path / "tokenizer.json"))
    hf_json = str(tmp_path / "tokenizer.json")
    assert run_cli(["import", "--tokenizer-json", hf_json, "--out", str(tmp_path / "tok")]) == 0
    argv = ["export", "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "tt"), "--format", "tiktoken"]
    capsys.readouterr()
    assert run_cli(argv) != 0
    assert "tiktoken" in capsys.readouterr().err and not (tmp_path / "tt" / "tokenizer.tiktoken").exists()
    assert hf.encode("bcd").ids == [vocab["b"], vocab["cd"]]


@pytest.mark.parametrize("fmt", ["hf", "gpt2"])
def test_the_formats_that_keep_merge_order_apart_from_ids_read_back_in_tokenizers_with_its_ids(tmp_path, fmt):
    """The tokenizer tiktoken cannot take (ids not in merge order) exported as tokenizer.json or vocab.json +
    merges.txt, which name merges by their order and ids apart: Hugging Face's tokenizers reads each to its ids."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"bc": len(vocab), "cd": len(vocab) + 1})
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[("c", "d"), ("b", "c")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.save(str(tmp_path / "tokenizer.json"))
    assert run_cli(["import", "--tokenizer-json", str(tmp_path / "tokenizer.json"), "--out", str(tmp_path / "t")]) == 0
    argv = ["export", "--tokenizer", str(tmp_path / "t"), "--out", str(tmp_path / "x"), "--format", fmt]
    assert run_cli(argv) == 0
    if fmt == "hf":
        back = HFTokenizer.from_file(str(tmp_path / "x" / "tokenizer.json"))
    else:
        back = HFTokenizer(models.BPE.from_file(str(tmp_path / "x" / "vocab.json"), str(tmp_path / "x" / "merges.txt")))
        back.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for text in ("bcd", "abcdcb", "cd bc bcd"):
        assert back.encode(text, add_special_tokens=False).ids == hf.encode(text).ids, text
    assert hf.encode("bcd").ids == [vocab["b"], vocab["cd"]]
