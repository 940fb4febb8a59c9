"""The demo's RL stage (cookmind/demo/rl.py) on a tiny model: it runs through the Trainer and leaves before/after,
curves, a loadable checkpoint and its report section; it is deterministic; its problems are fresh."""

import copy
import json
from pathlib import Path

import pytest
import torch
from lm_fixtures import MICRO, tiny_config
from test_align_fixtures import one_torch_thread  # noqa: F401


@pytest.fixture(scope="module")
def quick_ctx(tmp_path_factory):
    """A quick DemoContext with data, tokenizer and a small random 'policy' checkpoint (no pretrain/SFT needed)."""
    from cookmind.demo import DemoContext, DemoSizes
    from cookmind.demo.pipeline import stage_data, stage_tokenizer
    from cookmind.model import CookMindLM, save_model
    from cookmind.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("rl_demo")
    ctx = DemoContext(workdir=root / "a", sizes=DemoSizes.quick(), progress=False)
    ctx.workdir.mkdir()
    stage_data(ctx)
    stage_tokenizer(ctx)
    torch.manual_seed(0)
    vocab = Tokenizer.load(ctx.paths["tokenizer"]).vocab_size
    save_model(root / "m", CookMindLM(tiny_config(**MICRO, vocab_size=vocab, max_position_embeddings=128)))
    ctx.checkpoints["sft"] = root / "m"
    return ctx


def _fork(ctx, workdir):
    other = copy.deepcopy(ctx)
    other.workdir = Path(workdir)
    other.workdir.mkdir(parents=True)
    return other


