"""The run's tokenizer and its stores agree, or training refuses naming both (issues #16.4, #17.9)."""

from __future__ import annotations

import pytest
from lm_fixtures import tiny_lm

from cookmind.model import save_model
from cookmind.store import StoreError
from cookmind.store.packer import pack
from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
from cookmind.train import TrainConfig, Trainer

TEXT_A = "the cook stirs the soup and tastes it. " * 30
TEXT_B = "numbers like 12 and 345 add up: 12 + 345 = 357. " * 30
MODEL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def _tokenizer(tmp_path, name, text):
    (tmp_path / f"{name}.txt").write_text(text)
    vocab, merges = train_bpe(tmp_path / f"{name}.txt", 275, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).save(tmp_path / name)
    return tmp_path / name


def _cfg(tmp_path, store, run, tokenizer=None, **train):
    data = {"train_path": str(store), "window_size": 16}
    if tokenizer is not None:
        data["tokenizer"] = str(tokenizer)
    return TrainConfig.from_dict(
        {
            "model": {} if train.get("init_from") else MODEL,
            "data": data,
            "train": {"max_steps": 1, "micro_batch_size": 2, **train},
            "logging": {"run_dir": str(tmp_path / run), "progress": False},
        }
    )


def test_a_store_packed_by_another_tokenizer_is_refused_naming_both(tmp_path):
    tok_a, tok_b = _tokenizer(tmp_path, "tok_a", TEXT_A), _tokenizer(tmp_path, "tok_b", TEXT_B)
    assert Tokenizer.load(tok_a).vocab_size == Tokenizer.load(tok_b).vocab_size  # same size: no IndexError to hint
    pack([tmp_path / "tok_b.txt"], tmp_path / "store_b", tok_b, "seq", separator="\n", progress=False)
    with pytest.raises(StoreError) as info:
        Trainer(_cfg(tmp_path, tmp_path / "store_b", "r1", tokenizer=tok_a))
    message = str(info.value)
    assert str(tok_a) in message and str(tok_b.resolve()) in message
    assert Tokenizer.load(tok_a).fingerprint()[:16] in message and Tokenizer.load(tok_b).fingerprint()[:16] in message


def test_tokenizer_can_be_omitted_when_the_store_or_checkpoint_records_it(tmp_path):
    tok_a, tok_b = _tokenizer(tmp_path, "tok_a", TEXT_A), _tokenizer(tmp_path, "tok_b", TEXT_B)
    pack([tmp_path / "tok_a.txt"], tmp_path / "store_a", tok_a, "seq", separator="\n", progress=False)
    t = Trainer(_cfg(tmp_path, tmp_path / "store_a", "pre"))
    assert t.cfg.data.tokenizer == str(tok_a.resolve())
    assert t.tokenizer.fingerprint() == Tokenizer.load(tok_a).fingerprint()
    t.fit()
    ckpt = tmp_path / "pre" / "checkpoints" / "step_00000001"
    assert (ckpt / "cookmind_tokenizer.json").is_file()
    # fine-tuning from the checkpoint: its tokenizer is used; another one is refused naming both
    ft = Trainer(_cfg(tmp_path, tmp_path / "store_a", "ft", init_from=str(tmp_path / "pre")))
    assert ft.cfg.data.tokenizer == str(ckpt)
    named = f"trained with the tokenizer in {ckpt}.*--tokenizer {tok_b} \\(data.tokenizer\\)"
    with pytest.raises(ValueError, match=named):
        Trainer(_cfg(tmp_path, tmp_path / "store_a", "ft2", tokenizer=tok_b, init_from=str(tmp_path / "pre")))


def test_a_store_whose_recorded_tokenizer_moved_says_so_and_to_pass_tokenizer(tmp_path):
    tok_a = _tokenizer(tmp_path, "tok_a", TEXT_A)
    pack([tmp_path / "tok_a.txt"], tmp_path / "store_a", tok_a, "seq", separator="\n", progress=False)
    tok_a.rename(tmp_path / "moved")  # the user moved or deleted the tokenizer folder after packing
    with pytest.raises(FileNotFoundError) as info:  # was: 'model.vocab_size is not set and there is no tokenizer'
        Trainer(_cfg(tmp_path, tmp_path / "store_a", "pre"))
    message = str(info.value)
    assert str(tok_a.resolve()) in message and "--tokenizer" in message and "meta.json" in message
    assert not (tmp_path / "pre").exists()


