"""`cookmind demo` at smoke-test size: every stage runs and leaves what the next one needs."""

import json

import torch

from cookmind.demo import STAGES, DemoContext, DemoSizes, run_demo


def test_quick_demo_runs_every_stage(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # curation is tested below; the RL stage in detail in test_align_demo.py
        ctx = run_demo(DemoContext(workdir=tmp_path, seed=0, sizes=DemoSizes.quick(), progress=False, skip_curate=True))
    finally:
        torch.set_num_threads(threads)
    for name, _ in STAGES:
        assert name in ctx.results, f"stage {name} left no result"
    for stage in ("pretrain", "sft", "dpo", "grpo"):
        assert (ctx.checkpoints[stage] / "model.safetensors").is_file()
    # the DPO stage trained LoRA only and saved a PEFT adapter beside the merged weights
    assert (ctx.checkpoints["dpo"] / "adapter_model.safetensors").is_file()
    assert ctx.results["dpo"]["trainable_params"] < ctx.results["sft"]["trainable_params"]
    for stage in ("eval_pretrain", "eval_sft", "eval_dpo"):
        assert 0.0 <= ctx.results[stage]["accuracy"] <= 1.0 and ctx.results[stage]["n"] == ctx.sizes.eval_problems
    report = (tmp_path / "report.md").read_text()
    assert "Held-out arithmetic" in report and "Sample chats" in report and "RL stage: GRPO" in report
    assert ctx.policy == ctx.checkpoints["grpo"]  # the chat stage talks to the RL stage's model
    assert json.loads((tmp_path / "results.json").read_text())["pack"]["sft"]["tokens"] > 0
    assert (tmp_path / "runs" / "pretrain" / "loss.png").is_file()
    assert ctx.results["mine_pairs"]["pairs"] == ctx.sizes.dpo_pairs


def test_demo_report_shows_what_each_curation_stage_removed(tmp_path):
    """The demo begins with curation, and its report carries the per-stage removal table."""
    from cookmind.demo import stage_curate, stage_report

    ctx = run_demo(
        DemoContext(workdir=tmp_path, seed=0, sizes=DemoSizes.quick(), progress=False),
        stages=[("curate", stage_curate), ("report", stage_report)],
    )
    planted = ctx.results["curate"]["planted"]
    report = (tmp_path / "report.md").read_text()
    assert "## Curation: what each stage removed" in report
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in report.splitlines()
        if line.startswith("| ") and line.count("|") > 8
    }
    for stage in ("extract", "langid", "gopher", "minhash", "exact_lines", "pii", "nsfw", "toxic"):
        assert stage in rows, f"curation stage {stage} missing from the demo report"
    # duplicates planted by the crawl = what MinHash removed
    dups = planted.get("exact_dup", 0) + planted.get("near_dup", 0)
    assert dups > 0 and int(rows["minhash"][2]) == dups
