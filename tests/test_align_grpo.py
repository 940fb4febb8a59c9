"""Rollout sampling, the GRPO driver, its Trainer objective and expert iteration on tiny models."""

import pytest
import torch
from test_align_fixtures import XYZ, one_torch_thread, tiny_hf_model, x_fraction  # noqa: F401

from cookmind.align.expert_iteration import ExpertIterationConfig, run_expert_iteration
from cookmind.align.grpo import GRPOConfig, run_grpo
from cookmind.align.objective import GRPOObjective
from cookmind.align.rollout import SamplingParams, generate_ids




PROBLEMS = [{"question": "?", "answer": ""}, {"question": "??", "answer": ""}, {"question": "???", "answer": ""}]


def test_builtin_greedy_matches_hf_generate():
    model = tiny_hf_model(vocab_size=40)
    model.generation_config.eos_token_id = None
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11]]
    ours = generate_ids(model, prompts, SamplingParams(max_new_tokens=6, temperature=0.0), engine="builtin")
    for p, o in zip(prompts, ours):
        ref = model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        assert o == ref


def test_sampling_gives_distinct_rows_and_stops_on_string_and_token():
    model = tiny_hf_model(vocab_size=5)
    tok = XYZ()
    prompts = [[4]] * 16  # one prompt repeated, as in a GRPO group
    outs = generate_ids(model, prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0, stop_token_ids=(3,),
                                                       stop_strings=("zz",)), tok)
    assert len({tuple(o) for o in outs}) > 4  # a group must not be 16 copies of one sample
    for o in outs:
        text = tok.decode(o)
        # ends on the first stop token or the first completed "zz", else runs to max_new_tokens
        assert 3 not in o[:-1] and "zz" not in text[:-1]
        assert o[-1] == 3 or text.endswith("zz") or len(o) == 8


def test_grpo_raises_reward_on_hf_model_from_local_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_hf_model(tmp_path / "m", vocab_size=5)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", local_files_only=True)
    cfg = GRPOConfig(n_steps=10, rollout_batch_size=24, group_size=8, train_batch_size=24, learning_rate=1e-2,
                     max_new_tokens=5, template="{question}", stop_strings=(), eval_every=0)
    hist = run_grpo(model, XYZ(), PROBLEMS, cfg, reward_fn=x_fraction, progress=False)
    first, last = hist[0]["reward"], sum(h["reward"] for h in hist[-3:]) / 3
    assert last > first + 0.25, (first, last)
    for key in ("reward", "format_reward", "accuracy", "response_length", "entropy", "clip_fraction", "grad_norm", "loss"):
        assert key in hist[-1]


def test_grpo_off_policy_epochs_resume_equals_uninterrupted(tmp_path):
    cfg = GRPOConfig(n_steps=4, rollout_batch_size=16, group_size=4, train_batch_size=8, epochs_per_rollout_batch=2,
                     learning_rate=1e-2, max_new_tokens=4, template="{question}", stop_strings=(), eval_every=0,
                     kl_coef=0.1, reference="copy")
    straight = tiny_hf_model(vocab_size=5)
    h1 = run_grpo(straight, XYZ(), PROBLEMS, cfg, reward_fn=x_fraction, progress=False)
    assert any(h["clip_fraction"] > 0 for h in h1) and all(h["kl"] >= 0 for h in h1)  # the ratio really moved off 1
    part = tiny_hf_model(vocab_size=5)
    from dataclasses import replace

    run_grpo(part, XYZ(), PROBLEMS, replace(cfg, n_steps=2), reward_fn=x_fraction, workdir=tmp_path, progress=False)
    resumed = tiny_hf_model(vocab_size=5, seed=123)  # different init: everything must come from the checkpoint
    h2 = run_grpo(resumed, XYZ(), PROBLEMS, cfg, reward_fn=x_fraction, workdir=tmp_path, resume=True, progress=False)
    assert [h["step"] for h in h2] == [1, 2, 3, 4]
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_grpo_objective_loss_matches_manual_and_counts_calls():
    model = tiny_hf_model(vocab_size=5)
    obj = GRPOObjective(GRPOConfig(group_size=4, max_new_tokens=4, template="{question}", stop_strings=(), loss_type="grpo_clip"),
                        tokenizer=XYZ(), reward_fn=x_fraction)
    batch = {"prompt_ids": torch.tensor([[4, 4], [4, 3]]), "prompt_lengths": torch.tensor([2, 1]), "answer": ["", ""]}
    loss_batch = obj.prepare(model, batch)
    assert loss_batch["input_ids"].shape[0] == 8 and obj.state_dict() == {"calls": 1}
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


