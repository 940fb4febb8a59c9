"""The real-size presets (qwen3-0.6b, llama-1.3b) load, validate and build at the hand-counted size (on the meta
device: nothing is allocated), and a vocabulary that does not fit the data is refused or reported (#18.4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cookmind.model import CookMindConfig, CookMindLM
from cookmind.store.writer import write_store
from cookmind.train import TrainConfig, Trainer
from tests.lm_fixtures import TINY


def _hand_count(vocab, d, layers, q_heads, kv_heads, head_dim, ffn, tied, qk_norm):
    """(all parameters, matmul weights) of a Llama/Qwen3 decoder counted by hand. Matmul weights: q/k/v/o, the
    SwiGLU's three and the LM head (counted even when tied: it is a GEMM), not the embedding gather or norms."""
    attn = d * q_heads * head_dim + 2 * d * kv_heads * head_dim + q_heads * head_dim * d
    norms = 2 * d + (2 * head_dim if qk_norm else 0)
    total = vocab * d * (1 if tied else 2) + layers * (attn + 3 * d * ffn + norms) + d
    return total, layers * (attn + 3 * d * ffn) + vocab * d


PRESETS = {
    # Qwen3-0.6B's published shape: 596,049,920 parameters with the embedding tied
    "qwen3-0.6b": dict(
        vocab=151936, d=1024, layers=28, q_heads=16, kv_heads=8, head_dim=128, ffn=3072, tied=True, qk_norm=True
    ),
    "llama-1.3b": dict(
        vocab=32768, d=2048, layers=24, q_heads=16, kv_heads=8, head_dim=128, ffn=5632, tied=False, qk_norm=False
    ),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_builds_at_the_hand_counted_size_on_the_meta_device(name):
    shape = PRESETS[name]
    cfg = TrainConfig.load(name)
    assert cfg.train.precision == "bf16" and cfg.train.compile and not cfg.train.activation_checkpointing
    assert cfg.data.window_size <= cfg.model["max_position_embeddings"]
    with torch.device("meta"):
        model = CookMindLM(CookMindConfig.from_dict(cfg.model))
    assert next(model.parameters()).device.type == "meta"
    total, n_matmul = _hand_count(**shape)
    assert model.num_parameters() == total
    assert model.config.resolved_head_dim == shape["head_dim"]
    assert model.config.qk_norm is shape["qk_norm"] and model.config.tie_word_embeddings is shape["tied"]
    t = cfg.data.window_size
    assert model.flops_per_token(t) == 6 * n_matmul + 12 * shape["layers"] * shape["q_heads"] * shape["head_dim"] * t
    low, high = (0.55e9, 0.65e9) if name == "qwen3-0.6b" else (1.2e9, 1.35e9)
    assert low < total < high


def _store(path, vocab, n=8, length=40):
    rng = np.random.default_rng(0)
    return write_store(path, "seq", [{"sequence": rng.integers(0, vocab, length)} for _ in range(n)], vocab_size=vocab)


def _cfg(tmp_path, store, vocab):
    return TrainConfig.from_dict(
        {
            "model": {**TINY, "vocab_size": vocab},
            "data": {"train_path": str(store), "window_size": 16},
            "train": {"max_steps": 1, "micro_batch_size": 2},
            "checkpoint": {"every": 0},
            "logging": {"run_dir": str(tmp_path / "run"), "progress": False, "report": False},
        }
    )


def test_a_store_with_more_token_ids_than_the_model_is_refused_naming_both(tmp_path):
    store = _store(tmp_path / "s", 300)
    with pytest.raises(ValueError) as info:
        Trainer(_cfg(tmp_path, store, 64))
    msg = str(info.value)
    assert "model.vocab_size has 64" in msg and f"data.train_path={store}" in msg and "300" in msg
    assert "model.vocab_size=300" in msg  # says what to do


def test_a_model_vocabulary_larger_than_the_store_trains_and_says_how_many_rows_never_train(tmp_path, capsys):
    store = _store(tmp_path / "s", 48)
    Trainer(_cfg(tmp_path, store, 64)).fit()
    err = capsys.readouterr().err
    # 16 unused rows of a 32-wide tied embedding
    assert "16 rows (512 parameters) never train; set model.vocab_size=48" in err


@pytest.mark.parametrize("name, arch", [("qwen3-0.6b", "Qwen3ForCausalLM"), ("llama-1.3b", "LlamaForCausalLM")])
def test_the_bench_peer_is_transformers_model_of_the_preset_architecture_with_the_same_flops(name, arch):
    # bench/bench_train.py --shape NAME --tiny: the transformers peer keeps the preset's architecture (QK-norm,
    # tying, GQA) and its MFU numerator, counted on its own nn.Linear modules, matches the hand count
    from bench.bench_train import TINY as SHRUNK
    from bench.bench_train import hf_flops_per_token, hf_peer, preset_run

    shape, batch, t = preset_run(name, tiny=True, seq=None)
    model = hf_peer(shape)
    assert type(model).__name__ == arch
    hand = dict(PRESETS[name], vocab=SHRUNK["vocab_size"], d=SHRUNK["hidden_size"], ffn=SHRUNK["intermediate_size"])
    heads = SHRUNK["num_attention_heads"]
    hand.update(layers=SHRUNK["num_hidden_layers"], q_heads=heads, kv_heads=SHRUNK["num_key_value_heads"])
    hand.update(head_dim=SHRUNK["head_dim"])
    total, n_matmul = _hand_count(**hand)
    assert sum(p.numel() for p in model.parameters()) == total
    assert hf_flops_per_token(model, t) == 6 * n_matmul + 12 * hand["layers"] * heads * hand["head_dim"] * t


def test_the_bench_peer_accumulating_two_micro_batches_takes_the_step_of_one_batch_of_both():
    # bench/bench_train.py --accum 2: the transformers peer's step over two micro-batches of one row must equal
    # its step over one batch of those two rows (equal-length rows: the mean loss is the mean of the halves)
    from bench.bench_train import hf_step, preset_run

    shape, _, t = preset_run("qwen3-0.6b", tiny=True, seq=16)
    cpu = torch.device("cpu")
    step_a, model_a = hf_step(shape, 1, t, cpu, "fp32", False, accum=2)
    step_b, model_b = hf_step(shape, 2, t, cpu, "fp32", False, accum=1)
    before = [p.detach().clone() for p in model_a.parameters()]
    loss_a, norm_a = step_a(0)
    loss_b, norm_b = step_b(0)
    torch.testing.assert_close(norm_a, norm_b, rtol=1e-5, atol=1e-6)
    moved = False
    for p0, pa, pb in zip(before, model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
        moved |= not torch.equal(p0, pa)
    assert moved  # the step changed the weights: the comparison is not of two untouched models
