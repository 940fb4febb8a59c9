"""The demo's RL stage: GRPO on fresh synthetic word problems through the Trainer, held-out accuracy before and after.

The setting is RL with verifiable rewards: worked demonstrations are scarce, checkable prompts
are cheap. The demo's model read worked solutions in pretraining, but its chat demonstrations
are few and mostly terse ("The answer is 7."), so after SFT it mostly answers three-step
problems in one jump and is often wrong; DPO (a worked correct answer preferred over the SFT
model's own wrong one) moves it to writing the steps. GRPO then samples answers to problems it
has never seen (a fresh stream from the seeded generator: no held-out question, none the earlier
stages trained on, none repeated), and the only signal is the verifier: does ``#### N`` equal the
truth. Run straight after SFT it finds the working from that signal alone (README); after DPO it
refines answers that already show it.

The stage is ``cookmind train`` with ``train.objective: grpo``: the same Trainer and GRPOObjective, the problems
in ``grpo.problems`` (taken in order, each once) and the held-out set in ``grpo.eval_problems`` (graded at every
``eval.every``). It runs a fixed number of steps (deterministic under the seed); a wall-clock guard stops it
early only as a safety net, and says so in the result.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from cookmind.align.objective import GRPOConfig, as_problem, evaluate_accuracy
from cookmind.train.callbacks import Callback

# Chosen on the demo's model (4 layers x 128 wide, ~0.9M parameters) on 2 CPU cores, from a
# DPO checkpoint at ~40% held-out: lr 1e-4 and up made held-out accuracy swing by 10-20 points (the noisy updates
# wreck the arithmetic as fast as they teach the working); 3e-5 rises steadily. Temperature 0.7
# keeps more sampled chains intact than 1.0 (the three-step chain has six numbers to get right).
# "constant" length normalisation (Dr. GRPO) keeps the update free of the per-sequence length
# bias, under which wrong long answers are punished less than wrong short ones: the switch to
# worked answers must come from the reward, not from that bias.
DEMO_GRPO = GRPOConfig(
    template="chat",
    group_size=8,
    loss_type="grpo_clip",
    length_normalization="constant",
    max_new_tokens=40,
    temperature=0.7,
)  # a three-step worked answer is ~25 tokens
# The loop: 8 fresh problems x 8 samples per optimizer step, one step per rollout batch.
DEMO_LOOP = {"steps": 80, "prompts_per_step": 8, "lr": 3e-5, "warmup_steps": 10, "eval_every": 20}
QUICK_GRPO = replace(DEMO_GRPO, group_size=4, max_new_tokens=8)
QUICK_LOOP = {"steps": 2, "prompts_per_step": 2, "lr": 3e-5, "warmup_steps": 0, "eval_every": 0}
# The safety stop (seconds) when COOKMIND_GRPO_SECONDS is unset; the fixed steps take ~2 minutes on 2 cores.
DEFAULT_GUARD_S = 420.0
# The held-out problems, as the work directory names them (the data stage writes them there).
HELD_OUT = "data/eval_problems.jsonl"

_STEP = re.compile(r"\d+\s*[-+*]\s*\d+\s*=\s*-?\d+")


def shows_working(text: str) -> bool:
    """True when an answer writes at least one step out (``a + b = c``), not only the result."""
    return bool(_STEP.search(text))


class TimeGuard(Callback):
    """Asks the Trainer to stop (after a whole step, with a checkpoint) once ``seconds`` have passed."""

    def __init__(self, seconds: float):
        self.seconds, self.t0, self.fired = seconds, 0.0, False

    def on_train_begin(self, trainer) -> None:
        self.t0 = time.perf_counter()

    def on_step_end(self, trainer, step: int, metrics: dict[str, Any]) -> None:
        if time.perf_counter() - self.t0 > self.seconds:
            self.fired = True
            trainer.request_stop(f"the {self.seconds:.0f} s safety guard")


def questions_trained_on(data_dir: Path) -> set[str]:
    """Every question the earlier stages saw: pretraining text, SFT chats, DPO pairs."""
    seen: set[str] = set()
    for name in ("pretrain.jsonl", "sft.jsonl", "sft_val.jsonl", "dpo.jsonl", "dpo_val.jsonl"):
        path = data_dir / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if "text" in row:
                seen.update(ln[len("Question: ") :] for ln in row["text"].splitlines() if ln.startswith("Question: "))
            for key in ("messages", "chosen"):
                seen.update(m["content"] for m in row.get(key, []) if m["role"] == "user")
    return seen


def write_fresh_problems(ctx, path: Path, n: int) -> int:
    """``n`` problems from the seeded generator, none held out or seen by an earlier stage, as JSONL."""
    from cookmind.demo.pipeline import _write_jsonl
    from cookmind.synthetic import arithmetic_problems

    held = [json.loads(line) for line in Path(ctx.paths["eval_problems"]).read_text().splitlines() if line.strip()]
    exclude = {p["question"] for p in held}
    if "data" in ctx.paths:
        exclude |= questions_trained_on(Path(ctx.paths["data"]))
    problems = arithmetic_problems(
        n, seed=ctx.seed + 5, level=getattr(ctx.sizes, "level", 1), max_number=ctx.sizes.max_number, exclude=exclude
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_jsonl(path, [p.to_dict() for p in problems])
    return len(problems)


def demo_stage(ctx) -> dict[str, Any]:
    """GRPO from the newest checkpoint through the Trainer; held-out accuracy before/after, gain, curves PNG."""
    from cookmind.atomic import write_json
    from cookmind.demo.curves import plot_grpo_curves
    from cookmind.demo.pipeline import _train
    from cookmind.model import load_model
    from cookmind.tokenizer import Tokenizer

    quick = ctx.sizes.sft_steps < 50  # the smoke-test sizes: show the stage runs, nothing more
    cfg, loop = (QUICK_GRPO, QUICK_LOOP) if quick else (DEMO_GRPO, DEMO_LOOP)
    workdir = Path(ctx.workdir) / "grpo"
    held_path = Path(ctx.paths["eval_problems"])
    heldout = [json.loads(line) for line in held_path.read_text().splitlines() if line.strip()]
    problems_path = workdir / "problems.jsonl"
    n_problems = write_fresh_problems(ctx, problems_path, loop["steps"] * loop["prompts_per_step"])
    tokenizer = Tokenizer.load(ctx.paths["tokenizer"])
    start = ctx.policy
    t0 = time.perf_counter()
    model = load_model(start, device="cpu")
    before = evaluate_accuracy(model, tokenizer, heldout, cfg)
    data = Path(os.path.relpath(held_path, ctx.workdir)).as_posix()
    sampled_before = pass_at_k(
        model, tokenizer, heldout, cfg, k=cfg.group_size, out_path=workdir / "sampled_before.jsonl", data=data
    )
    del model
    guard = TimeGuard(float(os.environ.get("COOKMIND_GRPO_SECONDS", 60 if quick else DEFAULT_GUARD_S)))
    knobs = {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items() if v != getattr(GRPOConfig(), k)
    }
    run = _train(
        ctx,
        "grpo",
        {
            "train": {
                "objective": "grpo",
                "max_steps": loop["steps"],
                "micro_batch_size": loop["prompts_per_step"],
                "init_from": str(start),
            },
            "optim": {
                "lr": loop["lr"],
                "warmup_steps": loop["warmup_steps"],
                "schedule": "constant",
                "weight_decay": 0.0,
            },
            "eval": {"every": loop["eval_every"]},
            "logging": {"log_every": 1},
            "grpo": {**knobs, "problems": str(problems_path), "eval_problems": str(held_path)},
        },
        callbacks=[guard],
        stop_ok=True,
    )
    model = load_model(ctx.checkpoints["grpo"], device="cpu")
    after = evaluate_accuracy(model, tokenizer, heldout, cfg)
    sampled_after = pass_at_k(
        model, tokenizer, heldout, cfg, k=cfg.group_size, out_path=workdir / "sampled_after.jsonl", data=data
    )
    history = _history(Path(run["run_dir"]) / "metrics.jsonl")
    png = plot_grpo_curves(
        history,
        workdir / "grpo_curves.png",
        before=before["accuracy"],
        before_length=before["response_length"],
        title=f"GRPO: held-out accuracy {100 * before['accuracy']:.1f}% -> {100 * after['accuracy']:.1f}%",
    )
    steps = run["steps"]
    if guard.fired:
        ctx.notes.append(
            f"GRPO stopped early: the {guard.seconds:.0f} s safety guard fired after {steps} of "
            f"{loop['steps']} steps (COOKMIND_GRPO_SECONDS)"
        )
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
        # what gives the sampled figures, run in the work directory (the answers: grpo/sampled_{before,after}.jsonl)
        "sampled_command_before": sampled_before["command"].replace(
            "MODEL", Path(os.path.relpath(start, ctx.workdir)).as_posix(), 1
        ),
        "sampled_command": sampled_after["command"].replace(
            "MODEL", Path(os.path.relpath(run["run_dir"], ctx.workdir)).as_posix(), 1
        ),
        "shows_working_before": sum(map(shows_working, before["responses"])) / len(before["responses"]),
        "shows_working": sum(map(shows_working, after["responses"])) / len(after["responses"]),
        "response_length_before": before["response_length"],
        "response_length": after["response_length"],
        "heldout_problems": len(heldout),
        "steps": steps,
        "stopped_early": guard.fired,
        "time_budget_s": guard.seconds,
        "rollouts": steps * loop["prompts_per_step"] * cfg.group_size,
        "train_problems_seen": min(n_problems, steps * loop["prompts_per_step"]),  # each once, in order
        "reward_first": _mean([h["reward"] for h in history[:20]]),
        "reward_last": _mean([h["reward"] for h in history[-20:]]),
        "curve": [{"step": 0, "eval_accuracy": before["accuracy"]}]
        + [{"step": h["step"], "eval_accuracy": h["eval_accuracy"]} for h in history if "eval_accuracy" in h],
        **_flips(heldout, before["responses"], after["responses"], cfg),
        "curves_png": str(png),
        "log": str(Path(run["run_dir"]) / "metrics.jsonl"),
        "report": run["report"],
        "checkpoint": str(ctx.checkpoints["grpo"]),
        "config": {**asdict(cfg), **loop, "problems": str(problems_path), "eval_problems": str(held_path)},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(workdir / "grpo_result.json", result)
    return result


def _history(metrics_path: Path) -> list[dict[str, Any]]:
    """The Trainer's per-step train rows, each with the held-out figures of an evaluation at that step."""
    from cookmind.train.metrics import read_metrics

    rows = read_metrics(metrics_path)
    val = {r["step"]: r for r in rows if r.get("split") == "val" and "val_accuracy" in r}
    history = []
    for r in rows:
        if r.get("split") != "train":
            continue
        h = dict(r)
        if r["step"] in val:
            h["eval_accuracy"] = val[r["step"]]["val_accuracy"]
            h["eval_format_rate"] = val[r["step"]]["val_format_rate"]
            h["eval_response_length"] = val[r["step"]]["val_response_length"]
        history.append(h)
    return history