def test_expert_iteration_keeps_only_correct_and_improves():
    model = tiny_hf_model(vocab_size=5)

    def reward(resp, _t):  # correct: a response that starts with "x"
        ok = float(resp.startswith("x"))
        return {"reward": ok, "format_reward": 1.0, "answer_reward": ok}

    cfg = ExpertIterationConfig(n_rounds=3, questions_per_round=3, samples_per_question=16, batch_size=8, learning_rate=1e-2,
                                sft_epochs=4, max_new_tokens=2, template="{question}")
    hist = run_expert_iteration(model, XYZ(), PROBLEMS, cfg, reward_fn=reward, progress=False)
    assert all(h["kept"] <= round(h["sample_accuracy"] * 48) for h in hist)
    assert hist[-1]["sample_accuracy"] > hist[0]["sample_accuracy"] + 0.2


def test_stream_order_takes_each_problem_once_in_order():
    """prompt_order='stream': step k uses problems [k*P, (k+1)*P), each group_size times; none twice."""
    problems = [{"question": "?" * (i + 1), "answer": str(i)} for i in range(8)]
    seen = []

    def reward(resp, truth):
        seen.append(int(truth))
        return x_fraction(resp, truth)

    cfg = GRPOConfig(n_steps=3, rollout_batch_size=8, group_size=4, train_batch_size=8, learning_rate=1e-3,
                     max_new_tokens=3, template="{question}", stop_strings=(), eval_every=0, prompt_order="stream")
    run_grpo(tiny_hf_model(vocab_size=5), XYZ(), problems, cfg, reward_fn=reward, progress=False)
    assert seen == [i for i in range(6) for _ in range(4)]


def test_grpo_run_is_deterministic_under_its_seed():
    """Same seed, same start: equal rewards, losses and weights (the demo's fixed-step RL stage relies on it)."""
    cfg = GRPOConfig(n_steps=3, rollout_batch_size=16, group_size=4, train_batch_size=16, learning_rate=1e-2,
                     max_new_tokens=4, template="{question}", stop_strings=(), eval_every=0, seed=7)
    runs = []
    for _ in range(2):
        model = tiny_hf_model(vocab_size=5)
        hist = run_grpo(model, XYZ(), PROBLEMS, cfg, reward_fn=x_fraction, progress=False)
        runs.append(([(h["reward"], h["loss"], h["response_length"]) for h in hist], model.state_dict()))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1].values(), runs[1][1].values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    other = tiny_hf_model(vocab_size=5)
    from dataclasses import replace

    hist = run_grpo(other, XYZ(), PROBLEMS, replace(cfg, seed=8), reward_fn=x_fraction, progress=False)
    assert [(h["reward"], h["loss"], h["response_length"]) for h in hist] != runs[0][0]  # the seed matters


def _tiny_cookmind(vocab_size=5):
    from lm_fixtures import sharp_tiny_lm

    return sharp_tiny_lm(vocab_size=vocab_size, max_position_embeddings=48)


def test_serving_engine_greedy_equals_builtin_loop_with_stop_token_kept():
    """engine="serving" (the continuous-batching engine) gives the built-in loop's greedy responses,
    prompts of mixed lengths, stop token included at the end where it was hit."""
    model = _tiny_cookmind(vocab_size=11)
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

    model = _tiny_cookmind()
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
    model = _tiny_cookmind(vocab_size=11).to(device)
    prompts = [[1, 2, 3], [5]]
    params = dict(max_new_tokens=6, temperature=0.0)
    generate_ids(model, prompts, SamplingParams(**params), engine="serving")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.0).add_(0.3)
    want = generate_ids(model, prompts, SamplingParams(**params), engine="builtin")
    assert generate_ids(model, prompts, SamplingParams(**params), engine="serving") == want
