"""bench/probe_fp8_head_tail.py: the FP8 head's loss gradient in e4m3 x256 loses the unused ids' small entries."""

from __future__ import annotations

import json

import torch

from bench import probe_fp8_head_tail as P


def test_e4m3_at_the_heads_scale_rounds_small_gradient_entries_to_zero_and_e5m2_keeps_them():
    # the premise, on torch's own float8 rounding: below 2^-10 / 256 an e4m3 entry is zero, e5m2 x2^15 keeps it
    g = torch.tensor([1e-3, 1e-5, 3.7e-6, 3.9e-6, 1e-7])
    e4 = (g * 256).to(torch.float8_e4m3fn).float() / 256
    e5 = (g * 32768).to(torch.float8_e5m2).float() / 32768
    assert e4.tolist()[:2] != [0, 0] and e4[2] == 0 and e4[3] != 0 and e4[4] == 0
    assert (e5 != 0).all()


def test_the_heads_unused_rows_get_no_gradient_with_g_in_e4m3_and_do_with_e5m2():
    # a head whose 64 used ids hold most of the mass: each of the 131,008 unused ids is left below 3.8e-6, so
    # with G in e4m3 x256 their rows of W get an exactly zero gradient (nothing pushes their logits down)
    torch.manual_seed(0)
    vocab, used = 131072, 64
    h = torch.randn(32, 16)
    w = torch.randn(vocab, 16) * 0.01
    w[:used] = torch.randn(used, 16) * 4.0  # the used ids' logits are large
    y = torch.randint(0, used, (32,))
    tail = torch.arange(used, vocab)
    grads = {}
    for way in P.WAYS:
        operands, dtype, scale, _ = P.WAYS[way]
        wp = w.clone().requires_grad_()
        P.EmulatedHead.apply(h, wp, y, operands, dtype, scale, tail).backward()
        grads[way] = (wp.grad[used:].abs().sum(-1) > 0).float().mean().item()  # share of unused rows moved
    assert grads["fp32"] == 1.0 and grads["fp8-g-e5m2"] == 1.0
    assert grads["fp8"] == 0.0 and grads["g-e4m3"] == 0.0


def test_probe_prints_a_line_a_way(capsys):
    assert P.main(["--vocab", "2048", "--used", "64", "--steps", "3", "--batch", "16", "--width", "8"]) == 0
    lines = {r["way"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert list(lines) == list(P.WAYS)
    assert all(r["vocab"] == 2048 and 0 < r["unused_mass"] < 1 for r in lines.values())
