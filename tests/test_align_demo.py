"""The demo's RL stage on a tiny model: its outputs (before/after, curves PNG, loadable checkpoint)."""

import json

import pytest
import torch
from test_align_fixtures import one_torch_thread  # noqa: F401


def test_demo_stage_contract(tmp_path):
    pytest.importorskip("cookmind.model")
    from dataclasses import replace

    from cookmind.align.demo import QUICK_GRPO, demo_stage
    from cookmind.model import CookMindConfig, CookMindLM, load_model
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    problems = [{"question": f"Ann has {a} pens. She gets {b} more. How many?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
                for a in range(1, 5) for b in range(1, 4)]
    (tmp_path / "c.txt").write_text("\n".join(p["question"] + " " + p["answer"] for p in problems))
    vocab, merges = train_bpe(tmp_path / "c.txt", 290, DEFAULT_SPECIAL_TOKENS)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))
    res = demo_stage(model, tok, problems[:8], problems[8:], tmp_path / "grpo", seed=0, time_budget_s=60,
                     cfg=replace(QUICK_GRPO, eval_every=1, eval_size=4), progress=False)
    assert res["steps"] == 2 and 0.0 <= res["accuracy_before"] <= 1.0 and 0.0 <= res["accuracy"] <= 1.0
    assert res["gain_points"] == pytest.approx(100 * (res["accuracy"] - res["accuracy_before"]))
    png = (tmp_path / "grpo" / "grpo_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    log = [json.loads(line) for line in (tmp_path / "grpo" / "grpo_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all("eval_accuracy" in r for r in log)
    saved = load_model(res["checkpoint"])
    for a, b in zip(saved.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert json.loads((tmp_path / "grpo" / "grpo_result.json").read_text())["accuracy"] == res["accuracy"]
