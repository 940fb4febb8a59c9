"""The GRPO driver: sample prompts, roll out groups, score, normalise, and step the policy.

    for step in 1..n_steps:
        prompts  <- n_prompts problems: drawn with seed (seed, step), or the next ones in order ("stream")
        rollouts <- group_size samples per prompt from the current policy (no grad)
        A        <- (r - mean_group r) / (std_group r + eps)
        old      <- log pi_old(rollouts)                      (only when reused over epochs)
        for epoch in 1..epochs_per_rollout_batch: one optimizer step per train batch,
            loss = PG loss (no_baseline | reinforce_with_baseline | grpo_clip) [+ beta * k3 KL to ref]

Works with any model whose ``model(input_ids)`` returns logits (a tensor or ``.logits``): our
CookMindLM or a Hugging Face causal LM. Under torch.distributed each rank rolls out its own
share of the prompts and gradients are averaged before every optimizer step.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from cookmind.align.log_probs import get_response_log_probs
from cookmind.align.prompts import R1_ZERO_STOP, format_prompt, uses_think_tags
from cookmind.align.reference import Reference
from cookmind.align.rewards import reward_fn_for_template
from cookmind.align.rollout import SamplingParams
from cookmind.align.rollouts import collect_rollouts
from cookmind.align.text_codec import encode_text, stop_ids_of
from cookmind.align.train_step import grpo_microbatch_train_step


@dataclass
class GRPOConfig:
    """Every knob of a GRPO run; unknown keys in ``from_dict`` are an error."""

    n_steps: int = 50
    rollout_batch_size: int = 64  # rollouts per step (prompts x group_size), over all ranks
    group_size: int = 8
    train_batch_size: int = 64  # rollouts per optimizer step
    gradient_accumulation_steps: int = 1
    epochs_per_rollout_batch: int = 1  # > 1: off-policy epochs, ratio against the old log-probs
    learning_rate: float = 1e-5
    warmup_steps: int = 0  # optimizer steps of linear warm-up (Adam's first steps are sign-sized)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    loss_type: str = "grpo_clip"
    cliprange: float = 0.2
    advantage_eps: float = 1e-6
    normalize_by_std: bool = True
    length_normalization: str = "sequence"  # sequence | token | constant (max_new_tokens)
    kl_coef: float = 0.0
    reference: str = "none"  # none | copy | base
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    stop_strings: tuple[str, ...] | None = None  # None: "</answer>" for <think> templates, none otherwise
    template: str = "r1_zero"  # r1_zero | compact | chat | plain | a string with {question}
    format_weight: float = 0.0
    eval_every: int = 10
    eval_size: int = 64
    eval_max_new_tokens: int | None = None
    seed: int = 0
    # random: each step draws its prompts from the list with seed (seed, step), so they repeat;
    # stream: each step takes the next prompts in list order, so a list as long as the run
    # (e.g. fresh problems from a seeded generator) never shows a prompt twice
    prompt_order: str = "random"
    engine: str = "auto"
    save_every: int = 1  # with a workdir: resume state every N steps (0: never)
    rollout_chunk: int = 64  # generation batch size

    @classmethod
    def from_dict(cls, d: dict) -> "GRPOConfig":
        """Build from a dict, refusing unknown keys (typos must not pass silently)."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"GRPOConfig: unknown keys {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**d)

    def validate(self) -> None:
        """Shapes that cannot work are refused with the fix in the message."""
        if self.rollout_batch_size % self.group_size:
            raise ValueError(f"rollout_batch_size {self.rollout_batch_size} must be a multiple of group_size {self.group_size}")
        if self.rollout_batch_size % self.train_batch_size:
            raise ValueError(f"rollout_batch_size {self.rollout_batch_size} must be a multiple of train_batch_size {self.train_batch_size}")
        if self.train_batch_size % self.gradient_accumulation_steps:
            raise ValueError(f"train_batch_size {self.train_batch_size} must be a multiple of gradient_accumulation_steps {self.gradient_accumulation_steps}")
        if self.kl_coef and self.reference == "none":
            raise ValueError("kl_coef > 0 needs a reference: set reference='copy' (or 'base' under LoRA)")
        if self.prompt_order not in ("random", "stream"):
            raise ValueError(f"unknown prompt_order {self.prompt_order!r}; choose random or stream")
        if self.loss_type not in ("no_baseline", "reinforce_with_baseline", "grpo_clip"):
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose no_baseline, reinforce_with_baseline or grpo_clip")


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce_mean_(tensors: list[torch.Tensor], world: int) -> None:
    import torch.distributed as dist

    if world > 1:
        for t in tensors:
            dist.all_reduce(t)
            t.div_(world)


