"""Rollout sampling, GRPO through the Trainer (stream data source, resume, held-out eval) and expert iteration."""

import json
import warnings

import pytest
import torch
from lm_fixtures import MICRO, tiny_config
from test_align_fixtures import XYZ, one_torch_thread, tiny_hf_model, x_fraction  # noqa: F401

from cookmind.align.expert_iteration import ExpertIterationConfig, run_expert_iteration
from cookmind.align.objective import GRPOConfig, GRPOObjective, sampling_params
from cookmind.align.rollout import SamplingParams, generate_ids

PROBLEMS = [{"question": "?" * k, "answer": ""} for k in range(1, 4)]


def _tiny_cookmind(vocab_size=5, seed=0):
    from cookmind.model import CookMindLM

    torch.manual_seed(seed)
    return CookMindLM(tiny_config(**MICRO, vocab_size=vocab_size, max_position_embeddings=48))


def _train_cfg(run_dir, max_steps, prompts_per_step, lr=1e-2, **sections):
    from cookmind.train import TrainConfig

    d = {
        "train": {
            "objective": "grpo",
            "max_steps": max_steps,
            "micro_batch_size": prompts_per_step,
            "device": "cpu",
            "seed": 0,
        },
        "optim": {"lr": lr, "warmup_steps": 0, "schedule": "constant", "weight_decay": 0.0},
        "checkpoint": {"every": 0, "keep_last": 5},
        "logging": {"run_dir": str(run_dir), "progress": False, "report": False, "log_every": 1},
    }
    for k, v in sections.items():
        d.setdefault(k, {}).update(v)
    return TrainConfig.from_dict(d)


def _grpo_trainer(
    run_dir,
    max_steps,
    problems=PROBLEMS,
    prompts_per_step=3,
    gcfg=None,
    reward_fn=x_fraction,
    eval_problems=None,
    **sections,
):
    from cookmind.train import Trainer

    gcfg = gcfg or GRPOConfig(group_size=8, max_new_tokens=5, template="{question}", stop_strings=())
    objective = GRPOObjective(gcfg, reward_fn=reward_fn, problems=problems, eval_problems=eval_problems)
    return Trainer(
        _train_cfg(run_dir, max_steps, prompts_per_step, **sections),
        model=_tiny_cookmind(),
        objective=objective,
        tokenizer=XYZ(),
    )


def _rows(run_dir, split="train"):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("split") == split]


def test_builtin_greedy_matches_hf_generate():
    model = tiny_hf_model(vocab_size=40)
    model.generation_config.eos_token_id = None
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11]]
    ours = generate_ids(model, prompts, SamplingParams(max_new_tokens=6, temperature=0.0), engine="builtin")
    for p, o in zip(prompts, ours):
        ref = model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(p) :].tolist()
        assert o == ref


def test_sampling_gives_distinct_rows_and_stops_on_string_and_token():
    model = tiny_hf_model(vocab_size=5)
    tok = XYZ()
    prompts = [[4]] * 16  # one prompt repeated, as in a GRPO group
    outs = generate_ids(
        model,
        prompts,
        SamplingParams(max_new_tokens=8, temperature=1.0, seed=0, stop_token_ids=(3,), stop_strings=("zz",)),
        tok,
    )
    assert len({tuple(o) for o in outs}) > 4  # a group must not be 16 copies of one sample
    for o in outs:
        text = tok.decode(o)
        # ends on the first stop token or the first completed "zz", else runs to max_new_tokens
        assert 3 not in o[:-1] and "zz" not in text[:-1]
        assert o[-1] == 3 or text.endswith("zz") or len(o) == 8