def pass_at_k(
    model, tokenizer, problems, cfg: GRPOConfig, k: int = 8, seed: int = 12345, out_path=None, data: str = HELD_OUT
) -> dict[str, Any]:
    """Sampled accuracy at the run's temperature, as `cookmind eval gsm8k --num-samples k --k 1 k` scores it: pass@k
    (share of problems with >= 1 of k samples right), pass@1, and ``command``, that command (its ``MODEL`` the model's
    folder; run in the demo's work directory, it writes the same answers as ``out_path``).

    pass@k well above the greedy accuracy is the room RL has: right answers the policy already
    samples, which the reward can make its first choice.
    """
    import shlex

    from cookmind.evals import gsm8k as gsm8k_eval

    if cfg.top_p != 1.0 or cfg.min_new_tokens or cfg.stop_strings is not None or cfg.format_weight:
        raise ValueError(
            "the demo's pass@k is `cookmind eval gsm8k`'s, which samples with top_p 1, no min_new_tokens, the "
            "template's stops and no format reward; this GRPOConfig sets one of them"
        )
    was_training = model.training
    model.eval()
    batch = cfg.rollout_chunk  # k samples of batch // k problems a forward
    metrics = gsm8k_eval.evaluate_gsm8k(
        model,
        tokenizer,
        problems,
        out_path,
        template=cfg.template,
        num_samples=k,
        ks=(1, k),
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=seed,
        batch_size=batch,
        progress=False,
    )
    model.train(was_training)
    flags = ["--data", data, "--template", cfg.template, "--max-new-tokens", str(cfg.max_new_tokens)]
    flags += ["--num-samples", str(k), "--temperature", str(cfg.temperature), "--k", "1", str(k)]
    flags += ["--seed", str(seed), "--batch-size", str(batch)]
    return {
        "pass_at_k": metrics[f"pass@{k}"],
        "pass_at_1": metrics["pass@1"],
        "k": k,
        "command": shlex.join(["cookmind", "eval", "gsm8k", "MODEL", *flags]),
    }


def _flips(problems, before: list[str], after: list[str], cfg: GRPOConfig) -> dict[str, Any]:
    """How many held-out answers went wrong -> right and right -> wrong, with the first of each as examples."""
    from cookmind.align.rewards import reward_fn_for_template

    grade = reward_fn_for_template(cfg.template, cfg.format_weight)
    examples, counts = [], {"fixed": 0, "broken": 0}
    for p, b, a in zip(map(as_problem, problems), before, after):
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
