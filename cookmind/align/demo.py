"""The demo's RL stage: GRPO on fresh synthetic word problems, held-out accuracy before and after.

Called by ``cookmind demo`` as ``demo_stage(ctx)`` with its DemoContext (the newest checkpoint,
the tokenizer, the held-out problems, the data the earlier stages trained on), or directly as
``demo_stage(model, tokenizer, train_problems, heldout_problems, workdir, seed, time_budget_s)``.

The setting is RL with verifiable rewards: worked demonstrations are scarce, checkable prompts
are cheap. The demo's model read worked solutions in pretraining, but its chat demonstrations
are few and mostly terse ("The answer is 7."), so after SFT it mostly answers three-step
problems in one jump and is often wrong. GRPO samples answers to problems it has never seen
(a fresh stream from the seeded generator: no held-out question, none the earlier stages
trained on, none repeated), and the only signal is the verifier: does ``#### N`` equal the
truth. Answers that write the steps out are right more often, so the policy moves to them and
held-out accuracy rises. The stage runs a fixed number of steps (deterministic under the
seed); a wall-clock guard stops it early only as a safety net, and says so in the result.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cookmind.align.curves import plot_grpo_curves
from cookmind.align.grpo import GRPOConfig, config_dict, evaluate_accuracy, run_grpo

# Chosen on the demo's model (4 layers x 128 wide, ~0.9M parameters) on 2 CPU cores, from the
# DPO checkpoint (43% held-out): lr 1e-4 and up made held-out accuracy swing by 10-20 points
# (the noisy updates wreck the arithmetic as fast as they teach the working); 3e-5 rises
# steadily. Temperature 0.7 keeps more sampled chains intact than 1.0 (the three-step chain has
# six numbers to get right). "constant" length normalisation (Dr. GRPO) keeps the update free of
# the per-sequence length bias, under which wrong long answers are punished less than wrong
# short ones: the switch to worked answers must come from the reward, not from that bias.
DEMO_GRPO = GRPOConfig(
    template="chat",
    n_steps=160,
    rollout_batch_size=64,  # 8 fresh problems x 8 samples per step
    group_size=8,
    train_batch_size=64,
    learning_rate=3e-5,
    warmup_steps=10,
    loss_type="grpo_clip",
    length_normalization="constant",
    max_new_tokens=40,  # a three-step worked answer is ~25 tokens
    temperature=0.7,
    eval_every=20,
    eval_size=200,  # the whole held-out set, so the curve and before/after are one measure
    save_every=0,  # the stage saves the final model; no per-step resume state
    prompt_order="stream",  # each step takes the next fresh problems: none is seen twice
)
QUICK_GRPO = replace(DEMO_GRPO, n_steps=2, rollout_batch_size=8, group_size=4, train_batch_size=8, max_new_tokens=8,
                     eval_every=0)
# The safety stop (seconds) when COOKMIND_GRPO_SECONDS is unset; the fixed steps take ~2 minutes on 2 cores.
DEFAULT_GUARD_S = 420.0

_STEP = re.compile(r"\d+\s*[-+*]\s*\d+\s*=\s*-?\d+")


def shows_working(text: str) -> bool:
    """True when an answer writes at least one step out (``a + b = c``), not only the result."""
    return bool(_STEP.search(text))


def _questions_trained_on(data_dir: Path) -> set[str]:
    """Every question the earlier stages saw: pretraining text, SFT chats, DPO pairs."""
    seen: set[str] = set()
    for name in ("pretrain.jsonl", "sft.jsonl", "sft_val.jsonl", "dpo.jsonl", "dpo_val.jsonl"):
        path = data_dir / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if "text" in row:
                seen.update(ln[len("Question: "):] for ln in row["text"].splitlines() if ln.startswith("Question: "))
            for key in ("messages", "chosen"):
                seen.update(m["content"] for m in row.get(key, []) if m["role"] == "user")
    return seen


def _from_context(ctx) -> dict[str, Any]:
    from cookmind.model import load_model
    from cookmind.synthetic import arithmetic_problems
    from cookmind.tokenizer import Tokenizer

    held = [json.loads(line) for line in Path(ctx.paths["eval_problems"]).read_text().splitlines() if line.strip()]
    sizes = ctx.sizes
    quick = sizes.sft_steps < 50  # the smoke-test sizes: show the stage runs, nothing more
    cfg = QUICK_GRPO if quick else DEMO_GRPO
    exclude = {p["question"] for p in held}
    if "data" in ctx.paths:
        exclude |= _questions_trained_on(Path(ctx.paths["data"]))
    # one fresh problem per prompt slot of the run: the stream never repeats one
    n_problems = cfg.n_steps * cfg.rollout_batch_size // cfg.group_size
    train = [p.to_dict() for p in arithmetic_problems(n_problems, seed=ctx.seed + 5, level=getattr(sizes, "level", 1),
                                                      max_number=sizes.max_number, exclude=exclude)]
    guard = float(os.environ.get("COOKMIND_GRPO_SECONDS", 60 if quick else DEFAULT_GUARD_S))
    return {
        "model": load_model(ctx.policy, device="cpu"),
        "tokenizer": Tokenizer.load(ctx.paths["tokenizer"]),
        "train_problems": train,
        "heldout_problems": held,
        "workdir": Path(ctx.workdir) / "grpo",
        "seed": ctx.seed,
        "time_budget_s": guard,
        "cfg": cfg,
        "progress": ctx.progress,
    }


def demo_stage(model_or_ctx, tokenizer=None, train_problems=None, heldout_problems=None, workdir=None, seed: int = 0,
               time_budget_s: float | None = None, cfg: GRPOConfig | None = None, progress: bool = True) -> dict[str, Any]:
    """GRPO on arithmetic for ``cfg.n_steps`` steps; held-out accuracy before/after, gain, curves PNG, checkpoint.

    ``time_budget_s`` is a safety stop, not the schedule: when it fires the result says
    ``stopped_early: true`` (and the run is no longer deterministic).
    """
    if hasattr(model_or_ctx, "checkpoints") and hasattr(model_or_ctx, "paths"):
        ctx = model_or_ctx
        args = _from_context(ctx)
        model_or_ctx = args.pop("model")
        result = demo_stage(model_or_ctx, **args)
        if result["stopped_early"]:
            ctx.notes.append(f"GRPO stopped early: the {result['time_budget_s']:.0f} s safety guard fired after "
                             f"{result['steps']} of {result['config']['n_steps']} steps (COOKMIND_GRPO_SECONDS)")
        return result
    model = model_or_ctx
    if tokenizer is None or not train_problems or not heldout_problems or workdir is None:
        raise ValueError("demo_stage needs a model, tokenizer, train and held-out problems and a workdir (or a DemoContext)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = replace(cfg or DEMO_GRPO, seed=seed)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    before = evaluate_accuracy(model, tokenizer, heldout_problems, cfg)
    sampled_before = pass_at_k(model, tokenizer, heldout_problems, cfg, k=cfg.group_size)
    log = workdir / "grpo_log.jsonl"
    if log.exists():
        log.unlink()  # a fresh run: the log is appended per step
    history = run_grpo(model, tokenizer, train_problems, cfg, eval_problems=heldout_problems, workdir=workdir,
                       time_budget_s=time_budget_s, progress=progress)
    after = evaluate_accuracy(model, tokenizer, heldout_problems, cfg)
    sampled_after = pass_at_k(model, tokenizer, heldout_problems, cfg, k=cfg.group_size)
    if history:
        history[-1]["eval_accuracy"], history[-1]["eval_format_rate"] = after["accuracy"], after["format_rate"]
        history[-1]["eval_response_length"] = after["response_length"]
    png = plot_grpo_curves(history, workdir / "grpo_curves.png", before=before["accuracy"],
                           before_length=before["response_length"],
                           title=f"GRPO: held-out accuracy {100 * before['accuracy']:.1f}% -> {100 * after['accuracy']:.1f}%")
    n_seen = min(len(train_problems), len(history) * cfg.rollout_batch_size // cfg.group_size)
    result: dict[str, Any] = {
        "accuracy_before": before["accuracy"],
        "accuracy": after["accuracy"],
        "gain_points": 100 * (after["accuracy"] - before["accuracy"]),
        "format_before": before["format_rate"],
        "answered_in_format": after["format_rate"],
        # sampled at the rollout temperature, group_size samples per held-out problem
        "pass_at_k_before": sampled_before["pass_at_k"],
        "pass_at_k": sampled_after["pass_at_k"],
        "sampled_accuracy_before": sampled_before["pass_at_1"],
        "sampled_accuracy": sampled_after["pass_at_1"],
        "shows_working_before": sum(map(shows_working, before["responses"])) / len(before["responses"]),
        "shows_working": sum(map(shows_working, after["responses"])) / len(after["responses"]),
        "response_length_before": before["response_length"],
        "response_length": after["response_length"],
        "heldout_problems": len(heldout_problems),
        "steps": len(history),
        "stopped_early": len(history) < cfg.n_steps,
        "time_budget_s": time_budget_s,
        "rollouts": len(history) * cfg.rollout_batch_size,
        # stream order: each problem is used once, unless the list is shorter than the run
        "train_problems_seen": n_seen if cfg.prompt_order == "stream" else None,
        "reward_first": _mean([h["reward"] for h in history[:20]]),
        "reward_last": _mean([h["reward"] for h in history[-20:]]),
        "curve": [{"step": 0, "eval_accuracy": before["accuracy"]}]
        + [{"step": h["step"], "eval_accuracy": h["eval_accuracy"]} for h in history if "eval_accuracy" in h],
        **_flips(heldout_problems, before["responses"], after["responses"], cfg),
        "curves_png": str(png),
        "log": str(log),
        "config": config_dict(cfg),
    }
    ckpt = workdir / "model"  # a checkpoint the next demo stages (chat) can load
    if hasattr(model, "save_pretrained"):  # a Hugging Face model
        model.save_pretrained(ckpt)
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(ckpt)
    else:
        from cookmind.model import save_model

        save_model(ckpt, model)
        if hasattr(tokenizer, "save"):
            tokenizer.save(ckpt)
    result["checkpoint"] = str(ckpt)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    state = workdir / "grpo_state.pt"
    if state.exists():
        state.unlink()  # resume state for a crashed run; the model is saved above
    from cookmind.evals.atomic_io import write_json

    write_json(workdir / "grpo_result.json", result)
    return result


def pass_at_k(model, tokenizer, problems, cfg: GRPOConfig, k: int = 8, seed: int = 12345) -> dict[str, float]:
    """Sampled accuracy at the run's temperature: pass@k (share of problems with >= 1 of k samples right) and pass@1.

    pass@k well above the greedy accuracy is the room RL has: right answers the policy already
    samples, which the reward can make its first choice.
    """
    from cookmind.align.grpo import _problem, _sampling, rollout_options
    from cookmind.align.prompts import format_prompt
    from cookmind.align.rewards import reward_fn_for_template
    from cookmind.align.rollout import generate_ids
    from cookmind.align.text_codec import decode_response, encode_text

    grade = reward_fn_for_template(cfg.template, cfg.format_weight)
    problems = [_problem(p) for p in problems]
    ids = [encode_text(tokenizer, format_prompt(p["question"], cfg.template, tokenizer)) for p in problems]
    was_training = model.training
    model.eval()
    outs = generate_ids(model, [x for x in ids for _ in range(k)], _sampling(cfg, tokenizer, seed), tokenizer,
                        **rollout_options(cfg))
    model.train(was_training)
    right = [grade(decode_response(tokenizer, o), problems[i // k]["answer"])["answer_reward"] for i, o in enumerate(outs)]
    per_problem = [max(right[i * k:(i + 1) * k]) for i in range(len(problems))]
    return {"pass_at_k": sum(per_problem) / len(problems), "pass_at_1": sum(right) / len(right), "k": k}


def _flips(problems, before: list[str], after: list[str], cfg: GRPOConfig) -> dict[str, Any]:
    """How many held-out answers went wrong -> right and right -> wrong, with the first of each as examples."""
    from cookmind.align.grpo import _problem
    from cookmind.align.rewards import reward_fn_for_template

    grade = reward_fn_for_template(cfg.template, cfg.format_weight)
    examples, counts = [], {"fixed": 0, "broken": 0}
    for p, b, a in zip(map(_problem, problems), before, after):
        ok_b, ok_a = grade(b, p["answer"])["answer_reward"], grade(a, p["answer"])["answer_reward"]
        kind = "fixed" if ok_a > ok_b else "broken" if ok_b > ok_a else None
        if kind is None:
            continue
        counts[kind] += 1
        if not any(e["kind"] == kind for e in examples):
            examples.append({"kind": kind, "question": p["question"], "before": b, "after": a})
    return {"heldout_fixed": counts["fixed"], "heldout_broken": counts["broken"], "examples": examples}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