def test_grpo_through_trainer_raises_reward_and_logs_rl_metrics(tmp_path):
    trainer = _grpo_trainer(
        tmp_path,
        12,
        problems=[{"question": "?" * (1 + k % 3), "answer": ""} for k in range(36)],
        logging={"report": True},
    )
    summary = trainer.fit()
    rows = _rows(tmp_path)
    # the run's summary line and report.md say the reward it trained to, with no eval problems given (they had no
    # reward at all then): each train_* is the mean over the last steps' logged rows (here all 12: fewer than 20)
    assert summary["train_means_over_steps"] == len(rows) == 12
    for key in ("reward", "accuracy", "format_reward", "loss", "entropy"):
        assert summary[f"train_{key}"] == pytest.approx(sum(r[key] for r in rows) / 12, rel=1e-6), key  # logs round
    assert "train_lr" not in summary and "train_tokens_per_s" not in summary  # bookkeeping, not the objective's
    report = (tmp_path / "report.md").read_text()
    assert "| train_reward |" in report and "![objective metrics](objective.png)" in report
    assert (tmp_path / "objective.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first, last = rows[0]["reward"], sum(r["reward"] for r in rows[-3:]) / 3
    assert last > first + 0.25, (first, last)
    for key in (
        "reward",
        "format_reward",
        "accuracy",
        "response_length",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "loss",
        "frac_zero_std_groups",
    ):
        assert key in rows[-1]


def test_stream_takes_each_problem_once_in_order_and_warns_on_wrap(tmp_path):
    """Step k trains on problems [k*P, (k+1)*P), each group_size times; past the end it wraps and says so."""
    problems = [{"question": "?" * (i + 1), "answer": str(i)} for i in range(5)]
    seen = []

    def reward(resp, truth):
        seen.append(int(truth))
        return x_fraction(resp, truth)

    gcfg = GRPOConfig(group_size=4, max_new_tokens=3, template="{question}", stop_strings=())
    trainer = _grpo_trainer(tmp_path, 2, problems=problems, prompts_per_step=2, gcfg=gcfg, reward_fn=reward)
    trainer.fit()
    assert seen == [i for i in range(4) for _ in range(4)]
    state = trainer.objective.state_dict()
    assert (state["calls"], state["position"]) == (2, 4) and len(state["problems"]) == 16  # the stream's fingerprint
    with pytest.warns(UserWarning, match="has 5 problems and the run has used 4"):
        trainer.objective.next_batch(trainer)


def test_stream_problems_whose_prompt_fills_the_context_are_dropped_and_counted(tmp_path):
    """A prompt of the model's whole context (48) leaves no room to answer: it stopped the run at its step."""
    short = [{"question": "?" * n, "answer": str(n)} for n in (1, 2, 3)]
    problems = [short[0], {"question": "?" * 48, "answer": "48"}, *short[1:], {"question": "?" * 60, "answer": "60"}]
    gcfg = GRPOConfig(group_size=2, max_new_tokens=3, template="{question}", stop_strings=())
    with pytest.warns(UserWarning) as caught:
        trainer = _grpo_trainer(tmp_path, 1, problems=problems, eval_problems=problems[:2], gcfg=gcfg)
    said = [str(w.message) for w in caught]
    tail = "problems are dropped: their prompts fill the model's context of 48 tokens"
    assert f"grpo.problems: 2 of 5 {tail}" in said and f"grpo.eval_problems: 1 of 2 {tail}" in said
    assert trainer.objective.problems == short and trainer.objective.eval_problems == short[:1]
    trainer.fit()  # the first step takes the three short ones


def test_dropped_stream_problems_are_counted_in_the_summary_report_and_data_row(tmp_path):
    """The count of grpo.problems (and grpo.eval_problems) dropped for filling the context appeared only in a
    warning; a grpo store's dropped prompts are kept as data_records/data_dropped in the summary line, report.md
    and metrics.jsonl's data row. The problems' counts now go there too, as grpo_problems_* and
    grpo_eval_problems_*. Reference: the prompt lengths (one XYZ token a character) against the context (48)."""
    short = [{"question": "?" * n, "answer": str(n)} for n in (1, 2, 3)]
    problems = [short[0], {"question": "?" * 48, "answer": "48"}, *short[1:], {"question": "?" * 60, "answer": "60"}]
    gcfg = GRPOConfig(group_size=2, max_new_tokens=3, template="{question}", stop_strings=())
    with pytest.warns(UserWarning):
        trainer = _grpo_trainer(
            tmp_path, 1, problems=problems, eval_problems=problems[:2], gcfg=gcfg, logging={"report": True}
        )
    summary = trainer.fit()
    want = {
        "grpo_problems_records": 5,
        "grpo_problems_dropped": 2,
        "grpo_eval_problems_records": 2,
        "grpo_eval_problems_dropped": 1,
    }
    assert want.items() <= summary.items()
    (data,) = _rows(tmp_path, split="data")
    assert want.items() <= data.items()
    report = (tmp_path / "report.md").read_text()
    assert "| grpo_problems_dropped | 2 |" in report and "| grpo_eval_problems_dropped | 1 |" in report


def test_grpo_resume_through_trainer_equals_uninterrupted_bit_for_bit(tmp_path):
    """Interrupted after 2 of 4 steps and resumed (KL to a frozen copy of the start, Dr. GRPO normalisation): the
    same weights, bit for bit, and the same rows as the straight run."""
    gcfg = GRPOConfig(
        group_size=4,
        max_new_tokens=4,
        template="{question}",
        stop_strings=(),
        kl_coef=0.1,
        reference="copy",
        length_normalization="constant",
    )
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 9)]
    straight = _grpo_trainer(tmp_path / "a", 4, problems=problems, prompts_per_step=2, gcfg=gcfg)
    straight.fit()
    _grpo_trainer(tmp_path / "b", 2, problems=problems, prompts_per_step=2, gcfg=gcfg).fit()
    resumed = _grpo_trainer(
        tmp_path / "b", 4, problems=problems, prompts_per_step=2, gcfg=gcfg, checkpoint={"resume": "auto"}
    )
    state = resumed.objective.state_dict()
    assert resumed.step == 2 and (state["calls"], state["position"]) == (2, 4)
    resumed.fit()
    for (k, a), b in zip(straight.bare_model.state_dict().items(), resumed.bare_model.state_dict().values()):
        assert torch.equal(a, b), k
    assert any(r["kl"] > 0 for r in _rows(tmp_path / "a"))  # the KL term was live
    keys = ("reward", "loss", "kl", "response_length")
    assert [[r[k] for k in keys] for r in _rows(tmp_path / "a")[2:]] == [
        [r[k] for k in keys] for r in _rows(tmp_path / "b")[2:]
    ]


def test_held_out_accuracy_is_reported_by_trainer_evaluations(tmp_path):
    """eval_problems: each evaluation (eval.every and the end) adds greedy held-out accuracy as val_accuracy."""
    held = [{"question": "?", "answer": "x"}, {"question": "??", "answer": "x"}]

    def exact(resp, truth):
        ok = float(resp.strip() == truth)
        return {"reward": ok, "format_reward": 1.0, "answer_reward": ok}

    gcfg = GRPOConfig(group_size=4, max_new_tokens=1, template="{question}", stop_strings=())
    trainer = _grpo_trainer(
        tmp_path, 2, problems=PROBLEMS * 2, gcfg=gcfg, eval_problems=held, reward_fn=exact, eval={"every": 1}
    )
    summary = trainer.fit()
    val = _rows(tmp_path, "val")
    assert [r["step"] for r in val] == [1, 2]
    # independent reference: greedy first token of each held-out prompt, graded by hand
    model = trainer.bare_model.eval()
    want = sum(model(torch.tensor([XYZ().encode(p["question"])])).logits[0, -1].argmax().item() == 0 for p in held) / 2
    assert val[-1]["val_accuracy"] == summary["val_accuracy"] == want
    assert 0.0 <= val[-1]["val_response_length"] <= 1.0


def test_grpo_objective_loss_matches_manual_and_counts_calls():
    model = tiny_hf_model(vocab_size=5)
    obj = GRPOObjective(
        GRPOConfig(group_size=4, max_new_tokens=4, template="{question}", stop_strings=(), loss_type="grpo_clip"),
        tokenizer=XYZ(),
        reward_fn=x_fraction,
    )
    batch = {"prompt_ids": torch.tensor([[4, 4], [4, 3]]), "prompt_lengths": torch.tensor([2, 1]), "answer": ["", ""]}
    loss_batch = obj.prepare(model, batch)
    assert loss_batch["input_ids"].shape[0] == 8 and obj.state_dict() == {"calls": 1, "position": 0}
    loss, metrics = obj(model, loss_batch)
    loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    # on-policy grpo_clip has the gradient of -A * log p per token, mean over each response, then over the batch
    logits = model(loss_batch["input_ids"]).logits
    lp = torch.log_softmax(logits, -1).gather(-1, loss_batch["labels"][..., None])[..., 0]
    m = loss_batch["response_mask"].float()
    manual = ((-loss_batch["advantages"][:, None] * lp * m).sum(-1) / m.sum(-1)).mean()
    manual.backward()
    for g, p in zip(ours, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in ours)
    assert 0.0 <= metrics["reward"] <= 1.0 and metrics["clip_fraction"] == 0.0
    obj2 = GRPOObjective(obj.cfg, tokenizer=XYZ(), reward_fn=x_fraction)
    obj2.load_state_dict(obj.state_dict())
    assert obj2.calls == 1


