"""Expert iteration: sample, keep the rollouts the verifier accepts, fine-tune on them, repeat.

    for round in 1..n_rounds:
        D <- { (x, y) : y ~ pi(.|x), k samples per question, reward(y) = 1 }   (deduplicated)
        pi <- SFT(pi, D)
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from cookmind.align.grpo import GRPOConfig, _problem, _sampling, evaluate_accuracy, rollout_options
from cookmind.align.prompts import format_prompt
from cookmind.align.rewards import reward_fn_for_template
from cookmind.align.rollout import generate_ids
from cookmind.align.sft_pairs import sft_on_pairs
from cookmind.align.text_codec import decode_response, encode_text, pad_id_of


@dataclass
class ExpertIterationConfig:
    """Rounds of sample -> filter -> SFT."""

    n_rounds: int = 3
    questions_per_round: int = 256
    samples_per_question: int = 4
    sft_epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 1e-4
    temperature: float = 1.0
    max_new_tokens: int = 64
    template: str = "r1_zero"
    seed: int = 0


def run_expert_iteration(model, tokenizer, train_problems, cfg: ExpertIterationConfig | None = None, eval_problems=None,
                         reward_fn=None, optimizer=None, progress: bool = True) -> list[dict]:
    """Train ``model`` in place; one metrics dict per round (kept rollouts, sample accuracy, eval accuracy)."""
    cfg = cfg or ExpertIterationConfig()
    reward_fn = reward_fn or reward_fn_for_template(cfg.template)
    problems = [_problem(p) for p in train_problems]
    optimizer = optimizer or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
    gcfg = GRPOConfig(template=cfg.template, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    history = []
    for rnd in range(cfg.n_rounds):
        t0 = time.perf_counter()
        rng = random.Random(cfg.seed * 7919 + rnd)
        chosen = rng.sample(range(len(problems)), min(cfg.questions_per_round, len(problems)))
        prompts = [encode_text(tokenizer, format_prompt(problems[i]["question"], cfg.template, tokenizer)) for i in chosen]
        rep = [p for p in prompts for _ in range(cfg.samples_per_question)]
        model.eval()
        outs = generate_ids(model, rep, _sampling(gcfg, tokenizer, seed=cfg.seed * 7919 + rnd), tokenizer,
                            **rollout_options(gcfg))
        keep_p, keep_r, seen = [], [], set()
        correct = 0
        for j, out in enumerate(outs):
            i = chosen[j // cfg.samples_per_question]
            if reward_fn(decode_response(tokenizer, out), problems[i]["answer"])["reward"] >= 1.0:
                correct += 1
                key = (i, tuple(out))
                if key not in seen:  # the same correct answer twice would just double its weight
                    seen.add(key)
                    keep_p.append(rep[j])
                    keep_r.append(out)
        losses = sft_on_pairs(model, keep_p, keep_r, pad_id_of(tokenizer), optimizer, cfg.sft_epochs, cfg.batch_size,
                              seed=cfg.seed + rnd, progress=progress)
        row = {"round": rnd + 1, "sample_accuracy": correct / max(1, len(outs)), "kept": len(keep_r),
               "sft_loss": losses[-1] if losses else None, "seconds": time.perf_counter() - t0}
        if eval_problems is not None:
            row["eval_accuracy"] = evaluate_accuracy(model, tokenizer, eval_problems, gcfg, reward_fn)["accuracy"]
        history.append(row)
    return history
