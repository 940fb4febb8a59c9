"""Text that continues a prompt is encoded with it: a SentencePiece-style tokenizer (Llama 2's, Mistral's) puts a
dummy "▁" before each encode, so " 8" encoded apart is "▁▁8" but "A: 8" is "A:" then "▁8". The reference is
transformers' own encoding of prompt and continuation written as one text."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from tokenizer_fixtures import sentencepiece_style_tokenizer  # noqa: E402

from cookmind.store import TokenStore  # noqa: E402
from cookmind.store.packer import pack  # noqa: E402


@pytest.fixture(scope="module")
def sp_folder(tmp_path_factory):
    return sentencepiece_style_tokenizer(tmp_path_factory.mktemp("sp") / "sp")


def test_offline_grpo_response_packs_as_transformers_encodes_prompt_and_response(tmp_path, sp_folder):
    hf = transformers.AutoTokenizer.from_pretrained(str(sp_folder))
    rows = [{"prompt": "What is four", "response": " eight, Tom.", "reward": 1.0}]
    (tmp_path / "o.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack([tmp_path / "o.jsonl"], tmp_path / "o", sp_folder, "grpo", prompt_template="Q {question}? A:", progress=False)
    store = TokenStore(tmp_path / "o")
    joined = store.record("prompts", 0).tolist() + store.record("responses", 0).tolist()
    assert joined == hf("Q What is four? A: eight, Tom.")["input_ids"] + [hf.eos_token_id]


def test_tokenize_prompt_and_output_joins_as_transformers_encodes_the_whole_text(sp_folder):
    from cookmind.align.losses import tokenize_prompt_and_output

    hf = transformers.AutoTokenizer.from_pretrained(str(sp_folder))
    batch = tokenize_prompt_and_output(["Answer:", "Say"], [" B", " hi there"], hf)
    for row, text in enumerate(["Answer: B", "Say hi there"]):
        want = hf(text)["input_ids"]
        n = len(want)
        got = batch["input_ids"][row, : n - 1].tolist() + [batch["labels"][row, n - 2].item()]
        assert got == want
        assert batch["response_mask"][row, : n - 1].sum().item() == len(want) - len(
            hf("Answer:" if row == 0 else "Say")["input_ids"]
        )


def test_cookminds_gpt2_packs_offline_grpo_as_tiktoken_encodes_prompt_and_response(tmp_path, shared_data, monkeypatch):
    """cookmind's byte-level BPE has no dummy prefix: a response packed after its text prompt is what tiktoken's own
    GPT-2 encoding gives the two as one text, at seams of a space, a newline and none."""
    import hashlib

    import tiktoken
    import tiktoken.registry

    from cookmind.prompt_templates import PROMPTS

    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    files = {
        "vocab.bpe": b"#version: 0.2\n" + (shared_data / "gpt2/merges.txt").read_bytes(),
        "encoder.json": (shared_data / "gpt2/vocab.json").read_bytes(),
    }
    for name, data in files.items():
        (tmp_path / hashlib.sha1((base + name).encode()).hexdigest()).write_bytes(data)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    tiktoken.registry.ENCODINGS.pop("gpt2", None)
    try:
        ref = tiktoken.get_encoding("gpt2")
    finally:
        tiktoken.registry.ENCODINGS.pop("gpt2", None)
    lines = (shared_data / "gsm8k/test.jsonl").read_text().splitlines()[:24]
    rows = [json.loads(line) for line in lines]
    rows = [
        {"prompt": r["question"], "response": ["", " ", "\n"][k % 3] + r["answer"], "reward": 1.0}
        for k, r in enumerate(rows)
    ]
    (tmp_path / "o.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for template in ("plain", "r1_zero", "Q:{question}"):
        pack(
            [tmp_path / "o.jsonl"],
            tmp_path / "o",
            shared_data / "gpt2",
            "grpo",
            prompt_template=template,
            progress=False,
            overwrite=True,
        )
        store = TokenStore(tmp_path / "o")
        for i, r in enumerate(rows):
            text = PROMPTS.get(template, template).replace("{question}", r["prompt"].strip()) + r["response"]
            joined = store.record("prompts", i).tolist() + store.record("responses", i).tolist()
            assert joined == ref.encode_ordinary(text) + [ref.eot_token], (template, i)