def test_a_problems_file_that_cannot_be_read_is_one_line_naming_its_setting(tmp_path):
    """grpo.problems / grpo.eval_problems: a missing file, a folder or a binary file says which setting named it
    (it was a bare "[Errno 2] No such file or directory")."""
    from cookmind.align.objective import build_objective
    from cookmind.train import TrainConfig

    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "1+1?", "answer": "2"}\n')
    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    cases = [
        (
            {"problems": str(tmp_path / "nope.jsonl")},
            f"grpo.problems={tmp_path / 'nope.jsonl'}: no such file; give a JSONL",
        ),
        ({"problems": str(tmp_path)}, f"grpo.problems={tmp_path}: is a directory"),
        (
            {"problems": str(good), "eval_problems": str(binary)},
            f"grpo.eval_problems={binary}:1: invalid UTF-8 at byte 0",
        ),
    ]
    for grpo, said in cases:
        cfg = TrainConfig.from_dict({"train": {"objective": "grpo"}, "grpo": grpo})
        with pytest.raises(ValueError) as caught:
            build_objective(cfg, None)
        assert str(caught.value).startswith(said) and "\n" not in str(caught.value), str(caught.value)
    cfg = TrainConfig.from_dict({"train": {"objective": "grpo"}, "grpo": {"problems": str(good)}})
    assert build_objective(cfg, None).problems == [{"question": "1+1?", "answer": "2"}]


def test_problems_and_a_training_store_together_are_refused(tmp_path):
    """grpo.problems with --train-data trained on the problems only: the store was read and counted in the summary
    (data_records) as if it trained, and never drawn from."""
    from cookmind.align.objective import build_objective
    from cookmind.train import TrainConfig

    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "1+1?", "answer": "2"}\n')
    cfg = TrainConfig.from_dict(
        {"train": {"objective": "grpo"}, "data": {"train_path": "data/rl"}, "grpo": {"problems": str(good)}}
    )
    with pytest.raises(ValueError, match=rf"grpo.problems={good} and data.train_path=data/rl .*give one of them"):
        build_objective(cfg, None)


def test_a_run_whose_rewards_never_vary_says_so_once(tmp_path):
    """Rollouts that all score 0 train nothing (every advantage is 0): after NO_SIGNAL_BATCHES such batches in a
    row the run warns once, saying what to check; a varying reward never warns."""
    from cookmind.align.objective import NO_SIGNAL_BATCHES

    def never(resp, truth):
        return {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}

    gcfg = GRPOConfig(group_size=4, max_new_tokens=2, template="{question}", stop_strings=())
    trainer = _grpo_trainer(tmp_path / "flat", NO_SIGNAL_BATCHES + 2, prompts_per_step=1, gcfg=gcfg, reward_fn=never)
    with pytest.warns(UserWarning) as caught:
        trainer.fit()
    said = [str(w.message) for w in caught if "no learning signal" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith(f"grpo: no learning signal in the last {NO_SIGNAL_BATCHES} rollout batches")
    assert "rewards 0 to 0" in said[0] and "no rollout earned any reward" in said[0]
    assert "(the reward function's format; grpo.template='{question}')" in said[0]
    assert all(r["frac_zero_std_groups"] == 1.0 for r in _rows(tmp_path / "flat"))

    trainer = _grpo_trainer(tmp_path / "live", NO_SIGNAL_BATCHES + 2, prompts_per_step=3)  # x_fraction varies
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    assert not [w for w in caught if "no learning signal" in str(w.message)]
    assert any(r["frac_zero_std_groups"] < 1.0 for r in _rows(tmp_path / "live"))


def test_the_no_signal_count_restarts_at_a_batch_with_signal_and_names_the_case():
    """The warning needs NO_SIGNAL_BATCHES flat batches in a row; a flat run with rewards earned says the rollouts
    do not vary, not that nothing is earned."""
    from cookmind.align.objective import NO_SIGNAL_BATCHES

    obj = GRPOObjective(GRPOConfig(group_size=4, template="chat"), tokenizer=XYZ())
    flat = {"frac_zero_std_groups": 1.0, "reward_min": 0.0, "reward_max": 1.0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(NO_SIGNAL_BATCHES - 1):
            obj._note_signal(flat)
        obj._note_signal({"frac_zero_std_groups": 0.5, "reward_min": 0.0, "reward_max": 1.0})
        for _ in range(NO_SIGNAL_BATCHES - 1):
            obj._note_signal(flat)
    assert not caught
    with pytest.warns(UserWarning, match="rewards 0 to 1.*each problem's rollouts all earn the same") as caught:
        obj._note_signal(flat)
    assert "no rollout earned" not in str(caught[0].message)


def test_grpo_config_refuses_loop_knobs_and_bad_values():
    with pytest.raises(ValueError, match="unknown keys \\['learning_rate'\\].*optim"):
        GRPOConfig.from_dict({"learning_rate": 1e-5})
    with pytest.raises(ValueError, match="kl_coef > 0 needs a reference"):
        GRPOConfig.from_dict({"kl_coef": 0.1})
    with pytest.raises(ValueError, match="length_normalization"):
        GRPOConfig.from_dict({"length_normalization": "tokens"})


def test_expert_iteration_keeps_only_correct_and_improves(tmp_path):
    model = _tiny_cookmind()

    def reward(resp, _t):  # correct: a response that starts with "x"
        ok = float(resp.startswith("x"))
        return {"reward": ok, "format_reward": 1.0, "answer_reward": ok}

    train_cfg = _train_cfg(tmp_path, 1, 8, lr=1e-2)
    cfg = ExpertIterationConfig(
        n_rounds=3,
        questions_per_round=3,
        samples_per_question=16,
        sft_epochs=4,
        max_new_tokens=2,
        template="{question}",
    )
    hist = run_expert_iteration(model, XYZ(), PROBLEMS, train_cfg, cfg, reward_fn=reward)
    assert all(h["kept"] <= round(h["sample_accuracy"] * 48) for h in hist)
    assert hist[-1]["sample_accuracy"] > hist[0]["sample_accuracy"] + 0.2
    assert (tmp_path / "round_1" / "metrics.jsonl").is_file()  # the SFT rounds ran through the Trainer


def _sharp_cookmind(vocab_size=5):
    from lm_fixtures import sharp_tiny_lm

    return sharp_tiny_lm(vocab_size=vocab_size, max_position_embeddings=48)


def test_serving_engine_greedy_equals_builtin_loop_with_stop_token_kept():
    """engine="serving" (the continuous-batching engine) gives the built-in loop's greedy responses,
    prompts of mixed lengths, stop token included at the end where it was hit."""
    model = _sharp_cookmind(vocab_size=11)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 1], [2], [9, 9]]
    base = dict(max_new_tokens=12, temperature=0.0)
    plain = generate_ids(model, prompts, SamplingParams(**base), engine="builtin")
    stop = next(t for o in plain for t in o[1:])  # a token some response emits after its first
    params = dict(base, stop_token_ids=(stop,))
    want = generate_ids(model, prompts, SamplingParams(**params), engine="builtin")
    got = generate_ids(model, prompts, SamplingParams(**params), engine="serving")
    assert got == want
    assert any(o and o[-1] == stop and len(o) < 12 for o in got)  # the stop case was exercised