def _problem(p) -> dict:
    return {"question": p["question"], "answer": p["answer"]} if isinstance(p, dict) else {"question": p.question, "answer": p.answer}


def _grad_norm(params) -> float:
    """||g||_2 over all parameters (before clipping)."""
    norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


def grpo_update(model, optimizer, batch: dict, cfg: GRPOConfig, reference: Reference | None = None, world: int = 1, scheduler=None) -> dict:
    """All optimizer steps on one rollout batch (epochs x train batches); returns the averaged metrics."""
    n = batch["input_ids"].shape[0]
    local_train = max(1, cfg.train_batch_size // world)
    micro = max(1, local_train // cfg.gradient_accumulation_steps)
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    for key in ("input_ids", "labels", "response_mask", "advantages", "raw_rewards"):
        batch[key] = batch[key].to(device)
    # after the first optimizer step the rollouts are off-policy: the ratio needs the sampling policy's log-probs
    need_old = cfg.loss_type == "grpo_clip" and (cfg.epochs_per_rollout_batch > 1 or n > local_train)
    if need_old and "old_log_probs" not in batch:
        with torch.no_grad():
            batch["old_log_probs"] = torch.cat([get_response_log_probs(model, batch["input_ids"][i : i + micro], batch["labels"][i : i + micro])["log_probs"] for i in range(0, n, micro)])
    if reference is not None and "ref_log_probs" not in batch:
        batch["ref_log_probs"] = torch.cat([reference.log_probs(batch["input_ids"][i : i + micro], batch["labels"][i : i + micro]) for i in range(0, n, micro)])
    sums: dict[str, float] = {}
    count = 0
    model.train()
    for _epoch in range(cfg.epochs_per_rollout_batch):
        for start in range(0, n, local_train):
            optimizer.zero_grad(set_to_none=True)
            entropy_sum, tokens = 0.0, 0.0
            step_meta: dict[str, float] = {}
            for m0 in range(start, min(start + local_train, n), micro):
                sl = slice(m0, min(m0 + micro, start + local_train, n))
                out = get_response_log_probs(model, batch["input_ids"][sl], batch["labels"][sl], return_token_entropy=True)
                lp, mask = out["log_probs"], batch["response_mask"][sl]
                old = batch["old_log_probs"][sl] if need_old else lp.detach()  # on-policy: ratio 1, same gradient
                loss, meta = grpo_microbatch_train_step(
                    lp, mask, cfg.gradient_accumulation_steps, cfg.loss_type,
                    raw_rewards=batch["raw_rewards"][sl].unsqueeze(-1), advantages=batch["advantages"][sl].unsqueeze(-1),
                    old_log_probs=old, cliprange=cfg.cliprange,
                    ref_log_probs=batch["ref_log_probs"][sl] if reference is not None else None, kl_coef=cfg.kl_coef,
                    length_normalization=cfg.length_normalization, normalize_constant=float(cfg.max_new_tokens),
                )
                entropy_sum += (out["token_entropy"].detach() * mask).sum().item()
                tokens += mask.sum().item()
                step_meta["loss"] = step_meta.get("loss", 0.0) + loss.item()
                for k in ("clip_fraction", "kl"):
                    if k in meta:
                        step_meta[k] = step_meta.get(k, 0.0) + meta[k].item() / cfg.gradient_accumulation_steps
            _all_reduce_mean_([p.grad for p in params if p.grad is not None], world)
            step_meta["grad_norm"] = _grad_norm(params)
            if cfg.max_grad_norm and cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                step_meta["lr"] = optimizer.param_groups[0]["lr"]
                scheduler.step()
            step_meta["entropy"] = entropy_sum / max(1.0, tokens)
            for k, v in step_meta.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    optimizer.zero_grad(set_to_none=True)
    return {k: v / count for k, v in sums.items()}


def _sampling(cfg: GRPOConfig, tokenizer, seed: int, greedy: bool = False) -> SamplingParams:
    stops = cfg.stop_strings if cfg.stop_strings is not None else (R1_ZERO_STOP if uses_think_tags(cfg.template) else ())
    return SamplingParams(
        max_new_tokens=(cfg.eval_max_new_tokens or cfg.max_new_tokens) if greedy else cfg.max_new_tokens,
        min_new_tokens=0 if greedy else cfg.min_new_tokens,
        temperature=0.0 if greedy else cfg.temperature,
        top_p=cfg.top_p,
        stop_token_ids=stop_ids_of(tokenizer),
        stop_strings=tuple(stops),
        seed=seed,
    )


def rollout_options(cfg: GRPOConfig) -> dict:
    """generate_ids / collect_rollouts keyword arguments: rows per forward and the generation back end."""
    return {"batch_size": cfg.rollout_chunk, "engine": cfg.engine}


def evaluate_accuracy(model, tokenizer, problems, cfg: GRPOConfig, reward_fn=None) -> dict:
    """Greedy exact accuracy, format rate and mean response length (tokens) on ``problems``, with the responses."""
    from cookmind.align.rollout import generate_ids
    from cookmind.align.text_codec import decode_response

    reward_fn = reward_fn or reward_fn_for_template(cfg.template, cfg.format_weight)
    problems = [_problem(p) for p in problems]
    ids = [encode_text(tokenizer, format_prompt(p["question"], cfg.template, tokenizer)) for p in problems]
    was_training = model.training
    model.eval()
    outs = generate_ids(model, ids, _sampling(cfg, tokenizer, cfg.seed, greedy=True), tokenizer, **rollout_options(cfg))
    if was_training:
        model.train()
    texts = [decode_response(tokenizer, o) for o in outs]
    scores = [reward_fn(t, p["answer"]) for t, p in zip(texts, problems)]
    n = max(1, len(scores))
    return {"accuracy": sum(s["answer_reward"] for s in scores) / n, "format_rate": sum(s["format_reward"] for s in scores) / n,
            "response_length": sum(len(o) for o in outs) / n, "responses": texts}


def _save_state(path: Path, model, optimizer, scheduler, reference, step: int, history: list) -> None:
    tmp = path.with_name(path.name + ".tmp")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "step": step, "history": history}
    if reference is not None and reference.kind == "copy":
        state["reference"] = reference.model.state_dict()
    torch.save(state, tmp)
    os.replace(tmp, path)


def run_grpo(
    model,
    tokenizer,
    train_problems,
    cfg: GRPOConfig | None = None,
    eval_problems=None,
    reward_fn: Callable[[str, str], dict[str, float]] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    workdir=None,
    resume: bool = False,
    time_budget_s: float | None = None,
    progress: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train ``model`` in place with GRPO on ``train_problems`` ({"question", "answer"} items).

    Returns one metrics dict per step (reward, format_reward, accuracy, response_length, entropy,
    clip_fraction, kl, grad_norm, loss, seconds; eval_accuracy on eval steps). With ``workdir``
    the metrics go to ``grpo_log.jsonl`` and the state to ``grpo_state.pt`` after every step;
    ``resume=True`` continues from it — prompts and sampling are seeded by step, so a resumed
    run equals an uninterrupted one. ``time_budget_s`` stops early (after a whole step).
    """
    cfg = cfg or GRPOConfig()
    cfg.validate()
    rank, world = _world()
    if cfg.rollout_batch_size % (world * cfg.group_size):
        raise ValueError(f"rollout_batch_size {cfg.rollout_batch_size} must split into whole groups over {world} ranks")
    reward_fn = reward_fn or reward_fn_for_template(cfg.template, cfg.format_weight)
    problems = [_problem(p) for p in train_problems]
    if not problems:
        raise ValueError("run_grpo: no training problems")
    prompt_cache = {}
    if optimizer is None:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                                      weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    # lr_t = lr * min(1, (t + 1) / warmup)  per optimizer step
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(1.0, (t + 1) / max(1, cfg.warmup_steps)))
    history: list[dict] = []
    start_step = 0
    state_path = Path(workdir) / "grpo_state.pt" if workdir is not None else None
    state = None
    if resume and state_path is not None and state_path.is_file():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
    # the reference is the model as the run began: on resume it comes from the state, not the live weights
    reference = Reference(model, cfg.reference) if cfg.reference != "none" else None
    if state is not None:
        if reference is not None and reference.kind == "copy":
            reference.model.load_state_dict(state["reference"])
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_step, history = state["step"], state["history"]
    n_prompts_local = cfg.rollout_batch_size // cfg.group_size // world
    t_start = time.perf_counter()
    bar = tqdm(range(start_step, cfg.n_steps), initial=start_step, total=cfg.n_steps, desc="grpo", unit="step", disable=not progress or rank != 0)
    for step in bar:
        t0 = time.perf_counter()
        n_global = n_prompts_local * world
        if cfg.prompt_order == "stream":  # the next prompts in order, wrapping after the last
            chosen = [(step * n_global + i) % len(problems) for i in range(min(len(problems), n_global))]
        else:
            rng = random.Random(cfg.seed * 1_000_003 + step)
            chosen = rng.sample(range(len(problems)), min(len(problems), n_global))
        chosen = chosen[rank * n_prompts_local : (rank + 1) * n_prompts_local]
        ids = []
        for i in chosen:
            if i not in prompt_cache:
                prompt_cache[i] = encode_text(tokenizer, format_prompt(problems[i]["question"], cfg.template, tokenizer))
            ids.append(prompt_cache[i])
        params = _sampling(cfg, tokenizer, seed=(cfg.seed * 1_000_003 + step) * 101 + rank)
        batch = collect_rollouts(model, tokenizer, ids, [problems[i]["answer"] for i in chosen], cfg.group_size, params,
                                 reward_fn, cfg.advantage_eps, cfg.normalize_by_std, **rollout_options(cfg))
        t_roll = time.perf_counter() - t0
        upd = grpo_update(model, optimizer, batch, cfg, reference, world, scheduler)
        meta = batch["metadata"]
        row = {
            "step": step + 1,
            "reward": meta["reward_mean"],
            "format_reward": meta.get("format_reward_mean", float("nan")),
            "accuracy": meta.get("answer_reward_mean", float("nan")),
            "response_length": meta["response_length"],
            "frac_zero_std_groups": meta["frac_zero_std_groups"],
            **upd,
            "rollout_s": t_roll,
            "seconds": time.perf_counter() - t0,
        }
        if world > 1:
            keys = sorted(k for k, v in row.items() if isinstance(v, float) and math.isfinite(v))
            vals = torch.tensor([row[k] for k in keys], dtype=torch.float64)
            _all_reduce_mean_([vals], world)
            row.update(dict(zip(keys, vals.tolist())))
        if eval_problems is not None and cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.n_steps):
            ev = evaluate_accuracy(model, tokenizer, list(eval_problems)[: cfg.eval_size], cfg, reward_fn)
            row["eval_accuracy"], row["eval_format_rate"] = ev["accuracy"], ev["format_rate"]
            row["eval_response_length"] = ev["response_length"]
        history.append(row)
        if on_step is not None:
            on_step(row)
        bar.set_postfix(reward=f"{row['reward']:.2f}", acc=f"{row['accuracy']:.2f}", len=f"{row['response_length']:.0f}")
        if state_path is not None and rank == 0:
            state_path.parent.mkdir(parents=True, exist_ok=True)
            with open(state_path.with_name("grpo_log.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            if cfg.save_every and (step + 1) % cfg.save_every == 0:
                _save_state(state_path, model, optimizer, scheduler, reference, step + 1, history)
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            break
    bar.close()
    return history


def config_dict(cfg: GRPOConfig) -> dict:
    """The resolved config as plain JSON types."""
    return json.loads(json.dumps(asdict(cfg)))
