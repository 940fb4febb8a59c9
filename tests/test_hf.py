"""Hugging Face interop: exported models load strictly in transformers with equal logits; imports round-trip."""

from __future__ import annotations

import json

import pytest
import torch
from lm_fixtures import tiny_lm
from tokenizer_fixtures import hf_byte_tokenizer, llama_style_tokenizer

from cookmind.cli import main as cli_main
from cookmind.model import load_model, save_model
from cookmind.model.hf import HFInteropError, export_hf, import_hf

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=97, intermediate_size=48, max_position_embeddings=128)  # over lm_fixtures.TINY
# a tiny transformers Llama/Qwen config's sizes (2 layers, 4 heads of 8, 2 KV heads)
HF_TINY = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def _randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial norm weights and biases so a wrongly mapped one would show in the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


def _hf_load(path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    return model.eval()


CASES = {
    "mha-tied": (dict(num_key_value_heads=4, tie_word_embeddings=True), "LlamaForCausalLM"),
    "gqa-untied": (dict(num_key_value_heads=2, tie_word_embeddings=False), "LlamaForCausalLM"),
    "gqa-qknorm-tied": (dict(num_key_value_heads=2, qk_norm=True), "Qwen3ForCausalLM"),
    "mqa-qknorm-yarn-untied": (
        dict(num_key_value_heads=1, qk_norm=True, tie_word_embeddings=False, rope_scaling=YARN),
        "Qwen3ForCausalLM",
    ),
    "gqa-yarn-tied": (dict(num_key_value_heads=2, rope_scaling=YARN, head_dim=16), "LlamaForCausalLM"),
    "qkv-bias": (dict(num_key_value_heads=2, attention_bias=True), "Qwen2ForCausalLM"),
    "gqa-llama3-rope": (dict(num_key_value_heads=2, rope_scaling=LLAMA3, rope_theta=500000.0), "LlamaForCausalLM"),
    "linear-rope": (
        dict(num_key_value_heads=4, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        "LlamaForCausalLM",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_loads_strictly_with_equal_logits(tmp_path, case):
    kw, arch = CASES[case]
    model = _randomize(tiny_lm(**BASE, **kw)).eval()
    save_model(tmp_path / "ckpt", model)
    export_hf(tmp_path / "ckpt", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [arch]
    hf = _hf_load(tmp_path / "hf")
    assert type(hf).__name__ == arch
    ids = torch.randint(0, 97, (2, 100))  # past original_max_position_embeddings: YaRN scaling is exercised
    with torch.no_grad():
        diff = (hf(ids).logits.float() - model(ids).logits).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_import_matches_transformers_logits(tmp_path, arch):
    cls = getattr(transformers, arch)
    config_cls = {
        "LlamaForCausalLM": transformers.LlamaConfig,
        "Qwen2ForCausalLM": transformers.Qwen2Config,
        "Qwen3ForCausalLM": transformers.Qwen3Config,
    }[arch]
    hf_cfg = config_cls(
        **HF_TINY,
        max_position_embeddings=128,
        tie_word_embeddings=arch == "Qwen2ForCausalLM",
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    )
    torch.manual_seed(1)
    hf = _randomize(cls(hf_cfg)).eval()
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    import_hf(tmp_path / "hf", tmp_path / "ours")
    assert (tmp_path / "ours" / "tokenizer.json").is_file()
    ours = load_model(tmp_path / "ours")
    assert ours.config.rope_theta == 5000.0 and ours.config.qk_norm == (arch == "Qwen3ForCausalLM")
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        diff = (hf(ids).logits.float() - ours(ids).logits).abs().max().item()
    assert diff < 1e-4


def _write_hf_config(path, **overrides):
    path.mkdir()
    d = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rope_scaling=None,
    )
    d.update(overrides)
    (path / "config.json").write_text(json.dumps(d))


def test_import_rejects_unsupported_architecture_and_rope(tmp_path):
    _write_hf_config(tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(HFInteropError, match="GPT2LMHeadModel.*not supported"):
        import_hf(tmp_path / "gpt2", tmp_path / "o1")
    _write_hf_config(tmp_path / "dyn", rope_scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(HFInteropError, match="rope type 'dynamic' is not supported"):
        import_hf(tmp_path / "dyn", tmp_path / "o2")
    _write_hf_config(
        tmp_path / "long",
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0], "long_factor": [2.0]},
    )
    with pytest.raises(HFInteropError, match="rope type 'longrope'"):
        import_hf(tmp_path / "long", tmp_path / "o3")
    _write_hf_config(tmp_path / "l3", rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4})
    with pytest.raises(HFInteropError, match="llama3 needs.*low_freq_factor"):
        import_hf(tmp_path / "l3", tmp_path / "o4")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_export_moe_is_a_clear_error(tmp_path):
    save_model(tmp_path / "moe", tiny_lm(**BASE, num_key_value_heads=2, num_experts=2))
    with pytest.raises(HFInteropError, match="mixture-of-experts.*not supported"):
        export_hf(tmp_path / "moe", tmp_path / "out")


def test_cli_export_copies_tokenizer_files_and_import_round_trips(tmp_path, capsys):
    model = _randomize(tiny_lm(**BASE, num_key_value_heads=2, qk_norm=True, eos_token_id=3))
    save_model(tmp_path / "ckpt", model)
    (tmp_path / "ckpt" / "tokenizer.json").write_text('{"model": {}}')
    (tmp_path / "ckpt" / "tokenizer_config.json").write_text("{}")
    (tmp_path / "ckpt" / "optimizer.pt").write_bytes(b"not for export")
    assert cli_main(["export", "--hf", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--dtype", "bf16"]) == 0
    names = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert names == [
        ".cookmind-export.json",  # marks the folder as export's own: --overwrite replaces only such a one
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    gen = transformers.GenerationConfig.from_pretrained(str(tmp_path / "hf"))
    assert gen.eos_token_id == 3
    assert "Qwen3ForCausalLM" in capsys.readouterr().out
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    back = load_model(tmp_path / "back")
    assert back.lm_head.weight.dtype == torch.bfloat16
    for name, p in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name].float(), p.to(torch.bfloat16).float(), rtol=0, atol=0)
    assert cli_main(["export", "--hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 2  # exists: refused
    err = capsys.readouterr().err
    assert "already exists" in err and err.startswith("cookmind export: error: ")  # was "cookmind export: PATH: ..."


def test_cli_export_of_a_run_directory_takes_the_newest_checkpoint(tmp_path):
    old, new = (tiny_lm(**BASE, num_key_value_heads=2) for _ in range(2))
    for step, model in ((10, old), (20, new)):
        save_model(tmp_path / "run" / f"step_{step:08d}", model)
        (tmp_path / "run" / f"step_{step:08d}" / "meta.json").write_text(json.dumps({"step": step}))
    assert cli_main(["export", "--hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    hf = _hf_load(tmp_path / "hf")
    torch.testing.assert_close(hf.model.embed_tokens.weight, new.model.embed_tokens.weight, rtol=0, atol=0)


def test_export_of_an_hf_folder_and_import_of_a_cookmind_model_say_what_they_were_given(tmp_path, capsys):
    # export --hf of an export listed ten "unknown keys" of CookMindConfig; import --hf of a training run said
    # "RUN/config.json: missing; a Hugging Face model directory needs config.json"
    model = tiny_lm(**BASE, num_key_value_heads=2)
    save_model(tmp_path / "run" / "checkpoints" / "step_00000010", model)
    (tmp_path / "run" / "checkpoints" / "step_00000010" / "meta.json").write_text(json.dumps({"step": 10}))
    assert cli_main(["export", "--hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert cli_main(["export", "--hf", str(tmp_path / "hf"), str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert "hf: already a Hugging Face model folder (LlamaForCausalLM)" in err and "unknown keys" not in err, err
    for given in ("run", "run/checkpoints/step_00000010"):
        assert cli_main(["import", "--hf", str(tmp_path / given), str(tmp_path / "back")]) == 2
        err = capsys.readouterr().err
        assert f"{given}: a cookmind model, not a Hugging Face folder" in err, err
    assert not (tmp_path / "hf2").exists() and not (tmp_path / "back").exists()


def test_hf_dirs_are_told_from_cookmind_dirs(tmp_path):
    """HF configs name a model_type/architectures; ours (and damaged or absent ones) do not count."""
    from cookmind.model.hf import is_hf_model_dir

    cases = {
        "hf": '{"model_type": "llama"}',
        "hf2": '{"architectures": ["Qwen3ForCausalLM"]}',
        "ours": '{"vocab_size": 10, "hidden_size": 8}',
        "broken": '{"model_type": ',
    }
    for name, text in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
    assert is_hf_model_dir(tmp_path / "hf") and is_hf_model_dir(tmp_path / "hf2")
    assert not is_hf_model_dir(tmp_path / "ours") and not is_hf_model_dir(tmp_path / "broken")
    assert not is_hf_model_dir(tmp_path / "absent")


def _turn_taking_model(vocab_size, im_end, after_im_end, eos):
    """A 1-layer model whose next token depends only on the current one: <|im_end|> after any token but
    <|im_end|>, then ``after_im_end`` (attention and MLP outputs zeroed, so the residual is the embedding)."""
    model = tiny_lm(
        vocab_size=vocab_size, intermediate_size=48, num_hidden_layers=1, tie_word_embeddings=False, eos_token_id=eos
    )
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb[:, 0] = 1.0
        emb[im_end] = 0.0
        emb[im_end, 1] = 1.0
        head[im_end, 0] = 10.0
        head[after_im_end, 1] = 10.0
    return model.eval()


def test_exported_model_stops_at_im_end_in_transformers_generate(tmp_path):
    """generation_config.json lists <|im_end|> beside <|endoftext|>, so transformers' generate ends the assistant
    turn where cookmind does (#17.14); checked with the exported tokenizer's own chat template."""
    from cookmind.infer import SamplingParams
    from cookmind.infer.generate import generate
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    (tmp_path / "c.txt").write_text("the cook stirs the soup and tastes it. " * 40)
    tok = Tokenizer(*train_bpe(tmp_path / "c.txt", 280, DEFAULT_SPECIAL_TOKENS, progress=False), DEFAULT_SPECIAL_TOKENS)
    letter = tok.encode("a")[0]
    model = _turn_taking_model(tok.vocab_size, tok.im_end_id, letter, tok.eos_id)
    save_model(tmp_path / "ckpt", model)
    tok.save(tmp_path / "ckpt")
    assert cli_main(["export", "--hf", "--model", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    hf_model = _hf_load(tmp_path / "hf")
    text = hf_tok.apply_chat_template(
        [{"role": "user", "content": "the soup"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([hf_tok(text, add_special_tokens=False)["input_ids"]])
    out = hf_model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :].tolist()
    assert out == [tok.im_end_id]
    # the construction: with only <|endoftext|> as eos (the old generation_config) generate runs on past the turn
    runs_on = hf_model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=tok.eos_id)
    assert runs_on[0, ids.shape[1] :].tolist() == [tok.im_end_id, letter, tok.im_end_id, letter]
    # cookmind's own generate follows the same path and ends at the same token (it leaves the stop token out)
    prompt = [ids[0].tolist()]
    assert generate(model, prompt, SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=(tok.eos_id,))) == [
        runs_on[0, ids.shape[1] :].tolist()
    ]
    assert generate(
        model, prompt, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(tok.eos_id, tok.im_end_id))
    ) == [[]]
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.eos_id, tok.im_end_id]


def _hf_qwen3(path, seed, **save_kw):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(**HF_TINY, max_position_embeddings=64)
    hf = _randomize(transformers.Qwen3ForCausalLM(cfg)).eval()
    hf.save_pretrained(path, **save_kw)
    return hf


def test_import_of_sharded_safetensors_reads_what_transformers_reads(tmp_path):
    hf = _hf_qwen3(tmp_path / "hf", 0, max_shard_size="40KB")
    assert len(list((tmp_path / "hf").glob("model-0000*-of-0000*.safetensors"))) > 1
    import_hf(tmp_path / "hf", tmp_path / "ours")
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "ours")(ids).logits, hf(ids).logits, rtol=0, atol=1e-5)
    # a whole model.safetensors beside a stale index and shards: transformers loads the single file, and so do we
    new = _hf_qwen3(tmp_path / "new", 1)
    (tmp_path / "new" / "model.safetensors").rename(tmp_path / "hf" / "model.safetensors")
    theirs = _hf_load(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "ours2")
    with torch.no_grad():
        ref = theirs(ids).logits
        torch.testing.assert_close(load_model(tmp_path / "ours2")(ids).logits, ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(ref, new(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "index, says",
    [
        ("{not json", "not valid JSON"),
        ('{"metadata": {}}', "no weight_map"),
        ('{"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}}', "not a file name in the folder"),
    ],
)
def test_a_damaged_shard_index_is_a_one_line_error_naming_it(tmp_path, index, says):
    _hf_qwen3(tmp_path / "hf", 0, max_shard_size="40KB")
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(index)
    with pytest.raises(HFInteropError, match="model.safetensors.index.json: .*" + says) as exc:
        import_hf(tmp_path / "hf", tmp_path / "ours")
    assert "\n" not in str(exc.value) and not (tmp_path / "ours").exists()


def test_an_import_without_tokenizer_files_says_so_and_generate_asks_for_tokenizer(tmp_path, capsys):
    # import printed only the model's size; generate then said "train one with `cookmind tokenizer train`"
    _hf_qwen3(tmp_path / "hf", 0)
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
    assert "no tokenizer files" in capsys.readouterr().out
    for model in ("hf", "ours"):
        assert cli_main(["generate", str(tmp_path / model), "--prompt", "hi", "--max-new-tokens", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert "holds no tokenizer" in err and "--tokenizer DIR" in err and "\n" not in err, err


def _checkpoint_answering_with(directory, special, eos=None):
    """(tokenizer, id of ``special``): a small BPE with one extra special token, saved with a model that answers any
    text with ``special`` then "a" (``_turn_taking_model``), its config's eos ``eos`` (default <|endoftext|>)."""
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    specials = [*DEFAULT_SPECIAL_TOKENS, special]
    corpus = directory.parent / "c.txt"
    corpus.write_text("the cook stirs the soup and tastes it. " * 40)
    tok = Tokenizer(*train_bpe(corpus, 280, specials, progress=False), specials)
    end, letter = tok.special_tokens[special], tok.encode("a")[0]
    eos_id = tok.eos_id if eos is None else tok.special_tokens[eos]
    save_model(directory, _turn_taking_model(tok.vocab_size, end, letter, eos_id))
    tok.save(directory)
    return tok, end


def _transformers_greedy(hf_dir, prompt, max_new_tokens=4):
    """(transformers' tokenizer, the new ids of transformers' greedy ``generate``) for a Hugging Face folder."""
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    ids = torch.tensor([hf_tok(prompt, add_special_tokens=False)["input_ids"]])
    out = _hf_load(hf_dir).generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return hf_tok, out[0, ids.shape[1] :].tolist()


def test_generate_stops_at_the_models_own_eos_as_transformers_does(tmp_path, capsys):
    # a model whose eos is not <|endoftext|> (Llama's </s>): transformers' generate ends there; cookmind generate hid
    # the token and ran on to --max-new-tokens
    tok, end = _checkpoint_answering_with(tmp_path / "ckpt", "</s>", eos="</s>")  # </s> a </s> a ...
    assert cli_main(["export", "--hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    hf_tok, out = _transformers_greedy(tmp_path / "hf", "the soup")
    assert out == [end]  # transformers: the reply is empty, ended by the model's eos
    capsys.readouterr()
    for model in ("ckpt", "hf"):
        argv = ["generate", str(tmp_path / model), "--prompt", "the soup", "--max-new-tokens", "4"]
        assert cli_main(argv) == 0
        assert capsys.readouterr().out.strip() == hf_tok.decode(out, skip_special_tokens=True) == "", model


def _gpt2_style_tokenizer(path, *, bos=False, template=None):
    """A small byte-level BPE saved by transformers: optionally Llama's <s> before every text, a chat template."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    hf_byte_tokenizer(path, specials, "<|endoftext|>", bos="<s>" if bos else None, template=template)


CHATML_WITH_DEFAULT_SYSTEM = (  # Qwen2.5's way: a system turn of its own when the chat has none
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_hugging_face_tokenizer_that_cookmind_would_use_otherwise_is_named(tmp_path):
    # its own chat template was dropped without a word: chats reached the model otherwise than transformers gives
    # them (a post_processor's <s> is no longer such a difference: plain prompts open with it, test_prompt_bos.py)
    from cookmind.infer.loading import load_for_inference

    save_model(tmp_path / "m", tiny_lm(vocab_size=300, intermediate_size=48, max_position_embeddings=64))
    _gpt2_style_tokenizer(tmp_path / "m", template=CHATML_WITH_DEFAULT_SYSTEM)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    with pytest.warns(UserWarning, match="chat template renders chats otherwise than cookmind's"):
        _, tok = load_for_inference(tmp_path / "m")
    chat = [{"role": "user", "content": "hi"}]
    assert hf_tok.apply_chat_template(chat, tokenize=False) != tok.apply_chat_template(chat)


@pytest.mark.parametrize("bos", [False, True])
def test_a_hugging_face_tokenizer_that_cookmind_uses_as_transformers_does_loads_quietly(tmp_path, recwarn, bos):
    # bos: its post_processor puts <s> before every text, and cookmind's plain prompts open with it too
    from cookmind.infer.loading import load_for_inference
    from cookmind.tokenizer.chat_template import jinja_template
    from cookmind.tokenizer.documents import prompt_ids

    save_model(tmp_path / "m", tiny_lm(vocab_size=300, intermediate_size=48, max_position_embeddings=64))
    _gpt2_style_tokenizer(tmp_path / "m", template=jinja_template(), bos=bos)
    _, tok = load_for_inference(tmp_path / "m")
    assert not [str(w.message) for w in recwarn], "nothing to say (transformers' notes on our config.json neither)"
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert prompt_ids(tok, "hi") == hf_tok.encode("hi")


def test_a_sentencepiece_tokenizer_beside_a_cookmind_config_loads_without_transformers_reading_that_config(
    tmp_path, recwarn
):
    """A cookmind model holding a SentencePiece-style tokenizer (an import of Llama 2 or Mistral) is read through
    transformers' AutoTokenizer, which also read the folder's config.json, cookmind's, as a transformers config:
    every generate, chat, serve and eval of it began with transformers' FutureWarning "`rope_scaling` is
    deprecated". The tokenizer now loads without it, and encodes as transformers does from its own files."""
    from tokenizer_fixtures import sentencepiece_style_tokenizer

    from cookmind.infer.loading import load_for_inference
    from cookmind.tokenizer.documents import prompt_ids

    folder = sentencepiece_style_tokenizer(tmp_path / "sp")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    save_model(tmp_path / "m", tiny_lm(vocab_size=len(hf_tok), intermediate_size=48, max_position_embeddings=64))
    for f in folder.iterdir():
        (tmp_path / "m" / f.name).write_bytes(f.read_bytes())
    _, tok = load_for_inference(tmp_path / "m")
    assert type(tok).__name__ == "HFTokenizerAdapter"
    assert not [str(w.message) for w in recwarn]
    assert prompt_ids(tok, "Answer: A b") == hf_tok.encode("Answer: A b")


def test_export_of_a_model_with_several_eos_ids_generates_in_transformers(tmp_path):
    # an eos_token_id list (an imported Llama 3's) was nested into generation_config.json's: [[e1, e2], im_end],
    # on which transformers' generate stopped with "TypeError: not a sequence"
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    (tmp_path / "c.txt").write_text("the cook stirs the soup and tastes it. " * 40)
    tok = Tokenizer(*train_bpe(tmp_path / "c.txt", 280, DEFAULT_SPECIAL_TOKENS, progress=False), DEFAULT_SPECIAL_TOKENS)
    eos = [tok.eos_id, tok.special_tokens["<think>"]]
    save_model(tmp_path / "ckpt", tiny_lm(vocab_size=tok.vocab_size, intermediate_size=48, eos_token_id=eos))
    tok.save(tmp_path / "ckpt")
    export_hf(tmp_path / "ckpt", tmp_path / "hf")
    gen = transformers.GenerationConfig.from_pretrained(str(tmp_path / "hf"))
    assert gen.eos_token_id == [*eos, tok.im_end_id]
    out = _hf_load(tmp_path / "hf").generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, do_sample=False)
    assert out.shape[0] == 1


def test_chat_on_a_model_whose_tokenizer_has_no_chatml_tokens_says_what_works(tmp_path, capsys):
    # "train it with --special-token for both": no help for a Hugging Face model whose tokenizer is fixed
    save_model(tmp_path / "m", tiny_lm(vocab_size=300, intermediate_size=48, max_position_embeddings=64))
    _gpt2_style_tokenizer(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text(
        (tmp_path / "m" / "tokenizer.json").read_text().replace("<|im_start|>", "<|x|>").replace("<|im_end|>", "<|y|>")
    )
    assert cli_main(["generate", str(tmp_path / "m"), "--chat", "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "ChatML" in err and "without --chat" in err and "\n" not in err, err
    assert cli_main(["generate", str(tmp_path / "m"), "--prompt", "hi", "--max-new-tokens", "1"]) == 0
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert (
        cli_main(
            [
                "pack",
                "--tokenizer",
                str(tmp_path / "m"),
                "--train-type",
                "sft",
                "--input",
                str(chats),
                "--out",
                str(tmp_path / "sft"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "ChatML" in err and "--train-type seq" in err and "\n" not in err, err


def test_a_tokenizer_neither_cookmind_nor_transformers_can_encode_with_is_refused_with_the_reason(tmp_path, capsys):
    # cookmind's reason ("the vocabulary lacks single-byte tokens") was dropped for transformers' reading, which
    # encoded every prompt to nothing: "generate: every prompt needs at least one token"
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers

    save_model(tmp_path / "m", tiny_lm(vocab_size=300, intermediate_size=48, max_position_embeddings=64))
    raw = HFTok(models.BPE(vocab={}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.add_special_tokens(["<|endoftext|>"])
    raw.save(str(tmp_path / "m" / "tokenizer.json"))
    assert cli_main(["generate", str(tmp_path / "m"), "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "encodes text to nothing" in err and "single-byte tokens" in err and "\n" not in err, err


def test_generate_on_a_hugging_face_folder_stops_where_its_generation_config_says(tmp_path, capsys):
    # Llama 3 Instruct's generation_config.json ends generation at <|eot_id|> too, beside config.json's eos: cookmind
    # generate hid that token and ran on to --max-new-tokens
    tok, eot = _checkpoint_answering_with(tmp_path / "ckpt", "<|eot_id|>")  # eot a eot a ...
    export_hf(tmp_path / "ckpt", tmp_path / "hf")
    for name in ("cookmind_tokenizer.json", "generation_config.json"):
        (tmp_path / "hf" / name).unlink()
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_id, eot]}))
    hf_tok, out = _transformers_greedy(tmp_path / "hf", "the soup")
    assert out == [eot]
    capsys.readouterr()
    assert cli_main(["generate", str(tmp_path / "hf"), "--prompt", "the soup", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip() == hf_tok.decode(out, skip_special_tokens=True) == ""


def test_export_and_import_replace_their_own_output_with_overwrite_and_nothing_else(tmp_path, capsys):
    # "already exists; choose a new output directory or remove it": no way to re-export after more training
    old, new = tiny_lm(**BASE, num_key_value_heads=2), tiny_lm(**BASE, num_key_value_heads=2)
    save_model(tmp_path / "old", old)
    save_model(tmp_path / "new", new)
    assert cli_main(["export", "--hf", str(tmp_path / "old"), str(tmp_path / "hf")]) == 0
    assert cli_main(["export", "--hf", str(tmp_path / "new"), str(tmp_path / "hf")]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert cli_main(["export", "--hf", str(tmp_path / "new"), str(tmp_path / "hf"), "--overwrite"]) == 0
    hf = _hf_load(tmp_path / "hf")
    torch.testing.assert_close(hf.model.embed_tokens.weight, new.model.embed_tokens.weight, rtol=0, atol=0)
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "back"), "--overwrite"]) == 0
    # a folder holding anything else, or another kind of folder, is never replaced
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    assert cli_main(["export", "--hf", str(tmp_path / "new"), str(tmp_path / "hf"), "--overwrite"]) == 2
    assert "notes.txt" in capsys.readouterr().err and (tmp_path / "hf" / "notes.txt").is_file()
    assert cli_main(["export", "--hf", str(tmp_path / "new"), str(tmp_path / "back"), "--overwrite"]) == 2
    # a folder of the same files that neither command wrote (a downloaded model, a model saved by save_model) is the
    # user's: it was replaced, for holding nothing but a config, weights and tokenizer files
    _hf_load(tmp_path / "hf").save_pretrained(tmp_path / "downloaded")
    assert cli_main(["export", "--hf", str(tmp_path / "new"), str(tmp_path / "downloaded"), "--overwrite"]) == 2
    assert "downloaded" in capsys.readouterr().err
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "new"), "--overwrite"]) == 2
    assert "--overwrite replaces only a folder import --hf wrote" in capsys.readouterr().err
    assert (tmp_path / "downloaded" / "model.safetensors").is_file() and (tmp_path / "new" / "config.json").is_file()
    torch.testing.assert_close(load_model(tmp_path / "new").model.embed_tokens.weight, new.model.embed_tokens.weight)
    (tmp_path / "old" / "meta.json").write_text("{}")  # a training checkpoint
    (tmp_path / "hf" / "notes.txt").unlink()
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "old"), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "--overwrite replaces only a folder import --hf wrote" in err and (tmp_path / "old" / "meta.json").is_file()


def _checkpoint_with(ckpt, tokenizer):
    """(tokenizer, the ids transformers' generate stops at) of a tiny model of a 64-token context saved in ``ckpt``
    with ``tokenizer``: ours ("cookmind": <|endoftext|>, <|im_end|>) or a Llama-style one saved by transformers."""
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    if tokenizer == "cookmind":
        (ckpt.parent / "c.txt").write_text("the cook stirs the soup and tastes it. " * 40)
        tok = Tokenizer(
            *train_bpe(ckpt.parent / "c.txt", 280, DEFAULT_SPECIAL_TOKENS, progress=False), DEFAULT_SPECIAL_TOKENS
        )
        tok.save(ckpt)
        stops = [tok.eos_id, tok.im_end_id]
    else:
        tok = Tokenizer.load(llama_style_tokenizer(ckpt))
        stops = [tok.eos_id]
    model = tiny_lm(
        vocab_size=tok.vocab_size, intermediate_size=48, max_position_embeddings=64, eos_token_id=tok.eos_id
    )
    save_model(ckpt, model)
    return tok, stops


@pytest.mark.parametrize("tokenizer", ["cookmind", "llama-style"])
def test_a_re_export_keeps_config_jsons_single_eos_an_int(tmp_path, tokenizer):
    # export, import --hf, export again turned config.json's eos_token_id 256 into [256, 258]: import folded
    # generation_config.json's stops into it. The imported model keeps config.json's, its loader adds those stops.
    from cookmind.infer.loading import load_model_dir

    tok, stops = _checkpoint_with(tmp_path / "ckpt", tokenizer)
    export_hf(tmp_path / "ckpt", tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "back")
    export_hf(tmp_path / "back", tmp_path / "hf2")
    for out in ("hf", "hf2"):
        assert transformers.AutoConfig.from_pretrained(str(tmp_path / out)).eos_token_id == tok.eos_id, out
        gen = transformers.GenerationConfig.from_pretrained(str(tmp_path / out))
        assert gen.eos_token_id == (stops if len(stops) > 1 else stops[0]), out
    # cookmind generate on the imported model stops where transformers' generate does
    assert load_model_dir(tmp_path / "back").config.eos_token_id in (stops, stops[0])
    # a list of one eos id is that id
    save_model(tmp_path / "one", tiny_lm(vocab_size=tok.vocab_size, intermediate_size=48, eos_token_id=[tok.eos_id]))
    export_hf(tmp_path / "one", tmp_path / "hf_one")
    assert json.loads((tmp_path / "hf_one" / "config.json").read_text())["eos_token_id"] == tok.eos_id


@pytest.mark.parametrize("tokenizer", ["cookmind", "llama-style"])
def test_the_exported_tokenizer_reads_the_models_context_as_its_model_max_length(tmp_path, tokenizer, caplog):
    # transformers read the exported tokenizer's model_max_length as 1,000,000 (ours) or 1e30 (a Hugging Face
    # folder's), not the model's context of 64 tokens: truncation=True kept texts the model cannot read
    _checkpoint_with(tmp_path / "ckpt", tokenizer)
    export_hf(tmp_path / "ckpt", tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert hf_tok.model_max_length == 64
    assert len(hf_tok("soup " * 100, truncation=True)["input_ids"]) == 64
    # eval ppl windows a long text itself: no transformers note that the text would cause "indexing errors"
    (tmp_path / "t.txt").write_text("soup " * 100)
    caplog.clear()
    assert cli_main(["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(tmp_path / "t.txt"), "--quiet"]) == 0
    assert not [r for r in caplog.records if "indexing errors" in r.getMessage()]


def test_an_export_of_a_checkpoint_deleted_while_it_is_read_is_an_error_not_a_folder_without_its_tokenizer(
    tmp_path, monkeypatch, capsys
):
    import shutil

    import cookmind.model.hf as hf

    step = tmp_path / "run" / "checkpoints" / "step_00000010"
    save_model(step, tiny_lm(**BASE, num_key_value_heads=2))
    (step / "tokenizer.json").write_text('{"model": {}}')
    (step / "meta.json").write_text(json.dumps({"step": 10}))
    read = hf.read_model_weights

    def read_then_pruned(directory, config, **kwargs):  # a running training's checkpoint.keep_last removes it
        found = read(directory, config, **kwargs)
        shutil.rmtree(directory)
        return found

    monkeypatch.setattr(hf, "read_model_weights", read_then_pruned)
    rc = cli_main(["export", "--hf", str(tmp_path / "run"), str(tmp_path / "hf")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and not (tmp_path / "hf").exists()  # it wrote an export without tokenizer.json and said nothing
    assert len(err.splitlines()) == 1 and str(step) in err and "export again" in err, err


def test_an_export_without_tokenizer_files_says_so_and_how_to_add_them(tmp_path, capsys):
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    save_model(tmp_path / "ckpt", tiny_lm(**BASE, num_key_value_heads=2))  # a model saved without its tokenizer
    assert cli_main(["export", "--hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out  # it said only "load with transformers.AutoModelForCausalLM.from_pretrained"
    with pytest.raises((OSError, ValueError)):
        transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert "no tokenizer files" in out
    command = out.split("`")[1]  # the command it names adds the tokenizer AutoTokenizer then loads
    assert command.startswith("cookmind tokenizer export ") and f"--out {tmp_path / 'hf'}" in command
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cook stirs the soup. " * 20)
    Tokenizer(*train_bpe(corpus, 280, list(DEFAULT_SPECIAL_TOKENS), progress=False), DEFAULT_SPECIAL_TOKENS).save(
        tmp_path / "tok"
    )
    assert cli_main(command.replace("TOK", str(tmp_path / "tok")).split()[1:]) == 0
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf")).encode("the cook") != []


LFS_POINTER = (  # what a clone without git-lfs leaves in place of the weights
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a2146ec6aea9f5c4a6ae52cf5c0b1b6f6bb5b3c8e2e3fd43fd7b1a5d0e8a1\nsize 1234567\n"
)


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_run_whose_weights_file_is_not_safetensors_is_a_one_line_error(tmp_path, capsys, command):
    step = tmp_path / "run" / "checkpoints" / "step_00000010"
    save_model(step, tiny_lm(**BASE, num_key_value_heads=2))
    (step / "meta.json").write_text(json.dumps({"step": 10}))
    (step / "model.safetensors").write_text(LFS_POINTER)  # its first 8 bytes read as a header of 2e18 bytes
    text = tmp_path / "t.txt"
    text.write_text("hello")
    argv = {
        "export": ["export", "--hf", str(tmp_path / "run"), str(tmp_path / "hf")],
        "eval": ["eval", "ppl", str(tmp_path / "run"), "--data", str(text), "--quiet"],
    }[command]
    with pytest.warns(UserWarning, match="skipping checkpoint .*model.safetensors"):
        rc = cli_main(argv)  # was a MemoryError traceback
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "none of its checkpoints" in err, err


def test_eval_of_a_hugging_face_folder_whose_weights_file_is_not_safetensors_is_a_one_line_error(tmp_path, capsys):
    from test_align_fixtures import tiny_hf_model, tiny_hf_tokenizer

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").write_text(LFS_POINTER)
    text = tmp_path / "t.txt"
    text.write_text("hello")
    capsys.readouterr()
    assert cli_main(["eval", "ppl", str(tmp_path / "hf"), "--data", str(text), "--quiet"]) == 2  # a traceback
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "hf") in err, err


def test_import_of_an_older_llama_checkpoint_with_rotary_inv_freq_buffers_loads_as_transformers_does(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_cfg = transformers.LlamaConfig(**HF_TINY, max_position_embeddings=128)
    torch.manual_seed(2)
    hf = _randomize(transformers.LlamaForCausalLM(hf_cfg)).eval()
    hf.save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(weights)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))  # what transformers < 4.31 saved
    for layer in range(HF_TINY["num_hidden_layers"]):
        tensors[f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"] = inv_freq.clone()
    save_file(tensors, weights, metadata={"format": "pt"})
    reference = _hf_load(tmp_path / "hf")  # transformers loads the folder, leaving the buffers out
    import_hf(tmp_path / "hf", tmp_path / "ours")  # was "unexpected 2 tensors: [...rotary_emb.inv_freq]"
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        diff = (reference(ids).logits.float() - load_model(tmp_path / "ours")(ids).logits).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_import_of_a_config_without_head_dim_reads_it_as_transformers_does(tmp_path, arch):
    """A config.json without head_dim: transformers' Qwen3Config takes 128 (Llama's and Qwen2's, hidden_size //
    num_attention_heads); the import took hidden_size // num_attention_heads for all and failed on a Qwen3 folder's
    shapes."""
    cls = getattr(transformers, arch)
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    sizes = {k: v for k, v in HF_TINY.items() if k != "head_dim"}
    torch.manual_seed(3)
    hf = _randomize(cls(config_cls(**sizes, max_position_embeddings=128))).eval()
    hf.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.pop("head_dim", None)  # as older or hand-written config.json files have it
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    reference = _hf_load(tmp_path / "hf")
    expected = 128 if arch == "Qwen3ForCausalLM" else 32 // 4  # transformers' own defaults
    assert reference.model.layers[0].self_attn.head_dim == expected
    import_hf(tmp_path / "hf", tmp_path / "ours")
    ours = load_model(tmp_path / "ours")
    assert ours.config.resolved_head_dim == expected
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        diff = (reference(ids).logits.float() - ours(ids).logits).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_import_of_a_qwen_config_without_num_key_value_heads_reads_32_as_transformers_does(tmp_path, arch):
    cls = getattr(transformers, arch)
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    sizes = dict(vocab_size=97, hidden_size=128, intermediate_size=48, num_hidden_layers=1, num_attention_heads=64)
    torch.manual_seed(4)
    hf = _randomize(cls(config_cls(**sizes, max_position_embeddings=128))).eval()
    hf.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.pop("num_key_value_heads")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    reference = _hf_load(tmp_path / "hf")
    assert reference.config.num_key_value_heads == 32  # Qwen2Config's and Qwen3Config's default, not 64
    import_hf(tmp_path / "hf", tmp_path / "ours")
    ours = load_model(tmp_path / "ours")
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        diff = (reference(ids).logits.float() - ours(ids).logits).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("quiet", [False, True])
def test_export_and_import_show_their_progress_in_a_pipe_and_write_what_safetensors_writes(
    tmp_path, capsys, monkeypatch, quiet
):
    """export and import wrote their weights in one safetensors call, minutes for a 1B model without a word. They now
    write a tensor at a time under a progress bar (plain lines in a pipe, none with --quiet; none for a file under
    PROGRESS_BYTES, set to 0 here); the file is byte for byte what safetensors' own save_file writes of the same
    tensors, and transformers loads the export's equal."""
    from safetensors.torch import load_file, save_file

    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)
    model = _randomize(tiny_lm(**BASE, num_key_value_heads=2, tie_word_embeddings=False))
    save_model(tmp_path / "ckpt", model)
    quiet_flag = ["--quiet"] if quiet else []
    assert (
        cli_main(["export", "--hf", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--dtype", "bf16", *quiet_flag]) == 0
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "model.safetensors" in line]
    assert (lines == []) if quiet else (lines and "100%" in lines[-1] and "\r" not in err), err
    expected = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    save_file(expected, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    exported = tmp_path / "hf" / "model.safetensors"
    assert exported.read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    hf = _hf_load(tmp_path / "hf")
    for name, tensor in expected.items():
        torch.testing.assert_close(hf.state_dict()[name], tensor, rtol=0, atol=0)
    capsys.readouterr()  # transformers' own bar of its loading

    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "back"), *quiet_flag]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "model.safetensors" in line]
    assert (lines == []) if quiet else (lines and "100%" in lines[-1] and "\r" not in err), err
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == exported.read_bytes()
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert back.keys() == expected.keys() and all(torch.equal(back[k], v) for k, v in expected.items())


def test_the_tensor_at_a_time_writer_writes_what_safetensors_writes_for_mixed_dtypes_and_shapes(tmp_path):
    from safetensors.torch import save_file

    from cookmind.model.model_io import write_safetensors

    tensors = {
        "b.bf16": torch.randn(3, 5).to(torch.bfloat16),
        "a.f32": torch.randn(7),
        "c.i64": torch.arange(6).view(2, 3),
        "d.scalar": torch.tensor(2.5),
        "e.empty": torch.zeros(0, 4),
        "f.u8": torch.arange(5, dtype=torch.uint8),
        "g.f16": torch.randn(2, 2).half(),
        "h.bool": torch.tensor([True, False, True]),
        "i.transposed": torch.randn(4, 3).t(),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "ref.safetensors", metadata={"x": "y"})
    write_safetensors(tensors, tmp_path / "ours.safetensors", metadata={"x": "y"}, progress=False)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}])
def test_the_tensor_at_a_time_writer_writes_safetensors_bytes_with_any_metadata_and_each_tied_tensor_in_full(
    tmp_path, metadata
):
    """write_safetensors promised save_file's bytes, byte for byte; with metadata={} save_file writes an empty
    "__metadata__" and ours wrote none. Tensors that share memory (tied weights), which save_file refuses, are each
    written in full, as save_file writes two tensors of the same values."""
    from safetensors.torch import load_file, save_file

    from cookmind.model.model_io import write_safetensors

    fused = torch.arange(12, dtype=torch.float32)
    tensors = {"w": torch.randn(3, 2), "q": fused[:6], "k": fused[6:]}  # views of one storage, side by side
    save_file(tensors, tmp_path / "ref.safetensors", metadata=metadata)
    write_safetensors(tensors, tmp_path / "ours.safetensors", metadata=metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()

    tied = torch.randn(4, 2)
    with pytest.raises(RuntimeError, match="share memory"):
        save_file({"embed": tied, "head": tied}, tmp_path / "refused.safetensors", metadata=metadata)
    write_safetensors({"embed": tied, "head": tied}, tmp_path / "tied.safetensors", metadata=metadata)
    save_file({"embed": tied, "head": tied.clone()}, tmp_path / "copies.safetensors", metadata=metadata)
    assert (tmp_path / "tied.safetensors").read_bytes() == (tmp_path / "copies.safetensors").read_bytes()
    back = load_file(tmp_path / "tied.safetensors")
    assert torch.equal(back["embed"], tied) and torch.equal(back["head"], tied)


@pytest.mark.parametrize("dtype", [[], ["--dtype", "bf16"]])
def test_a_safetensors_files_reading_is_under_the_writing_bar_not_a_bar_of_its_own(
    tmp_path, capsys, monkeypatch, dtype
):
    """safetensors maps a file and reads nothing until a tensor's bytes are used: a "reading" bar of its tensors
    reached 100% at once (151 GB/s), and the disk was read afterwards, under no bar (a --dtype cast of every tensor
    before the writing began) or the writing's. Each tensor is now cast and written in turn under the one writing
    bar, which is where its bytes are read; only the writing bar is shown (PROGRESS_BYTES 0 here)."""
    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)
    hf = _hf_qwen3(tmp_path / "hf", 0, max_shard_size="40KB")
    assert len(list((tmp_path / "hf").glob("model-0000*-of-0000*.safetensors"))) > 1
    capsys.readouterr()
    assert cli_main(["import", "--hf", str(tmp_path / "hf"), str(tmp_path / "ours"), *dtype]) == 0
    assert cli_main(["export", "--hf", str(tmp_path / "ours"), str(tmp_path / "back"), *dtype]) == 0
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if line.startswith("reading")], err
    assert [line for line in err if line.startswith("writing model.safetensors") and "100%" in line], err
    expected = {k: v.to(torch.bfloat16 if dtype else torch.float32) for k, v in hf.state_dict().items()}
    back = _hf_load(tmp_path / "back").state_dict()
    assert all(torch.equal(back[k], v) for k, v in expected.items())


def test_export_of_a_sharded_checkpoint_shows_its_shards_being_read(tmp_path, capsys, monkeypatch):
    """A sharded checkpoint's dcp/ was read in one torch.distributed.checkpoint call, silent however big; it is now
    read a group of tensors at a time under a progress bar (PROGRESS_BYTES 0 here), and exports the same weights."""
    from safetensors.torch import load_file

    from cookmind.optim import AdamW
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer

    monkeypatch.setattr("cookmind.model.model_io.PROGRESS_BYTES", 0)
    monkeypatch.setattr("cookmind.model.sharded_io.GROUP_BYTES", 4096)  # a few tensors a read
    model = _randomize(tiny_lm(**BASE, num_key_value_heads=2, tie_word_embeddings=False))
    run = tmp_path / "run" / "checkpoints"
    step = ShardedCheckpointer().save(run / "step_00000001", model, AdamW(model.parameters()), {"step": 1})
    capsys.readouterr()
    assert cli_main(["export", "--hf", str(step), str(tmp_path / "hf")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("reading dcp")]
    assert lines and "100%" in lines[-1]
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    expected = model.state_dict()
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], v) for k, v in expected.items())
