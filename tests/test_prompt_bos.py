"""A plain-text prompt opens as a document does: a Llama-style tokenizer's <s> first, as transformers' ``encode``
puts it and as pack's documents began (tokenizer/documents.py ``prompt_ids``).

Before, generate, /v1/completions, eval gsm8k and mmlu, GRPO's prompts (pack grpo and the rollouts) and the
Trainer's sample prompts encoded the text alone, and loading such a tokenizer warned "cookmind's prompts do not
get it": a model pretrained with <s> before every document (by pack, or by its authors through transformers) was
asked to continue text it had never seen begin that way. The reference for every path is transformers' own
``encode(text)`` of the same folder."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from lm_fixtures import MICRO, tiny_config  # noqa: E402
from tokenizer_fixtures import llama_style_tokenizer, sentencepiece_style_tokenizer  # noqa: E402

from cookmind.model import CookMindLM, save_model  # noqa: E402
from cookmind.tokenizer.documents import prompt_ids  # noqa: E402
from cookmind.tokenizer.hf_adapter import load_tokenizer  # noqa: E402

TEXT = "Question: what is 2 + 3?\nAnswer:"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny model folder with a Llama-style tokenizer (<s> before every text, </s> its EOS), and transformers'
    tokenizer of the same files."""
    folder = tmp_path_factory.mktemp("llama") / "m"
    llama_style_tokenizer(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    torch.manual_seed(0)
    save_model(folder, CookMindLM(tiny_config(**MICRO, vocab_size=len(hf), max_position_embeddings=64)))
    return folder, hf


def test_a_plain_prompt_is_what_transformers_encodes(llama, tmp_path):
    folder, hf = llama
    want = hf.encode(TEXT)
    assert want[0] == hf.bos_token_id and want[1:] == hf.encode(TEXT, add_special_tokens=False)
    assert prompt_ids(load_tokenizer(folder), TEXT) == want  # cookmind's codec reading the folder
    assert prompt_ids(hf, TEXT) == want  # transformers' tokenizer itself (evals load either)
    sp = sentencepiece_style_tokenizer(tmp_path / "sp")  # read through transformers behind cookmind's API
    sp_hf = transformers.AutoTokenizer.from_pretrained(str(sp))
    assert prompt_ids(load_tokenizer(sp), TEXT) == sp_hf.encode(TEXT)
    assert sp_hf.encode(TEXT)[0] == sp_hf.bos_token_id


def test_cookmind_tokenizers_open_no_prompt_with_anything(tmp_path):
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    (tmp_path / "c.txt").write_text("the cook stirs the soup and tastes it. " * 40)
    tok = Tokenizer(*train_bpe(tmp_path / "c.txt", 280, DEFAULT_SPECIAL_TOKENS, progress=False), DEFAULT_SPECIAL_TOKENS)
    assert prompt_ids(tok, TEXT) == tok.encode(TEXT)


def test_generate_continues_the_ids_transformers_gives(llama, monkeypatch, capsys):
    import importlib

    from cookmind.cli import main as cli_main

    gen_module = importlib.import_module("cookmind.infer.generate")  # the module (the package exports the function)

    folder, hf = llama
    seen = []
    real_stream = gen_module.stream

    def spy(model, prompt, *a, **kw):
        seen.append(list(prompt))
        return real_stream(model, prompt, *a, **kw)

    monkeypatch.setattr(gen_module, "stream", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading warned that prompts lack the <s>; nothing left to say
        assert cli_main(["generate", str(folder), "--prompt", TEXT, "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert seen == [hf.encode(TEXT)]
    capsys.readouterr()


def test_completions_endpoint_encodes_a_text_prompt_as_transformers(llama):
    from test_server import LiveServer

    openai = pytest.importorskip("openai")
    from cookmind.infer.engine import Engine
    from cookmind.infer.loading import load_for_inference
    from cookmind.infer.server import create_app

    folder, hf = llama
    model, tok = load_for_inference(folder, "cpu", torch.float32)
    server = LiveServer(create_app(Engine(model, num_slots=2, max_seq_len=64), tok, "m", api_key="k"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=60)
        r = client.completions.create(model="m", prompt=TEXT, max_tokens=0, echo=True, logprobs=0)
        assert r.usage.prompt_tokens == len(hf.encode(TEXT))
        assert r.choices[0].text == TEXT  # the <s> is a control token: scored, not part of the text
        assert r.choices[0].logprobs.tokens[0] == "<s>" and r.choices[0].logprobs.token_logprobs[0] is None
        ids = hf.encode(TEXT, add_special_tokens=False)  # token ids are taken as given
        r = client.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=0)
        assert r.usage.prompt_tokens == len(ids)
    finally:
        server.close()


def test_eval_and_grpo_prompts_open_with_bos(llama, tmp_path):
    from cookmind.align.losses import tokenize_prompt_and_output
    from cookmind.align.prompts import encode_prompt, format_prompt
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack

    folder, hf = llama
    tok = load_tokenizer(folder)
    for template in ("plain", "compact", "r1_zero"):  # gsm8k's and GRPO's rollouts' prompts
        text = format_prompt("What is 2 + 3?", template)
        assert encode_prompt(tok, "What is 2 + 3?", template) == hf.encode(text), template
    batch = tokenize_prompt_and_output([TEXT], [" 5"], tok)  # mmlu's scoring and SFT on prompt/output pairs
    joined = hf.encode(TEXT) + hf.encode(" 5", add_special_tokens=False)
    assert batch["input_ids"][0].tolist() == joined[:-1]
    assert batch["response_mask"][0].tolist() == [0] * (len(hf.encode(TEXT)) - 1) + [1] * 2
    # pack grpo's prompts (a plain template: this tokenizer has no chat template), which the rollouts continue
    (tmp_path / "g.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    template = "Q: {question}\nA:"
    pack([tmp_path / "g.jsonl"], tmp_path / "store", folder, "grpo", prompt_template=template, progress=False)
    stored = np.asarray(TokenStore(tmp_path / "store").record("prompts", 0)).tolist()
    assert stored == hf.encode("Q: What is 2 + 3?\nA:")
