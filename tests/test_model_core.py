"""Core model contract: config, forward, loss, KV cache, save/load errors (docs/INTERFACES.md)."""

from __future__ import annotations

import json

import lm_fixtures
import pytest
import torch
import torch.nn.functional as F

from cookmind.model import CookMindConfig, CookMindLM, KVCache, LMOutput, ModelLoadError, load_model, save_model

TINY = {**lm_fixtures.TINY, "vocab_size": 97}  # the ids and shapes below are written for 97


def test_config_roundtrip_and_unknown_keys():
    cfg = CookMindConfig(**TINY, qk_norm=True)
    assert CookMindConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown keys.*bogus"):
        CookMindConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        CookMindConfig(**{**TINY, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="rope_type"):
        CookMindConfig(**TINY, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="attn_backend"):
        CookMindConfig(**TINY, attn_backend="cuda-magic")


def test_forward_shapes_and_loss_matches_torch_cross_entropy():
    model = CookMindLM(CookMindConfig(**TINY))
    ids = torch.randint(0, 97, (3, 12))
    labels = ids.clone()
    labels[0, :5] = -100
    out = model(ids, labels=labels)
    assert isinstance(out, LMOutput) and out.aux_loss is None
    assert out.logits.shape == (3, 12, 97) and out.logits.dtype == torch.float32
    ref = F.cross_entropy(out.logits[:, :-1].reshape(-1, 97), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, ref, rtol=1e-6, atol=1e-6)
    out.loss.backward()
    assert model.model.embed_tokens.weight.grad is not None
    lean = model(ids, labels=labels, return_logits=False)
    assert lean.logits is None
    torch.testing.assert_close(lean.loss, out.loss, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(ids).logits.dtype == torch.float32  # fp32 whatever the matmul dtype


def test_tied_embeddings_share_one_matrix():
    tied = CookMindLM(CookMindConfig(**TINY, tie_word_embeddings=True))
    untied = CookMindLM(CookMindConfig(**TINY, tie_word_embeddings=False))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert untied.num_parameters() - tied.num_parameters() == 97 * 32


@pytest.mark.parametrize("backend", ["naive", "sdpa", "cudnn"])
def test_kv_cache_decoding_equals_full_forward(backend):
    cfg = CookMindConfig(**TINY, attn_backend=backend)
    model = CookMindLM(cfg).eval()
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        full = model(ids).logits
        cache = KVCache(cfg, batch_size=2, max_seq_len=16)
        parts = [model(ids[:, :5], kv_cache=cache).logits]  # prefill
        parts += [model(ids[:, 5:8], kv_cache=cache).logits]  # a chunk
        parts += [model(ids[:, i : i + 1], kv_cache=cache).logits for i in range(8, 11)]  # decode
    assert cache.seq_len == 11
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    cache.truncate(5)
    with torch.no_grad():
        again = model(ids[:, 5:6], kv_cache=cache).logits
    torch.testing.assert_close(again, full[:, 5:6], rtol=1e-5, atol=1e-5)
    cache.reset()
    assert cache.seq_len == 0
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(2, 17, dtype=torch.long), kv_cache=cache)


def test_save_load_roundtrip(tmp_path):
    model = CookMindLM(CookMindConfig(**TINY, tie_word_embeddings=False, qk_norm=True))
    save_model(tmp_path / "m", model)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_model(tmp_path / "m")
    ids = torch.randint(0, 97, (1, 7))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    bf16 = load_model(tmp_path / "m", dtype=torch.bfloat16)
    assert bf16.lm_head.weight.dtype == torch.bfloat16


def test_save_model_into_existing_dir_keeps_other_files_and_unwraps(tmp_path):
    model = CookMindLM(CookMindConfig(**TINY))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "meta.json").write_text("{}")
    wrapped = torch.nn.Module()
    wrapped.module = model  # the DDP-style wrapper shape
    save_model(tmp_path / "ckpt", wrapped)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "meta.json", "model.safetensors"]
    ids = torch.randint(0, 97, (1, 5))
    torch.testing.assert_close(load_model(tmp_path / "ckpt")(ids).logits, model(ids).logits, rtol=0, atol=0)
    with pytest.raises(TypeError, match="expected a CookMindLM"):
        save_model(tmp_path / "x", torch.nn.Linear(2, 2))


def test_load_errors_name_file_and_mismatch(tmp_path):
    save_model(tmp_path / "a", CookMindLM(CookMindConfig(**TINY)))
    save_model(tmp_path / "b", CookMindLM(CookMindConfig(**{**TINY, "hidden_size": 48})))
    # weights of another shape under a config that disagrees
    (tmp_path / "b" / "config.json").write_text((tmp_path / "a" / "config.json").read_text())
    with pytest.raises(ModelLoadError, match=r"b/model\.safetensors.*shape mismatch.*embed_tokens"):
        load_model(tmp_path / "b")
    # truncated weights
    w = tmp_path / "a" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"a/model\.safetensors.*truncated"):
        load_model(tmp_path / "a")
    # missing weights / missing config
    w.unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: missing"):
        load_model(tmp_path / "a")
    with pytest.raises(ModelLoadError, match=r"config\.json: missing"):
        load_model(tmp_path / "b" / "..")  # a folder, but no model
    # a path that is not there, or a run that has saved nothing yet, says that (not "config.json: missing")
    with pytest.raises(ModelLoadError, match=r"nowhere: no such directory; name a checkpoint, a training run"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match=r"run: a training run without a complete checkpoint"):
        load_model(tmp_path / "run")
    # a run still before its first save: config.yaml and metrics.jsonl, no checkpoints/ yet
    (tmp_path / "young").mkdir()
    (tmp_path / "young" / "config.yaml").write_text("train: {}\n")
    with pytest.raises(ModelLoadError, match=r"young: a training run without a complete checkpoint"):
        load_model(tmp_path / "young")


def test_flops_per_token_formula():
    cfg = CookMindConfig(**TINY, tie_word_embeddings=True)
    model = CookMindLM(cfg)
    d, hd, L = 32, 8, 2
    per_layer = d * 4 * hd + 2 * d * 2 * hd + 4 * hd * d + 3 * d * 64  # q, k+v, o, gate/up/down
    n = L * per_layer + 97 * d  # + LM head (tied, still a matmul)
    assert model.flops_per_token(20) == 6 * n + 12 * L * 4 * hd * 20


def test_tiny_model_memorises_a_repeated_sequence():
    from cookmind.optim import AdamW, param_groups

    torch.manual_seed(0)
    cfg = CookMindConfig(**{**TINY, "vocab_size": 16})  # the sequence below uses ids below 16
    model = CookMindLM(cfg)
    opt = AdamW(param_groups(model, 0.01), lr=1e-2)
    seq = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]])
    first = None
    for _ in range(60):
        loss = model(seq, labels=seq).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.0 and loss.item() < 0.1
    with torch.no_grad():  # greedy continuation from the first 4 tokens reproduces the rest
        ids = seq[:, :4]
        for _ in range(16):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert ids.tolist() == seq.tolist()
