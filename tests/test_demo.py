"""`cookmind demo` at smoke-test size: every stage runs and leaves what the next one needs."""

import json

import pytest
import torch

from cookmind.demo import STAGES, DemoContext, DemoSizes, run_demo


def test_quick_demo_runs_every_stage(tmp_path, capfd):
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
    # the sample chats show no run of blank lines a small model can end its reply with (some ran 40 lines)
    assert all(c["assistant"] == c["assistant"].strip() for c in ctx.results["chat"]["chats"])
    # the demo's own settings draw no advice to change them: --quick's few steps took the full demo's warm-up, and
    # every training stage said "optim.warmup_steps=20 is not below train.max_steps=6 ... lower optim.warmup_steps"
    err = capfd.readouterr().err
    assert "warmup_steps" not in err, err
    # a training stage's loss arrow spans its first and last steps, not one logged step twice ("5.642 → 5.642")
    for stage in ("pretrain", "sft"):
        rows = [json.loads(line) for line in (tmp_path / "runs" / stage / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if r.get("split") == "train"]
        assert train[0]["step"] == 1 and train[-1]["step"] == ctx.results[stage]["steps"]
        assert ctx.results[stage]["first_loss"] == train[0]["loss"] != ctx.results[stage]["last_loss"]


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


def _user_files(folder, names):
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"the user's {name}")
    return {name: (folder / name).read_text() for name in names}