def test_a_checkpoint_whose_tokenizer_frames_documents_otherwise_is_refused(tmp_path):
    """Fine-tuning from a checkpoint with a tokenizer of the same fingerprint that opens each document with a BOS the
    checkpoint's did not (a Hugging Face folder's post_processor, read into ``bos_ids``) was accepted: the fingerprint
    does not cover the framing, and the model learned documents without it. Refused, naming both framings; the
    checkpoint's own tokenizer, given explicitly, is accepted."""
    from cookmind.tokenizer.chat_template import IM_START
    from cookmind.tokenizer.tokenizer import TokenizerError

    tok_a = _tokenizer(tmp_path, "tok_a", TEXT_A)
    pack([tmp_path / "tok_a.txt"], tmp_path / "store_a", tok_a, "seq", separator="\n", progress=False)
    Trainer(_cfg(tmp_path, tmp_path / "store_a", "pre")).fit()
    plain = Tokenizer.load(tok_a)
    bos = plain.special_tokens[IM_START]
    Tokenizer(plain.vocab, plain.merges, plain.special_tokens, plain.pattern, bos_ids=[bos]).save(tmp_path / "tok_bos")
    assert Tokenizer.load(tmp_path / "tok_bos").fingerprint() == plain.fingerprint()
    pre = str(tmp_path / "pre")
    with pytest.raises(TokenizerError) as info:
        Trainer(_cfg(tmp_path, tmp_path / "store_a", "ft", tokenizer=tmp_path / "tok_bos", init_from=pre))
    message = str(info.value)
    assert "whose documents open with ids [] and end with id" in message
    given = f"--tokenizer {tmp_path / 'tok_bos'} (data.tokenizer)"
    assert f"{given} has the same vocabulary but opens them with [{bos}]" in message
    assert not (tmp_path / "ft").exists()
    Trainer(_cfg(tmp_path, tmp_path / "store_a", "ft2", tokenizer=tok_a, init_from=pre))


def test_tokenizer_info_shows_the_framing_a_store_records(tmp_path, capsys):
    """`cookmind tokenizer info` printed the fingerprint but not the ids that open and end a document, which a store
    now records and training checks beside it: a user refused for a framing mismatch could not see either side's.
    It prints both, as pack writes them into meta.json."""
    import json

    from cookmind.cli import main
    from cookmind.tokenizer.chat_template import ENDOFTEXT, IM_START

    tok_a = _tokenizer(tmp_path, "tok_a", TEXT_A)
    plain = Tokenizer.load(tok_a)
    bos = plain.special_tokens[IM_START]
    Tokenizer(plain.vocab, plain.merges, plain.special_tokens, plain.pattern, bos_ids=[bos]).save(tmp_path / "tok_bos")
    for folder, want_bos in ((tok_a, []), (tmp_path / "tok_bos", [bos])):
        assert main(["tokenizer", "info", "--tokenizer", str(folder)]) == 0
        info = json.loads(capsys.readouterr().out)
        assert (info["bos_ids"], info["eos_id"]) == (want_bos, plain.special_tokens[ENDOFTEXT])
        assert info["fingerprint"] == plain.fingerprint()
    pack([tmp_path / "tok_a.txt"], tmp_path / "s", tmp_path / "tok_bos", "seq", separator="\n", progress=False)
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())["tokenizer"]
    assert (meta["bos_ids"], meta["eos_id"]) == ([bos], info["eos_id"])


def test_a_dpo_reference_trained_with_another_tokenizer_is_refused_naming_both(tmp_path):
    """dpo.reference=a model of another tokenizer started training and crashed at the first step with an IndexError
    traceback from the reference's embedding (a larger vocabulary), or scored the pairs' ids as other text (the same
    size). Refused before the run starts, as train.init_from is, naming both."""
    import json

    from cookmind.tokenizer.tokenizer import TokenizerError

    tok_a, tok_b = _tokenizer(tmp_path, "tok_a", TEXT_A), _tokenizer(tmp_path, "tok_b", TEXT_B)
    for name, tok in (("a", tok_a), ("b", tok_b)):
        pack([tmp_path / f"tok_{name}.txt"], tmp_path / f"store_{name}", tok, "seq", separator="\n", progress=False)
        Trainer(_cfg(tmp_path, tmp_path / f"store_{name}", f"pre_{name}")).fit()
    pairs = tmp_path / "pairs.jsonl"
    pair = {"prompt": "the cook", "chosen": "stirs", "rejected": "tastes it"}
    pairs.write_text((json.dumps(pair) + "\n") * 2)  # one global batch
    pack([pairs], tmp_path / "dpo", tok_a, "dpo", progress=False)
    cfg = _cfg(tmp_path, tmp_path / "dpo", "dpo_run", init_from=str(tmp_path / "pre_a"), objective="dpo")
    cfg.data.window_size = 64  # the pair in the chat template: more than 16 tokens
    cfg.dpo.reference = str(tmp_path / "pre_b")
    with pytest.raises(TokenizerError) as info:
        Trainer(cfg)
    message = str(info.value)
    assert message.startswith(f"dpo.reference={tmp_path / 'pre_b'} was trained with the tokenizer in ")
    assert f"--tokenizer {tmp_path / 'pre_a' / 'checkpoints' / 'step_00000001'} (data.tokenizer)" in message
    assert not (tmp_path / "dpo_run").exists()
    # one that carries no tokenizer to check (a Hugging Face folder) is refused for another vocabulary
    save_model(tmp_path / "other", tiny_lm(vocab_size=300))
    cfg.dpo.reference = str(tmp_path / "other")
    with pytest.raises(ValueError, match=r"dpo.reference=.*other has 300 token ids and the model being trained 275"):
        Trainer(cfg)
    cfg.dpo.reference = str(tmp_path / "pre_a")  # a reference of the run's tokenizer is accepted
    Trainer(cfg)