def test_serving_engine_samples_distinct_reproducible_rows_and_stops_on_strings():
    from cookmind.infer import engine_generate

    model = _sharp_cookmind()
    tok = XYZ()
    prompts = [[4]] * 16
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, stop_token_ids=(3,), stop_strings=("zz",))
    outs = generate_ids(model, prompts, params, tok, engine="serving")
    engine = engine_generate.held_engine()
    assert outs == generate_ids(model, prompts, params, tok, engine="serving")  # the seed fixes every row
    assert engine_generate.held_engine() is engine  # one engine, reused across calls
    assert len({tuple(o) for o in outs}) > 4  # rows of a group draw from their own generators
    for o in outs:
        text = tok.decode(o)
        assert 3 not in o[:-1] and "zz" not in text[:-1]
        assert o[-1] == 3 or text.endswith("zz") or len(o) == 8
    engine_generate.release_engine()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_serving_engine_sees_weight_updates_in_place(device):
    """The engine is kept across calls; an in-place update of the weights (an optimizer step) changes its
    next rollout exactly as it changes the built-in loop's (on CUDA: through compiled, graph-replayed steps)."""
    model = _sharp_cookmind(vocab_size=11).to(device)
    prompts = [[1, 2, 3], [5]]
    params = dict(max_new_tokens=6, temperature=0.0)
    generate_ids(model, prompts, SamplingParams(**params), engine="serving")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.0).add_(0.3)
    want = generate_ids(model, prompts, SamplingParams(**params), engine="builtin")
    assert generate_ids(model, prompts, SamplingParams(**params), engine="serving") == want


ANSWER_MUST = r"'answer' must be text \('\.\.\. #### N'\) or a finite number, got "


