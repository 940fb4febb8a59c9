"""Expert iteration: sample, keep the rollouts the verifier accepts, fine-tune on them, repeat.

    for round in 1..n_rounds:
        D <- { (x, y) : y ~ pi(.|x), k samples per question, reward(y) = 1 }   (deduplicated)
        pi <- SFT(pi, D)                      (the Trainer with the sft objective)

The SFT half is the one training loop: each round runs ``Trainer`` with ``train.objective: sft`` on the kept
pairs, for ``sft_epochs`` passes, with the loop settings (lr, batch size, clipping, precision, device) of the
``TrainConfig`` given; each round's run directory is ``<logging.run_dir>/round_<k>``.
"""

from __future__ import annotations

import copy
import math
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from cookmind.align.objective import GRPOConfig, as_problem, evaluate_accuracy, rollout_options, sampling_params
from cookmind.align.prompts import decode_response, encode_prompt
from cookmind.align.rewards import reward_fn_for_template
from cookmind.align.rollout import generate_ids


@dataclass
class ExpertIterationConfig:
    """Rounds of sample -> filter -> SFT (the SFT loop's own settings come from a TrainConfig)."""

    n_rounds: int = 3
    questions_per_round: int = 256
    samples_per_question: int = 4
    sft_epochs: int = 1
    temperature: float = 1.0
    max_new_tokens: int = 64
    template: str = "r1_zero"
    seed: int = 0


class PairDataset(torch.utils.data.Dataset):
    """(prompt ids, response ids) as sft items: labels are -100 on the prompt, the response ids after it."""

    def __init__(self, prompts: list[list[int]], responses: list[list[int]]):
        if len(prompts) != len(responses):
            raise ValueError(f"PairDataset: {len(prompts)} prompts but {len(responses)} responses")
        self.items = [(list(p), list(r)) for p, r in zip(prompts, responses)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        p, r = self.items[i]
        return {
            "input_ids": torch.tensor(p + r, dtype=torch.long),
            "labels": torch.tensor([-100] * len(p) + r, dtype=torch.long),
        }


def run_expert_iteration(
    model,
    tokenizer,
    train_problems,
    train_cfg,
    cfg: ExpertIterationConfig | None = None,
    eval_problems=None,
    reward_fn=None,
) -> list[dict]:
    """Train ``model`` (a CookMindLM) in place; one metrics dict per round (kept rollouts, sample and eval accuracy,
    ``problems_dropped`` / ``eval_problems_dropped``: those whose prompt fills the model's context, left out and warned
    of, as GRPO leaves them out).

    ``train_cfg`` is the TrainConfig of the SFT rounds (its objective and step count are set per round).
    """
    cfg = cfg or ExpertIterationConfig()
    reward_fn = reward_fn or reward_fn_for_template(cfg.template)
    problems = [as_problem(p) for p in train_problems]
    if not problems:
        raise ValueError("run_expert_iteration: no training problems")
    problems, dropped = _fitting(model, tokenizer, problems, cfg.template, "training")
    eval_dropped = None
    if eval_problems is not None:
        eval_problems, eval_dropped = _fitting(model, tokenizer, [as_problem(p) for p in eval_problems], cfg.template)
    gcfg = GRPOConfig(template=cfg.template, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    history = []
    for rnd in range(cfg.n_rounds):
        t0 = time.perf_counter()
        rng = random.Random(cfg.seed * 7919 + rnd)
        chosen = rng.sample(range(len(problems)), min(cfg.questions_per_round, len(problems)))
        prompts = [encode_prompt(tokenizer, problems[i]["question"], cfg.template) for i in chosen]
        rep = [p for p in prompts for _ in range(cfg.samples_per_question)]
        model.eval()
        # row i samples from seed + i: each round a block of seeds of its own (rounds one seed apart shared all but
        # one row's random stream, shifted)
        seed = (cfg.seed * 7919 + rnd) * max(1, cfg.questions_per_round * cfg.samples_per_question)
        outs = generate_ids(model, rep, sampling_params(gcfg, tokenizer, seed=seed), tokenizer, **rollout_options(gcfg))
        keep_p, keep_r, seen = [], [], set()
        correct = 0
        for j, out in enumerate(outs):
            i = chosen[j // cfg.samples_per_question]
            if out and reward_fn(decode_response(tokenizer, out), problems[i]["answer"])["reward"] >= 1.0:
                correct += 1
                if (i, tuple(out)) not in seen:  # the same correct answer twice would just double its weight
                    seen.add((i, tuple(out)))
                    keep_p.append(rep[j])
                    keep_r.append(out)
        row = {"round": rnd + 1, "sample_accuracy": correct / max(1, len(outs)), "kept": len(keep_r), "sft_loss": None}
        row["problems_dropped"] = dropped  # their prompts fill the model's context: never sampled
        if eval_dropped is not None:
            row["eval_problems_dropped"] = eval_dropped
        if keep_r:
            row["sft_loss"] = _sft_round(model, tokenizer, PairDataset(keep_p, keep_r), train_cfg, cfg, rnd)
        row["seconds"] = time.perf_counter() - t0
        if eval_problems:
            row["eval_accuracy"] = evaluate_accuracy(model, tokenizer, eval_problems, gcfg, reward_fn)["accuracy"]
        history.append(row)
    return history


def _fitting(model, tokenizer, problems: list[dict], template: str, which: str = "eval") -> tuple[list[dict], int]:
    """The problems whose prompt leaves room for an answer in the model's context, and how many were dropped (as
    GRPO drops them: a cut prompt would ask another question, and one that fills the context stops generation).
    Dropped ones are warned of; no training problem left is an error."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(context, int):
        return problems, 0
    keep = [p for p in problems if len(encode_prompt(tokenizer, p["question"], template)) < context]
    if which == "training" and not keep:
        raise ValueError(
            f"run_expert_iteration: every training problem's prompt fills the model's context of {context} tokens; "
            "shorten them or use a shorter template"
        )
    if len(keep) < len(problems):
        warnings.warn(
            f"run_expert_iteration: {len(problems) - len(keep)} of {len(problems)} {which} problems are dropped: "
            f"their prompts fill the model's context of {context} tokens",
            stacklevel=3,
        )
    return keep, len(problems) - len(keep)


def _sft_round(model, tokenizer, data: PairDataset, train_cfg, cfg: ExpertIterationConfig, rnd: int) -> float | None:
    """One SFT pass (``sft_epochs`` epochs) over the kept pairs through the Trainer; the last logged loss."""
    from cookmind.train import Trainer
    from cookmind.train.metrics import read_metrics
    from cookmind.train.objectives import SFTObjective

    rcfg = copy.deepcopy(train_cfg)
    batch = min(rcfg.train.micro_batch_size, len(data))
    rcfg.train.objective = "sft"
    rcfg.train.micro_batch_size = batch
    rcfg.train.max_steps = cfg.sft_epochs * math.ceil(len(data) / (batch * rcfg.train.grad_accum_steps))
    rcfg.train.seed = train_cfg.train.seed + rnd
    rcfg.train.init_from = None
    rcfg.logging.run_dir = str(Path(train_cfg.logging.run_dir) / f"round_{rnd + 1}")
    trainer = Trainer(rcfg, model=model, objective=SFTObjective(), train_dataset=data, tokenizer=tokenizer)
    trainer.fit()
    losses = [r["loss"] for r in read_metrics(trainer.run_dir / "metrics.jsonl") if r.get("split") == "train"]
    return losses[-1] if losses else None
