"""A checkpoint carrying a tokenizer transformers reads (a SentencePiece-style BPE, not ours) is compared with the
--tokenizer given, as one carrying ours is; its chat_template.jinja and tokenizer.model count among a tokenizer's
files, so an --output named after one of them is refused even with --overwrite."""

from __future__ import annotations

import shutil

import pytest

transformers = pytest.importorskip("transformers")

from lm_fixtures import sharp_tiny_lm  # noqa: E402
from test_hf_chat_mask import CHATML, LLAMA2, sp_folder  # noqa: E402
from tokenizer_fixtures import run_cli  # noqa: E402

from cookmind.infer.loading import load_for_inference  # noqa: E402
from cookmind.model import save_model  # noqa: E402
from cookmind.tokenizer.errors import TokenizerError  # noqa: E402
from cookmind.tokenizer.files import TOKENIZER_FILES  # noqa: E402


def model_carrying(tmp_path, folder):
    """A tiny model saved with the tokenizer files of ``folder`` beside its weights (room for more tokens)."""
    d = tmp_path / "model"
    save_model(d, sharp_tiny_lm(vocab_size=400))
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, d / name)
    return d


def test_a_checkpoint_carrying_a_sentencepiece_tokenizer_refuses_another_given(tmp_path):
    own = sp_folder(tmp_path / "own", LLAMA2, chatml=False)
    other = sp_folder(tmp_path / "other", CHATML)  # two more special tokens: other ids
    hf_own, hf_other = (transformers.AutoTokenizer.from_pretrained(str(f)) for f in (own, other))
    assert hf_own.get_vocab() != hf_other.get_vocab()  # the premise: they are two tokenizers
    d = model_carrying(tmp_path, own)
    with pytest.raises(TokenizerError, match=r"was trained with the tokenizer in .*model.*not --tokenizer .*other"):
        load_for_inference(d, "cpu", None, str(other))
    load_for_inference(d, "cpu", None, str(own))  # its own tokenizer given is the same one


@pytest.mark.parametrize("name", ["chat_template.jinja", "tokenizer.model"])
def test_encode_output_over_a_tokenizers_chat_template_or_model_file_is_refused(tmp_path, name, capsys):
    folder = sp_folder(tmp_path / "t", CHATML)
    (folder / name).write_text((folder / name).read_text() if (folder / name).is_file() else "sentencepiece model")
    before = (folder / name).read_bytes()
    with pytest.raises(ValueError, match=f"is also the input .*{name}"):
        run_cli(["encode", "--tokenizer", str(folder), "--text", "hi", "--output", str(folder / name), "--overwrite"])
    assert (folder / name).read_bytes() == before