def test_problem_files_take_a_number_answer_and_packs_field_names_and_name_a_bad_field(tmp_path):
    """grpo.problems kept {"answer": 4} as the int 4, and the reward raised a TypeError at the first rollout that
    wrote '#### N' (mid-run, after training time); {"prompt", "ground_truth"}, which `pack --train-type grpo` reads,
    was refused as "expected a JSON object with 'question' and 'answer' ('question')". A number answer is now its
    text, pack's field names are read, and a missing or mistyped field is named with file:line."""
    from cookmind.align.objective import load_problems
    from cookmind.align.rewards import reward_fn_for_template

    path = tmp_path / "p.jsonl"
    rows = [
        {"question": "2+2?", "answer": 4},
        {"prompt": "1.5+1?", "ground_truth": 2.5},
        {"question": "3+4?", "reference_answer": "7"},
        {"question": "1+1?", "answer": "1+1=2\n#### 2"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems(path)
    assert problems == [
        {"question": "2+2?", "answer": "4"},
        {"question": "1.5+1?", "answer": "2.5"},
        {"question": "3+4?", "answer": "7"},
        {"question": "1+1?", "answer": "1+1=2\n#### 2"},
    ]
    reward = reward_fn_for_template("chat")
    assert [reward(f"#### {a}", p["answer"])["answer_reward"] for a, p in zip((4, 2.5, 7, 2), problems)] == [1.0] * 4
    for bad, why in (
        ({"prompt": "2+2?", "solution": "4"}, r"missing field: expected one of \['answer', 'reference_answer', "),
        ({"answer": "4"}, r"missing field: expected one of \['question', 'prompt'\], found \['answer'\]"),
        (
            {"question": "2+2?", "answer": True},
            r"'answer' must be text \('\.\.\. #### N'\) or a finite number, got bool",
        ),
        (
            {"question": "2+2?", "answer": float("nan")},
            r"'answer' must be text \('\.\.\. #### N'\) or a finite number, got nan",
        ),
        ({"question": ["2+2?"], "answer": "4"}, r"'question' must be text, got list"),
        ("[1, 2]", r"expected a JSON object, got list"),
    ):
        path.write_text(json.dumps(rows[0]) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n")
        with pytest.raises(ValueError, match=rf"p\.jsonl:2: {why}"):
            load_problems(path)


def test_prompts_that_leave_less_than_max_new_tokens_of_the_context_are_said_not_cut_silently(tmp_path):
    """A prompt of 46 tokens in a 48-token model has room for 2 of grpo.max_new_tokens=5: its rollouts stopped at
    the context's end and were graded as they stood, with nothing said (a 200-token GSM8K prompt in a 256-token
    model gets 56 of 64). Setup now says how many prompts of each source are so short of room. Reference: the
    prompt lengths (one XYZ token a character) plus max_new_tokens against the context."""
    lengths = [1, 2, 3, 44, 46]
    problems = [{"question": "?" * n, "answer": ""} for n in lengths]
    short = sum(n + 5 > 48 for n in lengths)
    gcfg = GRPOConfig(group_size=2, max_new_tokens=5, eval_max_new_tokens=2, template="{question}", stop_strings=())
    with pytest.warns(UserWarning) as caught:
        _grpo_trainer(tmp_path, 1, problems=problems, eval_problems=problems, gcfg=gcfg)
    said = [str(w.message) for w in caught]
    assert (
        f"grpo.problems: {short} of 5 prompts leave less than grpo.max_new_tokens=5 tokens of the model's context "
        "(48) for the answer" in " ".join(said)
    )
    assert not any(s.startswith("grpo.eval_problems:") for s in said)  # 46 + 2 fits: eval answers are not cut


def test_the_room_warning_for_eval_problems_counts_only_the_ones_eval_size_grades(tmp_path):
    """grpo.eval_size=2 grades the first 2 of grpo.eval_problems, but the room warning counted all 5 ('2 of 5 prompts
    leave less than ...') though only one graded prompt is short of room. It now counts the graded ones. Reference:
    the graded prompts' lengths (one XYZ token a character) plus max_new_tokens against the 48-token context."""
    lengths = [1, 46, 2, 44, 3]
    eval_problems = [{"question": "?" * n, "answer": ""} for n in lengths]
    problems = [{"question": "?", "answer": ""}]
    for size, said_short in ((2, "1 of 2"), (1, None), (0, "2 of 5")):
        gcfg = GRPOConfig(group_size=2, max_new_tokens=5, eval_size=size, template="{question}", stop_strings=())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _grpo_trainer(tmp_path / str(size), 1, problems=problems, eval_problems=eval_problems, gcfg=gcfg).close()
        said = [str(w.message) for w in caught if str(w.message).startswith("grpo.eval_problems:")]
        if said_short is None:
            assert not said
        else:
            assert len(said) == 1 and said[0].startswith(f"grpo.eval_problems: {said_short} prompts leave less than")


def test_grpo_config_refuses_wrong_types_and_out_of_range_values_naming_the_field():
    """grpo.group_size=abc and an unquoted grpo.template='Q: {question}\\nA:' (YAML reads a mapping) ended in
    TypeError tracebacks; grpo.max_new_tokens=0 trained on empty rollouts and grpo.eval_size=-3 held out all but
    the last 3 problems (a slice), both saying nothing. Each is now one line naming grpo.KEY."""
    for values, why in (
        ({"group_size": "abc"}, r"grpo.group_size: expected an integer, got 'abc'"),
        ({"template": {"Q": {"question": None}, "A": None}}, r"grpo.template: expected a string, got .*quote it"),
        ({"max_new_tokens": 0}, r"grpo.max_new_tokens=0: must be at least 1"),
        ({"min_new_tokens": -1}, r"grpo.min_new_tokens=-1: must be at least 0"),
        ({"eval_size": -3}, r"grpo.eval_size=-3: must be at least 0 \(0: all of grpo.eval_problems\)"),
        ({"eval_max_new_tokens": 0}, r"grpo.eval_max_new_tokens=0: must be at least 1"),
        ({"rollout_chunk": 0}, r"grpo.rollout_chunk=0: must be at least 1"),
        ({"temperature": -1}, r"grpo.temperature=-1.0: must be at least 0"),
        ({"top_p": 2}, r"grpo.top_p=2.0: must be in \(0, 1\]"),
        ({"normalize_by_std": "yes"}, r"grpo.normalize_by_std: expected true/false, got 'yes'"),
    ):
        with pytest.raises(ValueError, match=why):
            GRPOConfig.from_dict(values)
    cfg = GRPOConfig.from_dict({"group_size": 4.0, "temperature": 1, "template": "Q: {question}\nA:"})
    assert (cfg.group_size, cfg.temperature, cfg.template) == (4, 1.0, "Q: {question}\nA:")


def test_grpo_and_dpo_weights_of_the_wrong_sign_are_refused_naming_the_field():
    """grpo.cliprange=-0.2, grpo.advantage_eps=-1, grpo.format_weight=-1 and dpo.nll_weight=-1 trained (a clip range
    upside down, a std that can divide by zero, a reward for ignoring the format, a loss that raises the chosen
    answers' NLL); grpo.kl_coef=-1 was told it 'needs a reference'; grpo.group_size=1 trained nothing (a group's
    baseline is its one reward: every advantage 0). Each is one line naming the field and its range."""
    from cookmind.train import TrainConfig

    for values, why in (
        ({"cliprange": -0.2}, r"grpo.cliprange=-0.2: must be above 0"),
        ({"advantage_eps": -1}, r"grpo.advantage_eps=-1.0: must be at least 0"),
        ({"format_weight": -1}, r"grpo.format_weight=-1.0: must be at least 0"),
        ({"kl_coef": -1}, r"grpo.kl_coef=-1.0: must be at least 0"),
        ({"group_size": 1}, r"grpo.group_size=1: .*every advantage is 0.*at least 2 .*loss_type=no_baseline"),
        # greedy rollouts of a problem are one answer group_size times: the same as a group of 1
        ({"temperature": 0}, r"grpo.temperature=0.0: .*the same greedy answer.*every advantage is 0"),
    ):
        with pytest.raises(ValueError, match=why):
            GRPOConfig.from_dict(values)
    assert GRPOConfig.from_dict({"group_size": 1, "loss_type": "no_baseline"}).group_size == 1  # raw rewards train
    with pytest.raises(ValueError, match=r"dpo.nll_weight must be >= 0, got -1.0"):
        TrainConfig.from_dict({"train": {"objective": "dpo"}, "dpo": {"nll_weight": -1}})


def test_a_problem_with_an_empty_question_or_answer_is_a_bad_record(tmp_path):
    """load_problems took {"question": "", ...} and {"answer": "  "}: a rollout from an empty prompt, graded against an
    answer no response can match. As pack reads a GRPO record, an empty required field is a bad record: file:line."""
    from cookmind.align.objective import load_problems

    path = tmp_path / "p.jsonl"
    for bad, why in (
        ({"question": " ", "answer": "4"}, "'question'"),
        ({"prompt": "2+2?", "ground_truth": ""}, "'ground_truth'"),
    ):
        path.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=rf"p\.jsonl:2: empty text in {why}"):
            load_problems(path)


def test_problem_files_are_split_at_newlines_only(tmp_path):
    """load_problems split the file with str.splitlines, which also breaks at U+2028, U+0085, form feeds and other
    characters a JSON string may hold raw (json.dumps(..., ensure_ascii=False) writes them so): a valid line was
    refused as "not valid JSON", and every later error named the wrong line. Lines end at a newline only, as
    `pack` and `eval gsm8k` read JSONL."""
    from cookmind.align.objective import load_problems

    path = tmp_path / "p.jsonl"
    rows = [{"question": "Ann has 3\u2028apples\x0c and 2\x85pears. How many?", "answer": "5"}, {"answer": "4"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:2: missing field"):
        load_problems(path)
    path.write_text(json.dumps(rows[0], ensure_ascii=False) + "\r\n", encoding="utf-8")
    assert load_problems(path) == [{"question": rows[0]["question"], "answer": "5"}]
    path.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": 4\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:2: not valid JSON \(Expecting ',' delimiter at column 33\)"):
        load_problems(path)


def test_offline_rollouts_report_only_what_they_measured():
    # stored responses carry a reward and nothing else: no grading, no groups, no budget to run into
    model = tiny_hf_model(vocab_size=5)
    obj = GRPOObjective(GRPOConfig(group_size=2, template="{question}", stop_strings=()), tokenizer=XYZ())
    batch = {
        "prompt_ids": torch.tensor([[4, 4], [4, 3]]),
        "prompt_lengths": torch.tensor([2, 1]),
        "response_ids": torch.tensor([[1, 2, 0], [3, 0, 0]]),
        "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        "reward": torch.tensor([1.0, 0.0]),
    }
    _, metrics = obj(model, obj.prepare(model, batch))
    assert metrics["reward"] == 0.5 and metrics["response_length"] == 1.5
    for unmeasured in ("accuracy", "format_reward", "cut_short", "frac_zero_std_groups"):
        assert unmeasured not in metrics, unmeasured


def test_plain_template_rollouts_and_held_out_answers_end_where_the_model_makes_up_the_next_question():
    """grpo.template=plain (or a template of one's own) sampled on past the answer into a question the model made
    up, and graded that question's last number: a right answer scored 0 in the rollouts and in val_accuracy, where
    `eval gsm8k --template plain` (which stops at "\\nQuestion:") scored it 1. They stop alike now."""
    from test_align_fixtures import CharTok, OracleLM

    from cookmind.align.objective import evaluate_accuracy
    from cookmind.evals.gsm8k import evaluate_gsm8k

    problems = [{"question": "Tom has 1 apple and buys 2 more. How many?", "answer": "#### 3"}]

    def respond(prompt):
        return " 3\nQuestion: Ann has 7 pens and loses 3. How many?\nAnswer: 4"

    oracle = OracleLM(respond, marker="Answer:")
    cfg = GRPOConfig(group_size=2, max_new_tokens=80, template="plain", temperature=1.0)
    held = evaluate_accuracy(oracle, CharTok(), problems, cfg)
    want = evaluate_gsm8k(oracle, CharTok(), problems, template="plain", max_new_tokens=80, progress=False)
    assert held["accuracy"] == want["accuracy"] == 1.0, held["responses"]
    assert held["responses"] == [" 3\nQuestion:"]
    objective = GRPOObjective(cfg, tokenizer=CharTok())
    prompt = CharTok().encode("Question: " + problems[0]["question"] + "\nAnswer:")
    batch = {"prompt_ids": torch.tensor([prompt]), "answer": [problems[0]["answer"]]}
    assert objective.prepare(oracle, batch)["raw_rewards"].tolist() == [1.0, 1.0]
    # a template of one's own stops at its question marker; chat and the think templates as before
    custom = GRPOConfig(template="Q: {question}\nA:")
    assert sampling_params(custom, CharTok(), seed=0).stop_strings == ("\nQ:",)
    assert sampling_params(GRPOConfig(template="chat"), CharTok(), seed=0).stop_strings == ()
    assert sampling_params(GRPOConfig(template="compact"), CharTok(), seed=0).stop_strings == ("</answer>",)
    assert sampling_params(GRPOConfig(template="plain", stop_strings=()), CharTok(), seed=0).stop_strings == ()


def test_offline_micro_batches_whose_rewards_never_vary_say_so_once():
    """Offline rollouts take each micro-batch's mean reward as the baseline: a run of micro-batches whose stored
    rewards are all the same trains nothing (every advantage 0) and said nothing, where online GRPO warns."""
    from cookmind.align.objective import NO_SIGNAL_BATCHES

    model = tiny_hf_model(vocab_size=5)
    obj = GRPOObjective(GRPOConfig(group_size=2, template="{question}", stop_strings=()), tokenizer=XYZ())

    def batch(rewards):
        return {
            "prompt_ids": torch.tensor([[4, 4], [4, 3]]),
            "prompt_lengths": torch.tensor([2, 1]),
            "response_ids": torch.tensor([[1, 2, 0], [0, 0, 0]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
            "reward": torch.tensor(rewards),
        }

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(NO_SIGNAL_BATCHES - 1):
            assert obj.prepare(model, batch([1.0, 1.0]))["advantages"].abs().sum() == 0
        obj.prepare(model, batch([1.0, 0.0]))  # one with a signal starts the count again
        for _ in range(NO_SIGNAL_BATCHES - 1):
            obj.prepare(model, batch([1.0, 1.0]))
    assert not [w for w in caught if "no learning signal" in str(w.message)]
    with pytest.warns(UserWarning, match="no learning signal") as caught:
        obj.prepare(model, batch([1.0, 1.0]))
    said = str(caught[0].message)
    assert f"last {NO_SIGNAL_BATCHES} micro-batches of offline rollouts" in said and "rewards 1 to 1" in said, said
    assert "train.micro_batch_size" in said and "grpo.loss_type=no_baseline" in said, said
    # without a baseline the raw rewards train: nothing to say
    raw = GRPOObjective(GRPOConfig(group_size=2, loss_type="no_baseline", template="{question}"), tokenizer=XYZ())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(NO_SIGNAL_BATCHES + 1):
            raw.prepare(model, batch([1.0, 1.0]))
    assert not [w for w in caught if "no learning signal" in str(w.message)]


def test_expert_iteration_drops_and_counts_problems_whose_prompt_fills_the_context(tmp_path):
    """One problem whose prompt filled the model's context stopped the whole run with generate's
    "prompts[0] has 60 tokens" (an index into the repeated samples, naming no problem); GRPO drops and counts them."""
    short = [{"question": "?" * n, "answer": ""} for n in (1, 2, 3)]
    problems = [short[0], {"question": "?" * 48, "answer": ""}, *short[1:], {"question": "?" * 60, "answer": ""}]

    def reward(resp, _t):
        ok = float(resp.startswith("x"))
        return {"reward": ok, "format_reward": 1.0, "answer_reward": ok}

    cfg = ExpertIterationConfig(
        n_rounds=1, questions_per_round=5, samples_per_question=2, max_new_tokens=2, template="{question}"
    )
    with pytest.warns(UserWarning) as caught:
        hist = run_expert_iteration(
            _tiny_cookmind(), XYZ(), problems, _train_cfg(tmp_path, 1, 4), cfg, eval_problems=problems, reward_fn=reward
        )
    said = [str(w.message) for w in caught]
    tail = "problems are dropped: their prompts fill the model's context of 48 tokens"
    assert f"run_expert_iteration: 2 of 5 training {tail}" in said, said
    assert f"run_expert_iteration: 2 of 5 eval {tail}" in said, said
    assert hist[0]["problems_dropped"] == 2 and hist[0]["eval_problems_dropped"] == 2
    assert 0.0 <= hist[0]["eval_accuracy"] <= 1.0
    with pytest.raises(ValueError, match="every training problem's prompt fills the model's context of 48 tokens"):
        run_expert_iteration(_tiny_cookmind(), XYZ(), problems[1:2], _train_cfg(tmp_path / "b", 1, 4), cfg)


def test_held_out_evaluations_say_how_many_problems_they_graded(tmp_path):
    """grpo.eval_size=N grades the first N held-out problems, and nothing said so: the run's data row counted the
    file's problems (grpo_eval_problems_records: 1319 for GSM8K's test set) beside a val_accuracy over 8."""
    held = [{"question": "?" * n, "answer": "x"} for n in (1, 2, 3)]
    for size, want in ((2, 2), (0, 3), (10, 3)):
        gcfg = GRPOConfig(group_size=2, max_new_tokens=1, template="{question}", stop_strings=(), eval_size=size)
        run = tmp_path / f"size{size}"
        summary = _grpo_trainer(run, 1, problems=PROBLEMS, gcfg=gcfg, eval_problems=held).fit()
        assert [r["val_problems"] for r in _rows(run, "val")] == [want] and summary["val_problems"] == want


def test_a_reference_without_a_kl_term_is_refused_not_ignored():
    """grpo.reference=copy (or base) with the default grpo.kl_coef=0 trained with no KL term and no reference, saying
    nothing: the reference only serves the KL penalty."""
    for kind in ("copy", "base"):
        with pytest.raises(ValueError) as caught:
            GRPOConfig.from_dict({"reference": kind})
        assert str(caught.value) == (
            f"grpo.reference={kind} is the reference of the KL penalty, and grpo.kl_coef=0 turns that off: set "
            f"grpo.kl_coef above 0 (e.g. 0.04) to use it, or leave grpo.reference out"
        )
    assert GRPOConfig.from_dict({"reference": "copy", "kl_coef": 0.04}).reference == "copy"
    assert GRPOConfig.from_dict({"reference": "none"}).reference == "none"


def test_a_base_reference_outside_lora_names_the_settings(tmp_path):
    """grpo.reference=base in a run that trains no adapters said "reference 'base' needs a LoRA model (peft, or one
    with disable_adapters()); use 'copy'": library words, where the run's settings are grpo.reference and
    lora.enabled."""
    gcfg = GRPOConfig(group_size=2, max_new_tokens=2, template="{question}", stop_strings=(), kl_coef=0.1)
    gcfg.reference = "base"
    with pytest.raises(ValueError) as caught:
        _grpo_trainer(tmp_path, 1, gcfg=gcfg).fit()
    assert str(caught.value) == (
        "grpo.reference=base is the LoRA base model (the policy with its adapters off), and this run trains no "
        "adapters (lora.enabled=false): set lora.enabled=true, or grpo.reference=copy for a frozen copy of the "
        "starting model"
    )


def test_held_out_problems_that_are_training_problems_are_warned_of(tmp_path):
    """grpo.eval_problems=gsm8k/train.jsonl beside training on the same file graded the problems the run trains on
    as held out, and val_accuracy read as generalisation; a validation store with the training data is warned of."""
    problems = [{"question": "?" * k, "answer": str(k)} for k in range(1, 7)]
    held = [problems[1], {"question": "?" * 9, "answer": "9"}, problems[4]]
    with pytest.warns(UserWarning) as caught:
        _grpo_trainer(tmp_path / "a", 1, problems=problems, eval_problems=held)
    said = [str(w.message) for w in caught if "held-out" in str(w.message)]
    assert said == [
        "grpo: 2 of the 3 held-out problems graded (grpo.eval_problems) are training problems too (their questions "
        "are in grpo.problems): val_accuracy measures them after training on them, not held-out ones; hold them out of "
        "the training problems (GSM8K: train.jsonl to train, test.jsonl to evaluate)"
    ], said
    with warnings.catch_warnings(record=True) as caught:  # apart: nothing to say
        warnings.simplefilter("always")
        _grpo_trainer(tmp_path / "b", 1, problems=problems, eval_problems=held[1:2])
    assert not [w for w in caught if "held-out" in str(w.message)]


def test_no_baseline_rollouts_that_all_earn_a_reward_are_not_called_signal_free():
    """grpo.loss_type=no_baseline weights each rollout by its raw reward: groups that all scored 1 train (each answer's
    likelihood rises), yet after 10 such batches the run warned "no learning signal ... every advantage is 0". Only
    rewards that are all 0 train nothing there."""
    from cookmind.align.objective import NO_SIGNAL_BATCHES

    obj = GRPOObjective(GRPOConfig(group_size=4, loss_type="no_baseline", template="chat"), tokenizer=XYZ())
    earned = {"frac_zero_std_groups": 1.0, "reward_min": 1.0, "reward_max": 1.0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(NO_SIGNAL_BATCHES + 1):
            obj._note_signal(earned)
    assert not [w for w in caught if "no learning signal" in str(w.message)]
    nothing = {"frac_zero_std_groups": 1.0, "reward_min": 0.0, "reward_max": 0.0}
    with pytest.warns(UserWarning, match="no learning signal.*no rollout earned any reward"):
        for _ in range(NO_SIGNAL_BATCHES):
            obj._note_signal(nothing)


def test_rollout_seeds_of_ranks_and_steps_never_overlap(monkeypatch):
    """Row i of a rollout batch samples from a generator seeded seed + i, and the batch's seed was
    (train.seed * 1_000_003 + calls) * 101 + rank: rank 1's rows drew rank 0's random numbers shifted by one row (7 of
    a group's 8 streams shared with another problem's group), and a batch of more than 101 rows (16 problems x 8)
    shared its last rows' streams with the next batch's first. Each rank's batch now has a block of seeds of its own;
    one process with up to 101 rows a batch keeps its seeds (the demo's figures stand)."""
    import cookmind.align.objective as objective_module

    seen = []

    def fake_collect(model, tokenizer, prompts, answers, group_size, params, *args, **kwargs):
        seen.append((params.seed, len(prompts) * group_size))
        rows = len(prompts) * group_size
        return {
            "input_ids": torch.zeros(rows, 2, dtype=torch.long),
            "labels": torch.zeros(rows, 2, dtype=torch.long),
            "response_mask": torch.ones(rows, 2),
            "advantages": torch.zeros(rows),
            "raw_rewards": torch.zeros(rows),
            "metadata": {"frac_zero_std_groups": 0.0},
        }

    monkeypatch.setattr(objective_module, "collect_rollouts", fake_collect)
    model = tiny_hf_model(vocab_size=5)

    def seeds(prompts, group_size, world, calls=3, seed=0):
        spans = []
        for rank in range(world):
            obj = GRPOObjective(GRPOConfig(group_size=group_size, template="{question}"), tokenizer=XYZ(), seed=seed)
            obj.rank, obj.world = rank, world
            batch = {"prompt_ids": torch.full((prompts, 1), 4), "answer": [""] * prompts}
            seen.clear()
            for _ in range(calls):
                obj.prepare(model, batch)
            spans += [range(s, s + n) for s, n in seen]
        return spans

    for prompts, group_size, world in ((16, 8, 1), (2, 4, 2), (8, 8, 4)):
        rows = [r for span in seeds(prompts, group_size, world) for r in span]
        assert len(rows) == len(set(rows)), (prompts, group_size, world)  # no two rows share a random stream
    # one process, 8 x 8 rows: the seeds the demo's runs used
    assert [s.start for s in seeds(8, 8, 1, seed=3)] == [(3 * 1_000_003 + c) * 101 for c in range(3)]


def test_expert_iteration_rounds_sample_from_streams_of_their_own(monkeypatch, tmp_path):
    """Round k sampled its row i from seed (seed * 7919 + k) + i: round 2's rows drew round 1's random streams shifted
    by one row (and a seed's rounds of more than 7919 rows the next seed's). Each round has a block of its own."""
    import cookmind.align.expert_iteration as ei

    seen = []

    def fake_generate(model, prompts, params, tokenizer, **kwargs):
        seen.append(range(params.seed, params.seed + len(prompts)))
        return [[1] for _ in prompts]  # 'y': never right, so no SFT round runs

    monkeypatch.setattr(ei, "generate_ids", fake_generate)
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 9)]
    cfg = ExpertIterationConfig(n_rounds=3, questions_per_round=6, samples_per_question=4, template="{question}")
    for seed in (0, 1):
        cfg.seed = seed
        run_expert_iteration(_tiny_cookmind(), XYZ(), problems, _train_cfg(tmp_path, 1, 4), cfg, reward_fn=x_fraction)
    rows = [r for span in seen for r in span]
    assert len(seen) == 6 and len(rows) == len(set(rows)) == 6 * 24


def test_a_resume_on_other_problems_than_the_stream_it_trained_on_is_refused(tmp_path):
    """A resume takes the stream's next problems by position: with grpo.problems edited (or another file named)
    between the runs, it went on at the old position in other problems, silently (a store that changed is
    refused, by its fingerprint)."""
    gcfg = GRPOConfig(group_size=2, max_new_tokens=2, template="{question}", stop_strings=())
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 9)]
    _grpo_trainer(tmp_path, 1, problems=problems, prompts_per_step=2, gcfg=gcfg, checkpoint={"every": 1}).fit()
    edited = [{"question": "x" + p["question"], "answer": ""} for p in problems]
    with pytest.raises(ValueError) as caught:
        _grpo_trainer(tmp_path, 2, problems=edited, prompts_per_step=2, gcfg=gcfg, checkpoint={"resume": "auto"}).fit()
    assert str(caught.value) == (
        "grpo.problems: not the problems the checkpoint's run trained on (the file's problems have changed, or "
        "another file is named): a resume takes the next problems of the same stream; give it back, or train the "
        "checkpoint's weights on these with a new run (--init-from CHECKPOINT and another --run-dir)"
    )
    resume = {"resume": "auto"}
    resumed = _grpo_trainer(tmp_path, 2, problems=problems, prompts_per_step=2, gcfg=gcfg, checkpoint=resume)
    resumed.fit()
    assert resumed.objective.position == 4


def test_a_resume_past_the_end_of_the_stream_does_not_say_it_starts_again_from_the_first():
    """Resumed at position 4 of a 3-problem stream, the run warned "the run has used 4; it starts again from the
    first": it was already in its second pass, taking problem 2. It says which pass it is in now."""
    from types import SimpleNamespace

    problems = [{"question": "?" * k, "answer": ""} for k in (1, 2, 3)]
    trainer = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(micro_batch_size=1)))
    obj = GRPOObjective(GRPOConfig(group_size=2, template="{question}"), tokenizer=XYZ(), problems=problems)
    obj.load_state_dict({"calls": 4, "position": 4})
    with pytest.warns(UserWarning) as caught:
        batch = obj._next_problems(trainer)
    assert [str(w.message) for w in caught] == [
        "grpo: the problem stream has 3 problems and the run has used 4: it is in its pass 2 over them (problems "
        "repeat)"
    ]
    assert batch["prompt_ids"].tolist() == [[4, 4]]  # problem 2 (0-based 1): "??"
    fresh = GRPOObjective(GRPOConfig(group_size=2, template="{question}"), tokenizer=XYZ(), problems=problems)
    fresh.load_state_dict({"calls": 2, "position": 2})
    with pytest.warns(UserWarning, match="has used 2; it starts again from the first"):
        fresh._next_problems(SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(micro_batch_size=2))))