def test_demo_refuses_a_workdir_holding_the_users_files(tmp_path, capsys):
    """`cookmind demo --workdir w` replaced the user's report.md, results.json, data/pretrain.jsonl and
    tokenizer/tokenizer.json with rc 0 and left tokenizer/NOTES.txt mixed into the new tokenizer."""
    from cookmind.cli import main as cli_main

    names = ["report.md", "results.json", "data/pretrain.jsonl", "tokenizer/tokenizer.json", "tokenizer/NOTES.txt"]
    before = _user_files(tmp_path, names)
    assert cli_main(["demo", "--workdir", str(tmp_path), "--quick", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds data/pretrain.jsonl, which `cookmind demo` did not write there (5 such files)" in err
    assert len(err.strip().splitlines()) == 1
    assert {name: (tmp_path / name).read_text() for name in names} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "report.md", "results.json", "tokenizer"]


def test_demo_reruns_over_its_own_workdir_and_refuses_a_file_added_there(tmp_path):
    from cookmind.atomic import write_text

    def stage_note(ctx):
        """Write a file."""
        write_text(ctx.workdir / "data" / "note.txt", "the demo's")
        return {}

    def stage_dies(ctx):
        """Write a file and die."""
        write_text(ctx.workdir / "tokenizer" / "half.json", "the demo's, cut short")
        raise KeyboardInterrupt

    ctx = DemoContext(workdir=tmp_path / "w", progress=False)
    run_demo(ctx, stages=[("note", stage_note)])
    run_demo(ctx, stages=[("note", stage_note)])  # its own output: replaced
    with pytest.raises(KeyboardInterrupt):
        run_demo(ctx, stages=[("note", stage_note), ("dies", stage_dies)])
    run_demo(ctx, stages=[("note", stage_note)])  # what the interrupted stage wrote is the demo's own
    (tmp_path / "w" / "tokenizer" / "NOTES.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds tokenizer/NOTES.txt, which `cookmind demo` did not write"):
        run_demo(ctx, stages=[("note", stage_note)])
    assert (tmp_path / "w" / "tokenizer" / "NOTES.txt").read_text() == "mine"


def test_curate_demo_refuses_a_workdir_holding_the_users_files(tmp_path, capsys):
    """`cookmind curate demo` replaced the user's crawl/manifest.json, quality.npz, curated.jsonl and
    curated/report.md, and curated crawl/notes.txt as a page (41 documents in for 40 pages)."""
    from cookmind.cli import main as cli_main

    names = ["crawl/manifest.json", "crawl/notes.txt", "quality.npz", "curated.jsonl", "curated/report.md"]
    before = _user_files(tmp_path, names)
    assert cli_main(["curate", "demo", "--workdir", str(tmp_path), "--num-pages", "40"]) == 2
    err = capsys.readouterr().err
    assert "holds crawl/manifest.json, which `cookmind curate demo` did not write there (5 such files)" in err
    assert {name: (tmp_path / name).read_text() for name in names} == before
    # nor may one demo take the other's folder
    from cookmind.demo.workdir import DemoWorkdir

    DemoWorkdir(tmp_path / "d", "demo").claim()
    assert cli_main(["curate", "demo", "--workdir", str(tmp_path / "d"), "--num-pages", "40"]) == 2
    assert "is the work folder of `cookmind demo`" in capsys.readouterr().err


def test_curate_demo_quiet_shows_no_progress_bars_as_curate_run_quiet(tmp_path, capsys):
    """`cookmind curate run` has --quiet (no progress bars) and `cookmind curate demo` had none: its bars could not be
    kept out of a log. It prints its report and the clean text's line all the same."""
    from cookmind.cli import main as cli_main

    assert cli_main(["curate", "demo", "--workdir", str(tmp_path), "--num-pages", "20", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "shard/s" not in err and "docs/s" not in err and "%|" not in err, err
    assert "# Curation report" in out and "clean text: " in out


def test_the_demos_tokenizer_stage_draws_no_bar_into_a_pipe_or_a_log(tmp_path, capsys):
    """The demo's other stages write plain lines into a pipe (cookmind.progress), but its tokenizer stage asked
    train_bpe for its bars even there: carriage returns and redrawn bars in the log, between the [demo] lines. It
    asks for them on a terminal only now (capsys's stderr is none)."""
    from cookmind.demo.pipeline import stage_data, stage_tokenizer

    ctx = DemoContext(workdir=tmp_path, seed=0, sizes=DemoSizes.quick(), progress=True, skip_curate=True)
    stage_data(ctx)
    stage_tokenizer(ctx)
    err = capsys.readouterr().err
    assert "\r" not in err and "merges" not in err


def test_the_demo_report_links_each_training_stages_own_report(tmp_path):
    """The demo report listed each training stage's report (its loss, lr and objective curves) as an absolute path in
    code quotes: nothing a Markdown viewer opens, and wrong once the work directory moves. They are links relative to
    the report now, as its GRPO curves image is."""
    from cookmind.demo.pipeline import write_demo_report

    ctx = DemoContext(workdir=tmp_path, seed=0, sizes=DemoSizes.quick(), progress=False)
    for stage in ("pretrain", "dpo"):
        ctx.results[stage] = {"seconds": 1.0, "report": str(tmp_path / "runs" / stage / "report.md")}
    report = write_demo_report(ctx).read_text()
    assert "- pretrain: [runs/pretrain/report.md](runs/pretrain/report.md)" in report
    assert "- dpo: [runs/dpo/report.md](runs/dpo/report.md)" in report and str(tmp_path) not in report.split("##", 2)[2]


def test_the_demos_held_out_score_is_cookmind_eval_gsm8ks(tmp_path, monkeypatch):
    """The demo graded its held-out problems on a path of its own (its own chat prompt, stops and `####` parser), so a
    user could not tell which `cookmind eval gsm8k` flags reproduce its figures. The score is now that command's
    (evaluate_gsm8k, template chat), the answers are written as its --out writes them, and the result names the
    command; the accuracy is the share of graded answers in that file (counted here)."""
    from lm_fixtures import MICRO, tiny_config

    import cookmind.evals.gsm8k as gsm8k_eval
    from cookmind.demo.pipeline import arithmetic_accuracy, stage_data, stage_tokenizer
    from cookmind.model import CookMindLM, save_model
    from cookmind.tokenizer import Tokenizer

    ctx = DemoContext(workdir=tmp_path / "w", sizes=DemoSizes.quick(), progress=False)
    ctx.workdir.mkdir()
    stage_data(ctx)
    stage_tokenizer(ctx)
    torch.manual_seed(0)
    vocab = Tokenizer.load(ctx.paths["tokenizer"]).vocab_size
    # the checkpoint scored, not the run: `runs/sft` means its newest one, which another may be by the time it is read
    scored = ctx.workdir / "runs" / "sft" / "checkpoints" / "step_3"
    save_model(scored, CookMindLM(tiny_config(**MICRO, vocab_size=vocab, max_position_embeddings=128)))
    calls, real = [], gsm8k_eval.evaluate_gsm8k
    monkeypatch.setattr(gsm8k_eval, "evaluate_gsm8k", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    res = arithmetic_accuracy(ctx, scored, name="sft")
    assert len(calls) == 1 and calls[0]["template"] == "chat" and calls[0]["temperature"] == 0.0
    records = [json.loads(line) for line in (ctx.workdir / res["answers"]).read_text().splitlines()]
    assert len(records) == res["n"] == ctx.sizes.eval_problems
    assert res["accuracy"] == sum(r["grades"][0] for r in records) / len(records)
    assert res["command"] == (
        "cookmind eval gsm8k runs/sft/checkpoints/step_3 --data data/eval_problems.jsonl --template chat "
        f"--max-new-tokens {calls[0]['max_new_tokens']}"
    )


def test_the_demo_mines_as_wrong_only_answers_cookmind_eval_gsm8k_grades_wrong(tmp_path, monkeypatch):
    """Mining DPO pairs graded the SFT model's answers with a `####` parser of its own (the first number after it),
    so an answer `cookmind eval gsm8k --template chat` and GRPO's reward grade right ("#### 9 - 2 = 7", truth 7: the
    line's result) was pushed down as a mistake. Here every answer ends `#### A - B = TRUTH`: none is a mistake."""
    from lm_fixtures import MICRO, tiny_config

    import cookmind.evals.gsm8k as gsm8k_eval
    import cookmind.infer
    from cookmind.demo.pipeline import stage_data, stage_mine_pairs, stage_tokenizer
    from cookmind.model import CookMindLM, save_model
    from cookmind.tokenizer import Tokenizer

    ctx = DemoContext(workdir=tmp_path / "w", sizes=DemoSizes.quick(), progress=False)
    ctx.workdir.mkdir()
    stage_data(ctx)
    stage_tokenizer(ctx)
    tok = Tokenizer.load(ctx.paths["tokenizer"])
    save_model(tmp_path / "m", CookMindLM(tiny_config(**MICRO, vocab_size=tok.vocab_size, max_position_embeddings=256)))
    ctx.checkpoints["sft"] = tmp_path / "m"
    truth = {}
    for name in ("dpo", "dpo_val"):
        for line in (ctx.paths["data"] / f"{name}.jsonl").read_text().splitlines():
            chosen = json.loads(line)["chosen"]
            truth[chosen[0]["content"]] = int(chosen[-1]["content"].rsplit("####", 1)[1])

    def right_answers(model, prompts, params, tokenizer=None, **kw):
        out = []
        for ids in prompts:
            text = tok.decode(list(ids))
            value = next(v for q, v in truth.items() if q in text)
            out.append(tok.encode(f"#### {value + 2} - 2 = {value}") + [tok.im_end_id])
        return out

    monkeypatch.setattr(cookmind.infer, "generate", right_answers)
    monkeypatch.setattr(gsm8k_eval, "generate", right_answers)
    res = stage_mine_pairs(ctx)
    assert res["pairs"] == ctx.sizes.dpo_pairs and res["from_model_mistakes"] == 0 == res["val_from_model_mistakes"]