def test_demo_rl_stage_runs_through_the_trainer(quick_ctx, tmp_path):
    from cookmind.demo.rl import QUICK_GRPO, QUICK_LOOP, demo_stage
    from cookmind.model import load_model

    ctx = _fork(quick_ctx, tmp_path / "a")
    res = demo_stage(ctx)
    assert res["steps"] == QUICK_LOOP["steps"] == 2 and res["stopped_early"] is False
    assert 0.0 <= res["accuracy_before"] <= 1.0 and 0.0 <= res["accuracy"] <= 1.0
    assert res["train_problems_seen"] == 4 and res["rollouts"] == 2 * 2 * QUICK_GRPO.group_size
    # wrong->right minus right->wrong is the accuracy change, counted problem by problem
    n = res["heldout_problems"]
    assert res["heldout_fixed"] - res["heldout_broken"] == round(n * (res["accuracy"] - res["accuracy_before"]))
    assert res["gain_points"] == pytest.approx(100 * (res["accuracy"] - res["accuracy_before"]))
    assert (tmp_path / "a" / "grpo" / "grpo_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the Trainer ran it: its config says objective grpo, its metrics carry the RL columns, its checkpoint is the policy
    run = tmp_path / "a" / "runs" / "grpo"
    assert "objective: grpo" in (run / "config.yaml").read_text()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("split") == "train"]
    assert [r["step"] for r in train] == [1, 2] and all("reward" in r for r in train)
    val = [r for r in rows if r.get("split") == "val"]
    assert val and val[-1]["val_accuracy"] == res["accuracy"]  # the Trainer's held-out eval = the stage's after
    assert ctx.checkpoints["grpo"] == Path(res["checkpoint"]) and load_model(res["checkpoint"]) is not None
    assert json.loads((tmp_path / "a" / "grpo" / "grpo_result.json").read_text())["accuracy"] == res["accuracy"]

    # a fixed number of steps under one seed: a second run gives the same rollouts, rewards and accuracy
    again = demo_stage(_fork(quick_ctx, tmp_path / "b"))
    rows2 = [json.loads(line) for line in (tmp_path / "b" / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    keep = ("step", "loss", "reward", "accuracy", "response_length", "grad_norm", "val_accuracy")
    assert [{k: r.get(k) for k in keep} for r in rows2] == [{k: r.get(k) for k in keep} for r in rows]
    assert again["accuracy"] == res["accuracy"] and again["curve"] == res["curve"]

    # the demo report carries the RL section: before/after, the curves PNG, the guard
    from cookmind.demo import write_demo_report

    ctx.results = {"eval_sft": {"accuracy": 0.25, "answered_in_format": 1.0, "shows_working": 0.1, "n": 4}, "grpo": res}
    report = write_demo_report(ctx).read_text()
    assert "## RL stage: GRPO on fresh problems" in report and "![GRPO curves](grpo/grpo_curves.png)" in report
    assert f"{100 * res['accuracy']:.1f}%" in report and "the wall-clock guard did not fire" in report


def test_demo_rl_guard_stops_early_and_says_so(quick_ctx, tmp_path, monkeypatch):
    from cookmind.demo.rl import demo_stage

    monkeypatch.setenv("COOKMIND_GRPO_SECONDS", "0")
    ctx = _fork(quick_ctx, tmp_path / "c")
    cut = demo_stage(ctx)
    assert cut["steps"] == 1 and cut["stopped_early"] is True
    assert any("safety guard fired after 1 of 2 steps" in n for n in ctx.notes)


def test_pass_at_1_at_temperature_zero_is_greedy_accuracy(quick_ctx):
    from dataclasses import replace

    from cookmind.align.objective import evaluate_accuracy
    from cookmind.demo.rl import QUICK_GRPO, pass_at_k
    from cookmind.model import load_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(quick_ctx.paths["tokenizer"])
    model = load_model(quick_ctx.checkpoints["sft"])
    problems = [json.loads(line) for line in quick_ctx.paths["eval_problems"].read_text().splitlines()][:6]
    greedy = replace(QUICK_GRPO, temperature=0.0)
    sampled = pass_at_k(model, tok, problems, greedy, k=1)  # more than one greedy answer is refused: the same
    assert sampled["pass_at_k"] == sampled["pass_at_1"] == evaluate_accuracy(model, tok, problems, greedy)["accuracy"]


def test_shows_working_spots_a_written_step():
    from cookmind.demo.rl import shows_working

    assert shows_working("3 + 4 = 7\n7 - 2 = 5\n#### 5")
    assert shows_working("12 * 3 = 36\n#### 36")
    assert not shows_working("The answer is 5.\n#### 5")
    assert not shows_working("#### 5")


def test_demo_grpo_problems_are_fresh(quick_ctx, tmp_path):
    """The stream the demo's GRPO trains on holds no held-out question, none an earlier stage trained on, no repeat."""
    from cookmind.demo.rl import DEMO_LOOP, write_fresh_problems

    n = DEMO_LOOP["steps"] * DEMO_LOOP["prompts_per_step"]
    assert write_fresh_problems(quick_ctx, tmp_path / "p.jsonl", n) == n
    stream = [json.loads(line)["question"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(stream) == n == len(set(stream))
    d = quick_ctx.paths["data"]
    held = {json.loads(line)["question"] for line in (d / "eval_problems.jsonl").read_text().splitlines()}
    trained = set()
    for name in ("sft.jsonl", "dpo.jsonl", "pretrain.jsonl"):
        for line in (d / name).read_text().splitlines():
            row = json.loads(line)
            msgs = row.get("messages") or row.get("chosen") or []
            trained |= {m["content"] for m in msgs if m["role"] == "user"}
            if "text" in row and row["text"].startswith("Question: "):
                trained.add(row["text"].split("\n")[0][len("Question: ") :])
    assert len(trained) > 100 and not set(stream) & (held | trained)


def test_the_demos_sampled_pass_at_k_is_cookmind_eval_gsm8ks(quick_ctx, tmp_path, capsys):
    """The RL stage sampled its held-out pass@k on a path of its own (its own seed and streams), so no `cookmind eval
    gsm8k` run gave its figures. It now samples through evaluate_gsm8k, keeps the answers as --out writes them, and
    names the command: that command, run in the work directory, writes the same answers and the same pass@k."""
    import os

    from cookmind.cli import main
    from cookmind.demo.rl import QUICK_GRPO, pass_at_k
    from cookmind.model import load_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(quick_ctx.paths["tokenizer"])
    model = load_model(quick_ctx.checkpoints["sft"])
    problems = [json.loads(line) for line in quick_ctx.paths["eval_problems"].read_text().splitlines()]
    sampled = pass_at_k(model, tok, problems, QUICK_GRPO, k=3, out_path=tmp_path / "demo.jsonl")
    command = sampled["command"].split()
    assert command[:3] == ["cookmind", "eval", "gsm8k"] and "--num-samples" in command
    model_dir = os.path.relpath(quick_ctx.checkpoints["sft"], quick_ctx.workdir)
    argv = [model_dir if w == "MODEL" else w for w in command[1:]] + ["--quiet", "--device", "cpu"]
    argv += ["--tokenizer", str(quick_ctx.paths["tokenizer"])]  # the fixture's model folder holds none
    cwd = os.getcwd()
    os.chdir(quick_ctx.workdir)
    try:
        assert main([*argv, "--out", str(tmp_path / "cli.jsonl")]) == 0, capsys.readouterr().err
    finally:
        os.chdir(cwd)
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["pass@3"], metrics["pass@1"]) == (sampled["pass_at_k"], sampled["pass_at_1"])
    demo = [json.loads(line)["outputs"] for line in (tmp_path / "demo.jsonl").read_text().splitlines()]
    cli = [json.loads(line)["outputs"] for line in (tmp_path / "cli.jsonl").read_text().splitlines()]
    assert demo == cli and len(demo) == len(problems) and all(len(o) == 3 for o in demo)


def test_the_rl_stage_writes_nothing_outside_its_workdir_and_its_command_names_its_run_there(
    quick_ctx, tmp_path, monkeypatch
):
    """`cookmind demo --workdir X` keeps everything under X: the RL stage run from another directory writes nothing
    there nor beside X, and the command it gives for its sampled figures (run in X) names the GRPO run it trained
    (the after-model), where `cookmind eval` finds the checkpoint the stage scored."""
    import os
    import shlex

    from cookmind.demo.rl import demo_stage
    from cookmind.model import resolve_model_dir

    ctx = _fork(quick_ctx, tmp_path / "work" / "x")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    res = demo_stage(ctx)
    everything = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if not p.is_dir())
    assert everything and all(p.startswith("work/x/") for p in everything), everything
    model = shlex.split(res["sampled_command"])[3]
    assert not os.path.isabs(model) and resolve_model_dir(ctx.workdir / model) == Path(res["checkpoint"])