def test_the_count_of_held_out_problems_is_in_the_reports_text_not_a_curve(tmp_path, monkeypatch):
    """A GRPO run with held-out problems logs val_problems (how many each evaluation graded) beside val_accuracy, and
    report.md drew it as a panel of objective.png, a flat line among the curves to read the objective by. A count
    says how big the evaluation was: it is a column of the validation table, beside the accuracy it is the
    denominator of, and no panel."""
    from cookmind.train import report

    panels = {}
    real = report.plot_panels
    monkeypatch.setattr(report, "plot_panels", lambda path, p, **kw: (panels.update(p), real(path, p, **kw))[1])
    held = [{"question": "?" * k, "answer": ""} for k in (4, 5)]  # none of them a training problem
    trainer = _grpo_trainer(tmp_path, 2, eval_problems=held, logging={"report": True}, eval={"every": 1})
    trainer.fit()
    val = _rows(tmp_path, "val")
    assert val and all(r["val_problems"] == 2 for r in val)  # what the run logs is unchanged
    assert "problems" not in panels and "accuracy" in panels and panels["accuracy"]["val"][0] == [1, 2]
    table = (tmp_path / "report.md").read_text().split("## Validation")[1].split("\n## ")[0]
    header = next(line for line in table.splitlines() if line.startswith("| step |"))
    assert "| problems |" in header, table
    column = header.strip("|").split("|").index(" problems ")
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| 1 |")]
    assert rows and rows[0][column].strip() == "2", table


