"""The demo's RL stage on a tiny model: its outputs (before/after, curves PNG, loadable checkpoint, report)."""

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
    def fresh_model():
        torch.manual_seed(0)
        return CookMindLM(CookMindConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))

    model = fresh_model()
    cfg = replace(QUICK_GRPO, eval_every=1, eval_size=4)
    res = demo_stage(model, tok, problems[:8], problems[8:], tmp_path / "grpo", seed=0, time_budget_s=60, cfg=cfg,
                     progress=False)
    assert res["steps"] == 2 and 0.0 <= res["accuracy_before"] <= 1.0 and 0.0 <= res["accuracy"] <= 1.0
    assert res["stopped_early"] is False and res["train_problems_seen"] == 4  # stream: 2 steps x 2 fresh problems
    assert [c["step"] for c in res["curve"]] == [0, 1, 2]
    # wrong->right minus right->wrong is the accuracy change, counted problem by problem
    assert res["heldout_fixed"] - res["heldout_broken"] == round(4 * (res["accuracy"] - res["accuracy_before"]))
    assert res["gain_points"] == pytest.approx(100 * (res["accuracy"] - res["accuracy_before"]))
    png = (tmp_path / "grpo" / "grpo_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    log = [json.loads(line) for line in (tmp_path / "grpo" / "grpo_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all("eval_accuracy" in r for r in log)
    saved = load_model(res["checkpoint"])
    for a, b in zip(saved.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert json.loads((tmp_path / "grpo" / "grpo_result.json").read_text())["accuracy"] == res["accuracy"]

    # a fixed number of steps under one seed: a second run gives the same rollouts, rewards and accuracy
    again = demo_stage(fresh_model(), tok, problems[:8], problems[8:], tmp_path / "grpo2", seed=0, time_budget_s=60,
                       cfg=cfg, progress=False)
    log2 = [json.loads(line) for line in (tmp_path / "grpo2" / "grpo_log.jsonl").read_text().splitlines()]
    strip = ("seconds", "rollout_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in log2] == \
        [{k: v for k, v in r.items() if k not in strip} for r in log]
    assert again["accuracy"] == res["accuracy"] and again["curve"] == res["curve"]

    assert 0.0 <= res["sampled_accuracy"] <= res["pass_at_k"] <= 1.0
    # at temperature 0 every one of the k samples is the greedy answer: pass@k is the greedy accuracy
    from cookmind.align.demo import pass_at_k
    from cookmind.align.grpo import evaluate_accuracy

    greedy = replace(cfg, temperature=0.0)
    sampled = pass_at_k(model, tok, problems[8:], greedy, k=3)
    assert sampled["pass_at_k"] == sampled["pass_at_1"] == evaluate_accuracy(model, tok, problems[8:], greedy)["accuracy"]

    # the wall-clock guard is a safety stop: when it fires, the result says so
    cut = demo_stage(fresh_model(), tok, problems[:8], problems[8:], tmp_path / "grpo3", seed=0, time_budget_s=0.0,
                     cfg=cfg, progress=False)
    assert cut["steps"] == 1 and cut["stopped_early"] is True

    # the demo report carries the RL section: before/after, the curves PNG, the guard
    from cookmind.demo import DemoContext, write_demo_report

    ctx = DemoContext(workdir=tmp_path, progress=False)
    ctx.results = {"eval_sft": {"accuracy": 0.25, "answered_in_format": 1.0, "shows_working": 0.1, "n": 4}, "grpo": res}
    report = write_demo_report(ctx).read_text()
    assert "## RL stage: GRPO on fresh problems" in report and "![GRPO curves](grpo/grpo_curves.png)" in report
    assert f"{100 * res['accuracy']:.1f}%" in report and "the wall-clock guard did not fire" in report


def test_shows_working_spots_a_written_step():
    from cookmind.align.demo import shows_working

    assert shows_working("3 + 4 = 7\n7 - 2 = 5\n#### 5")
    assert shows_working("12 * 3 = 36\n#### 36")
    assert not shows_working("The answer is 5.\n#### 5")
    assert not shows_working("#### 5")


def test_demo_grpo_problems_are_fresh(tmp_path):
    """The stream the demo's GRPO trains on holds no held-out question, none an earlier stage trained on, no repeat."""
    from cookmind.align.demo import _from_context
    from cookmind.demo import DemoContext, DemoSizes, stage_data, stage_tokenizer
    from cookmind.model import CookMindConfig, CookMindLM, save_model

    ctx = DemoContext(workdir=tmp_path, sizes=DemoSizes.quick(), progress=False)
    stage_data(ctx)
    stage_tokenizer(ctx)
    save_model(tmp_path / "m", CookMindLM(CookMindConfig(vocab_size=ctx.sizes.vocab_size + 16, hidden_size=16,
                                                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                         num_key_value_heads=1, max_position_embeddings=64)))
    ctx.checkpoints["sft"] = tmp_path / "m"
    args = _from_context(ctx)
    stream = [p["question"] for p in args["train_problems"]]
    cfg = args["cfg"]
    assert len(stream) == cfg.n_steps * cfg.rollout_batch_size // cfg.group_size == len(set(stream))
    d = tmp_path / "data"
    held = {json.loads(line)["question"] for line in (d / "eval_problems.jsonl").read_text().splitlines()}
    trained = set()
    for name in ("sft.jsonl", "dpo.jsonl", "pretrain.jsonl"):
        for line in (d / name).read_text().splitlines():
            row = json.loads(line)
            msgs = row.get("messages") or row.get("chosen") or []
            trained |= {m["content"] for m in msgs if m["role"] == "user"}
            if "text" in row and row["text"].startswith("Question: "):
                trained.add(row["text"].split("\n")[0][len("Question: "):])
    assert len(trained) > 100 and not set(stream) & (held | trained)
