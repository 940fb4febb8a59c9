"""From-scratch building blocks against PyTorch's own ops and naive formulas written here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from lm_fixtures import tiny_lm
from torch import nn

from cookmind.model import CookMindConfig, CookMindLM, KVCache
from cookmind.model.activations import silu, softmax
from cookmind.model.cross_entropy import cross_entropy
from cookmind.model.embedding import Embedding
from cookmind.model.linear import Linear
from cookmind.model.moe import MoE
from cookmind.model.rmsnorm import RMSNorm
from cookmind.model.rope import RotaryEmbedding, apply_rope
from cookmind.model.sdpa import scaled_dot_product_attention
from cookmind.model.swiglu import SwiGLU

# the small shape the block and MoE tests below write out by hand: width 16, SwiGLU(16, 24), ids below 31
SMALL = dict(
    vocab_size=31,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def test_linear_matches_f_linear_and_init_is_truncated():
    lin = Linear(300, 200, std=0.02)
    x = torch.randn(2, 3, 300)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-6)
    assert lin.bias is None
    w = lin.weight.detach()
    assert w.abs().max() <= 0.06 + 1e-7  # truncated at 3 std
    assert abs(w.std().item() - 0.02) < 0.002  # truncation at 3 sigma shrinks std by ~1.3% only
    biased = Linear(4, 3, bias=True)
    torch.testing.assert_close(biased(x[..., :4]), F.linear(x[..., :4], biased.weight, biased.bias))


def test_truncated_normal_init_matches_the_analytic_distribution():
    from cookmind.model.init import truncated_normal_

    w = truncated_normal_(torch.empty(1_000_000), std=0.5)
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    mass = math.erf(3 / math.sqrt(2))  # P(|z| <= 3)
    expected_std = 0.5 * math.sqrt(1 - 6 * phi(3) / mass)  # variance of N(0,1) truncated to [-3, 3]
    assert w.abs().max() <= 1.5
    assert abs(w.std().item() - expected_std) < 0.003
    within_1 = (w.abs() <= 0.5).float().mean().item()
    assert abs(within_1 - math.erf(1 / math.sqrt(2)) / mass) < 0.002


def test_embedding_matches_f_embedding():
    emb = Embedding(50, 8)
    ids = torch.randint(0, 50, (3, 7))
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_nn_rmsnorm(dtype):
    ours, ref = RMSNorm(48, eps=1e-5), nn.RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        w = torch.randn(48)
        ours.weight.copy_(w)
        ref.weight.copy_(w)
    x = torch.randn(4, 9, 48) * 5
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    xb, ob, rb = x.to(dtype), ours.to(dtype), ref.to(dtype)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(ob(xb).float(), rb(xb).float(), rtol=tol, atol=tol)


def test_silu_and_stable_softmax():
    x = torch.randn(1000) * 10
    torch.testing.assert_close(silu(x), F.silu(x), rtol=1e-6, atol=1e-6)
    big = torch.tensor([[1000.0, 1001.0, 999.0], [-1e4, 0.0, float("-inf")]])
    out = softmax(big, dim=-1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(big, dim=-1))
    y = torch.randn(3, 4, 5)
    torch.testing.assert_close(softmax(y, dim=1), torch.softmax(y, dim=1))


def test_swiglu_formula():
    ffn = SwiGLU(16, 40)
    x = torch.randn(2, 5, 16)
    ref = F.linear(F.silu(F.linear(x, ffn.gate_proj.weight)) * F.linear(x, ffn.up_proj.weight), ffn.down_proj.weight)
    torch.testing.assert_close(ffn(x), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 2, 2)])
def test_sdpa_matches_torch_with_bool_mask_and_leading_dims(lead):
    t, s, d = 5, 7, 8
    q, k, v = torch.randn(*lead, t, d), torch.randn(*lead, s, d), torch.randn(*lead, s, d)
    mask = torch.rand(*lead, t, s) > 0.4
    mask[..., 0] = True  # every query may attend somewhere
    ours = scaled_dot_product_attention(q, k, v, mask)
    ref_lead = (1,) if not lead else lead  # torch's op wants at least one batch dim
    ref = F.scaled_dot_product_attention(
        q.reshape(*ref_lead, t, d),
        k.reshape(*ref_lead, s, d),
        v.reshape(*ref_lead, s, d),
        attn_mask=mask.reshape(*ref_lead, t, s),
    )
    torch.testing.assert_close(ours, ref.reshape(ours.shape), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v),
        F.scaled_dot_product_attention(
            q.reshape(*ref_lead, t, d), k.reshape(*ref_lead, s, d), v.reshape(*ref_lead, s, d)
        ).reshape(ours.shape),
        rtol=1e-5,
        atol=1e-5,
    )


def test_rope_rotates_pairs_by_position_times_frequency():
    d, theta = 8, 10000.0
    rope = RotaryEmbedding(d, theta)
    x = torch.randn(2, 3, 4, d)  # (B, H, T, D)
    pos = torch.tensor([[0, 1, 2, 3], [7, 3, 100, 5]])
    cos, sin = rope(pos, torch.float32)
    ours = apply_rope(x, cos, sin)
    # naive: pair (x[i], x[i + d/2]) is the complex number x[i] + j x[i+d/2], multiplied by e^{j pos w_i}
    ref = torch.empty_like(x)
    for b in range(2):
        for t in range(4):
            for i in range(d // 2):
                ang = pos[b, t].item() * theta ** (-2 * i / d)
                z = torch.complex(x[b, :, t, i], x[b, :, t, i + d // 2]) * complex(math.cos(ang), math.sin(ang))
                ref[b, :, t, i], ref[b, :, t, i + d // 2] = z.real, z.imag
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # relative: q.k depends only on the position difference
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)

    def score(pq, pk):
        cq, sq = rope(torch.tensor([[pq]]), torch.float32)
        ck, sk = rope(torch.tensor([[pk]]), torch.float32)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    torch.testing.assert_close(score(10, 3), score(57, 50), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "rs",
    [
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
        },
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32, "attention_factor": 1.3},
    ],
)
def test_yarn_matches_transformers(rs):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, theta = 16, 10000.0
    hf_cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=d,
        max_position_embeddings=512,
        rope_parameters={"rope_theta": theta, **rs},
    )
    inv_ref, att_ref = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    rope = RotaryEmbedding(d, theta, rs)
    torch.testing.assert_close(rope.inv_freq, inv_ref.float(), rtol=1e-6, atol=1e-9)
    assert rope.attention_factor == pytest.approx(att_ref)
    if "attention_factor" not in rs:
        assert rope.attention_factor == pytest.approx(0.1 * math.log(rs["factor"]) + 1)


@pytest.mark.parametrize(
    "rs",
    [
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "linear", "factor": 3.0},
    ],
)
def test_llama3_and_linear_rope_match_transformers(rs):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, theta = 32, 500000.0
    hf_cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        head_dim=d,
        max_position_embeddings=512,
        rope_parameters={"rope_theta": theta, **rs},
    )
    inv_ref, att_ref = ROPE_INIT_FUNCTIONS[rs["rope_type"]](hf_cfg, "cpu")
    rope = RotaryEmbedding(d, theta, rs)
    torch.testing.assert_close(rope.inv_freq, inv_ref.float(), rtol=1e-6, atol=1e-12)
    assert rope.attention_factor == att_ref == 1.0


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_attention_backends_agree_with_mask_cache_and_gqa(qk_norm, kv_heads):
    kw = dict(vocab_size=61, intermediate_size=48, num_key_value_heads=kv_heads, qk_norm=qk_norm)
    naive = tiny_lm(**kw, attn_backend="naive").eval()
    sdpa = tiny_lm(**kw, attn_backend="sdpa").eval()
    sdpa.load_state_dict(naive.state_dict())
    cudnn = tiny_lm(**kw, attn_backend="cudnn").eval()  # on CPU: PyTorch's own order
    cudnn.load_state_dict(naive.state_dict())
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(naive(ids).logits, sdpa(ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(naive(ids).logits, cudnn(ids).logits, rtol=1e-5, atol=1e-5)
        # left padding: row 0 has 3 pad slots that nobody may attend to; explicit positions skip them
        mask = torch.tril(torch.ones(9, 9, dtype=torch.bool)).expand(2, 1, 9, 9).clone()
        mask[0, :, :, :3] = False
        mask[0, :, :3, :3] = torch.eye(3, dtype=torch.bool)  # pad queries see themselves only
        pos = torch.stack([torch.clamp(torch.arange(9) - 3, min=0), torch.arange(9)])
        outs = []
        for m in (naive, sdpa):
            cache = KVCache(m.config, 2, 12)
            a = m(ids[:, :7], position_ids=pos[:, :7], attention_mask=mask[:, :, :7, :7], kv_cache=cache).logits
            b = m(ids[:, 7:], position_ids=pos[:, 7:], attention_mask=mask[:, :, 7:, :9], kv_cache=cache).logits
            full = m(ids, position_ids=pos, attention_mask=mask).logits
            torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-5, atol=1e-5)
            outs.append(full)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        # the padded row's real tokens equal the unpadded sequence on its own
        alone = naive(ids[:1, 3:]).logits
        torch.testing.assert_close(outs[0][:1, 3:], alone, rtol=1e-4, atol=1e-4)


def test_prenorm_block_composes_attention_and_ffn():
    from cookmind.model.block import Block

    cfg = CookMindConfig(**SMALL)
    block = Block(cfg, 0)
    with torch.no_grad():
        block.input_layernorm.weight.uniform_(0.5, 1.5)
        block.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 16)
    cos, sin = RotaryEmbedding(8)(torch.arange(5).expand(2, 5), torch.float32)
    y, aux = block(x, cos, sin)
    rms = lambda t, w: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w  # noqa: E731
    h = x + block.self_attn(rms(x, block.input_layernorm.weight), cos, sin)
    torch.testing.assert_close(y, h + block.mlp(rms(h, block.post_attention_layernorm.weight)), rtol=1e-5, atol=1e-6)
    assert aux is None


def test_kv_cache_rejects_a_mask_shorter_than_the_cache():
    cfg = CookMindConfig(**SMALL)
    model = CookMindLM(cfg)
    cache = KVCache(cfg, 1, 8)
    model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="attention_mask covers 3 key slots"):
        model(
            torch.zeros(1, 1, dtype=torch.long), attention_mask=torch.ones(1, 1, 1, 3, dtype=torch.bool), kv_cache=cache
        )


def test_flash_triton_backend_is_a_clear_error_on_cpu():
    model = CookMindLM(CookMindConfig(**SMALL, attn_backend="flash-triton"))
    with pytest.raises(RuntimeError, match="flash-triton.*CUDA"):
        model(torch.randint(0, 31, (1, 4)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_matches_torch(dtype):
    logits = (torch.randn(4, 6, 33) * 4).to(dtype)
    targets = torch.randint(0, 33, (4, 6))
    targets[1, 2:] = -100
    ours = cross_entropy(logits, targets)
    assert ours.dtype == torch.float32
    ref = F.cross_entropy(logits.float().reshape(-1, 33), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        cross_entropy(logits, targets, reduction="sum"),
        F.cross_entropy(logits.float().reshape(-1, 33), targets.reshape(-1), reduction="sum"),
        rtol=1e-6,
        atol=1e-5,
    )
    assert cross_entropy(logits, torch.full_like(targets, -100)) == 0  # all ignored: 0, not NaN


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_gradient_matches_torch(dtype, reduction):
    # our backward is written out (softmax - onehot); autograd through F.cross_entropy is the reference
    logits = (torch.randn(3, 5, 29) * 3).to(dtype)
    targets = torch.randint(0, 29, (3, 5))
    targets[0, :2] = -100
    weights = torch.rand(3, 5)  # a non-uniform upstream gradient for reduction="none"
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = cross_entropy(ours_in, targets, reduction=reduction)
    ref = F.cross_entropy(ref_in.float().reshape(-1, 29), targets.reshape(-1), reduction=reduction)
    if reduction == "none":
        ours, ref = (ours * weights).sum(), (ref.view(3, 5) * weights).sum()
    ours.backward()
    ref.backward()
    assert ours_in.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=tol, atol=tol)
    assert ours_in.grad[0, :2].abs().max() == 0  # ignored positions get no gradient


def test_cross_entropy_compiled_form_matches_torch():
    # under torch.compile the loss takes its other spelling (logsumexp + one-hot backward): same values
    logits = torch.randn(6, 19) * 3
    targets = torch.randint(0, 19, (6,))
    targets[1] = -100
    ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    loss = torch.compile(cross_entropy, backend="aot_eager", fullgraph=True)(ours_in, targets)
    loss.backward()
    ref = F.cross_entropy(ref_in, targets)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-6, atol=1e-6)


def test_moe_with_one_expert_equals_dense_ffn():
    cfg = CookMindConfig(**SMALL, num_experts=1, num_experts_per_tok=1)
    moe = MoE(cfg)
    dense = SwiGLU(16, 24)
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(3, 5, 16)
    y, aux = moe(x)
    torch.testing.assert_close(y, dense(x), rtol=1e-6, atol=1e-6)
    assert aux.item() == pytest.approx(1.0)  # E * f * P = 1 * 1 * 1


def test_moe_topk_routing_and_balance_loss_match_naive_loop():
    cfg = CookMindConfig(
        **{**SMALL, "hidden_size": 8, "intermediate_size": 12},
        num_experts=4,
        num_experts_per_tok=2,
        moe_shared_expert=True,
    )
    moe = MoE(cfg)
    x = torch.randn(2, 6, 8)
    y, aux = moe(x)
    xf = x.reshape(-1, 8)
    probs = torch.softmax(xf @ moe.gate.weight.t(), dim=-1)
    ref = torch.zeros_like(xf)
    counts = torch.zeros(4)
    for n in range(xf.shape[0]):
        top = torch.argsort(probs[n], descending=True)[:2]
        w = probs[n, top] / probs[n, top].sum()
        for j, e in enumerate(top.tolist()):
            ref[n] += w[j] * moe.experts[e](xf[n : n + 1])[0]
            counts[e] += 1
        ref[n] += moe.shared_expert(xf[n : n + 1])[0]
    torch.testing.assert_close(y.reshape(-1, 8), ref, rtol=1e-5, atol=1e-6)
    ref_aux = 4 * ((counts / counts.sum()) * probs.mean(0)).sum()
    torch.testing.assert_close(aux, ref_aux, rtol=1e-5, atol=1e-6)


def test_moe_model_loss_includes_aux_and_trains():
    cfg = CookMindConfig(**{**SMALL, "num_hidden_layers": 2}, num_experts=3, num_experts_per_tok=2)
    model = CookMindLM(cfg)
    ids = torch.randint(0, 31, (2, 8))
    out = model(ids, labels=ids)
    ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, 31), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, ce + out.aux_loss)
    out.loss.backward()
    assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0  # router learns through the weights


def test_rope_prefix_tables_equal_computed_positions():
    """RotaryEmbedding.prefix (the fp32 tables the compiled step slices) gives exactly forward's cos/sin,
    inside the tables and past their end (computed)."""
    rope = RotaryEmbedding(16, 10000.0, None, max_positions=32)
    assert rope.cos_table.shape == (32, 16) and "cos_table" not in rope.state_dict()
    for start, length in [(0, 1), (0, 32), (5, 20), (30, 10)]:  # the last one runs past the table
        pos = torch.arange(start, start + length)[None]
        for dtype in (torch.float32, torch.bfloat16):
            cos, sin = rope(pos, dtype)
            pcos, psin = rope.prefix(start, length, dtype, torch.device("cpu"))
            assert pcos.shape == (1, length, 16) and pcos.dtype == dtype
            assert torch.equal(pcos, cos) and torch.equal(psin, sin)
    # an independent check of one entry: position 3, pair 1 turns by 3 * 10000^(-2/16)
    angle = torch.tensor(3 * 10000.0 ** (-2 / 16))
    assert torch.allclose(rope.prefix(3, 1, torch.float32, torch.device("cpu"))[0][0, 0, 1], angle.cos())


def test_rope_stays_fp32_when_the_model_is_cast_to_bf16(tmp_path):
    """model.to(bfloat16) (every bf16 load: serve and generate on a GPU, a bf16-stored checkpoint) cast the RoPE
    frequencies and tables with the weights: a bf16 inv_freq put position 2000's angles up to 2.4 radians off.
    They stay fp32 now, and a bf16-loaded model's cos/sin at positions up to 4000 equal the float64 angles
    pos * theta^(-2i/D) rounded once to the output dtype (within fp32's own error on the angle)."""
    from cookmind.model import load_model, save_model

    rope = RotaryEmbedding(128, 10000.0, None, max_positions=4096)
    fp32 = {n: b.clone() for n, b in rope.named_buffers()}
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.to("cpu", torch.bfloat16)):
        cast(rope)
        for n, b in rope.named_buffers():
            assert b.dtype == torch.float32 and torch.equal(b, fp32[n]), n
    model = tiny_lm()
    save_model(tmp_path / "m", model.to(torch.bfloat16))
    loaded = load_model(tmp_path / "m", dtype=torch.bfloat16)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    emb = loaded.model.rotary_emb
    assert emb.inv_freq.dtype == torch.float32
    d, theta = emb.inv_freq.numel() * 2, loaded.config.rope_theta
    pos = torch.tensor([[0, 1, 999, 2000, 4000]])
    want = pos.double()[..., None] * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, _ = emb(pos, torch.float32)
    err = (cos[..., : d // 2].double() - want.cos()).abs().max().item()
    assert err < 4000 * 2**-23 * 4, err  # the fp32 angle's rounding at position 4000; a bf16 inv_freq gave ~1