def test_held_out_accuracy_shows_its_progress_and_grades_as_before(monkeypatch, capsys):
    """GRPO's held-out evaluation (evaluate_accuracy: every grpo.eval_problems answer generated at each evaluation)
    drew no progress, so a large held-out set looked like a hung run; it counts its problems now, as `eval gsm8k`."""
    from test_align_fixtures import CharTok, OracleLM

    from cookmind import progress
    from cookmind.align.objective import evaluate_accuracy

    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)  # a line at every update in a pipe (no waiting in a test)
    problems = [{"question": f"What is {n} plus 1?", "answer": f"#### {n + 1}"} for n in range(5)]

    def respond(prompt):  # right for the even numbers: 3 of 5
        n = int(prompt.split("What is ")[1].split(" ")[0])
        return f" {n + 1 if n % 2 == 0 else n}"

    cfg = GRPOConfig(max_new_tokens=8, template="plain", rollout_chunk=2)
    held = evaluate_accuracy(OracleLM(respond, marker="Answer:"), CharTok(), problems, cfg, progress=True)
    assert held["accuracy"] == pytest.approx(3 / 5)
    assert [r.strip() for r in held["responses"]] == ["1", "1", "3", "3", "5"]
    lines = capsys.readouterr().err.splitlines()
    assert lines and lines[-1].startswith("held-out accuracy") and "5/5" in lines[-1], lines
    evaluate_accuracy(OracleLM(respond, marker="Answer:"), CharTok(), problems, cfg, progress=False)
    assert capsys.readouterr().err == ""


def test_held_out_accuracy_hands_the_engine_several_chunks_a_call_and_answers_as_one_call(monkeypatch):
    """evaluate_accuracy generated one grpo.rollout_chunk a call (for its bar), so the serving engine could not
    refill the slots a chunk's short answers freed with the next chunk's problems; it hands it several chunks a call
    now, and every response is the one a single call over all the problems gives (row i seeded i)."""
    from lm_fixtures import tiny_lm
    from test_align_fixtures import CharTok

    from cookmind.align import objective
    from cookmind.align.prompts import decode_response, encode_prompt

    torch.manual_seed(0)
    model = tiny_lm(vocab_size=256)
    tok = CharTok()
    problems = [{"question": f"What is {n} plus {n % 3}?", "answer": f"#### {n + n % 3}"} for n in range(9)]
    cfg = GRPOConfig(max_new_tokens=6, template="plain", rollout_chunk=2, engine="serving")
    calls = []

    def recorded(model, prompts, params, tokenizer=None, **kw):
        calls.append(len(prompts))
        return generate_ids(model, prompts, params, tokenizer, **kw)

    monkeypatch.setattr(objective, "generate_ids", recorded)
    held = objective.evaluate_accuracy(model, tok, problems, cfg)
    assert sum(calls) == 9 and max(calls) > cfg.rollout_chunk, calls
    ids = [encode_prompt(tok, p["question"], cfg.template) for p in problems]
    params = sampling_params(cfg, tok, seed=0, greedy=True)
    one = generate_ids(model, ids, params, tok, batch_size=cfg.rollout_chunk, engine="serving")
    assert held["responses"] == [decode_response(tok, o) for o in one]
