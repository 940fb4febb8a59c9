"""GRPO as an objective of the one training loop (``cookmind train`` with ``train.objective: grpo``).

The Trainer calls ``prepare(model, batch)`` under no_grad before each forward: here that samples
``group_size`` rollouts per prompt with the current policy, scores them and computes group-
normalised advantages. ``__call__(model, batch)`` then returns the policy-gradient loss; the
Trainer does backward, accumulation, DDP sync and the optimizer step as for every objective.
Each rollout batch gets one optimizer step (on-policy: the ratio is 1 and grpo_clip equals
REINFORCE with a baseline); off-policy epochs live in ``run_grpo``.
Sampling seeds come from a call counter kept in ``state_dict``, so resume replays the same rollouts.
"""

from __future__ import annotations

from typing import Any

import torch

from cookmind.align.grpo import GRPOConfig, _sampling
from cookmind.align.log_probs import get_response_log_probs
from cookmind.align.masked import masked_mean
from cookmind.align.pg_loss import compute_policy_gradient_loss
from cookmind.align.reference import Reference
from cookmind.align.rewards import reward_fn_for_template
from cookmind.align.rollouts import collect_rollouts
from cookmind.align.text_codec import pad_id_of
from cookmind.align.tokenize_pairs import pack_prompt_and_output
from cookmind.align.train_step import aggregate_token_loss
from cookmind.train.objectives.base import Objective, unwrap


class GRPOObjective(Objective):
    """Online GRPO on {"prompt_ids", "prompt_lengths", "answer"} batches (or offline scored responses)."""

    train_type = "grpo"

    def __init__(self, cfg: GRPOConfig | None = None, tokenizer=None, reward_fn=None, reference: Reference | None = None, rank: int = 0):
        self.cfg = cfg or GRPOConfig()
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn or reward_fn_for_template(self.cfg.template, self.cfg.format_weight)
        self.reference = reference
        self.rank = rank
        self.calls = 0

    def setup(self, trainer: Any) -> None:
        """Take the run's tokenizer; build the frozen reference when the KL penalty is on."""
        if self.tokenizer is None:
            self.tokenizer = getattr(trainer, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("the grpo objective needs a tokenizer to decode rollouts: set data.tokenizer")
        dist = getattr(trainer, "dist", None)
        self.rank = getattr(dist, "rank", 0) if dist is not None else 0
        if self.cfg.kl_coef and self.reference is None:
            self.reference = Reference(trainer.bare_model, self.cfg.reference if self.cfg.reference != "none" else "copy")

    def _prompts(self, batch: dict[str, Any]) -> list[list[int]]:
        ids = batch["prompt_ids"]
        lengths = batch.get("prompt_lengths")
        rows = ids.tolist()
        if lengths is None:
            return rows
        return [row[: int(n)] for row, n in zip(rows, lengths.tolist())]

    @torch.no_grad()
    def prepare(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, Any]:
        """Roll out, score and lay out the loss batch (online); or pack stored responses (offline)."""
        device = batch["prompt_ids"].device
        prompts = self._prompts(batch)
        if "response_ids" in batch:  # offline: responses and rewards were stored; REINFORCE on the reward
            resp = batch["response_ids"].tolist()
            masks = batch["response_mask"].tolist()
            responses = [[t for t, m in zip(r, mk) if m] or [pad_id_of(self.tokenizer)] for r, mk in zip(resp, masks)]
            out = pack_prompt_and_output(prompts, responses, pad_id_of(self.tokenizer))
            reward = batch["reward"].float()
            out.update(advantages=reward - reward.mean(), raw_rewards=reward,
                       metadata={"reward_mean": reward.mean().item(), "response_length": sum(map(len, responses)) / len(responses)})
        else:
            params = _sampling(self.cfg, self.tokenizer, seed=(self.cfg.seed * 1_000_003 + self.calls) * 101 + self.rank)
            out = collect_rollouts(unwrap(model), self.tokenizer, prompts, list(batch["answer"]), self.cfg.group_size, params,
                                   self.reward_fn, self.cfg.advantage_eps, self.cfg.normalize_by_std)
        self.calls += 1
        loss_batch = {k: out[k].to(device) for k in ("input_ids", "labels", "response_mask", "advantages", "raw_rewards")}
        if self.reference is not None:
            loss_batch["ref_log_probs"] = self.reference.log_probs(loss_batch["input_ids"], loss_batch["labels"]).to(device)
        loss_batch["rollout_metrics"] = out["metadata"]
        return loss_batch

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The aggregated policy-gradient loss and the run's RL metrics."""
        out = get_response_log_probs(model, batch["input_ids"], batch["labels"], return_token_entropy=True)
        lp, mask = out["log_probs"], batch["response_mask"]
        per_token, meta = compute_policy_gradient_loss(
            lp, self.cfg.loss_type, raw_rewards=batch["raw_rewards"].unsqueeze(-1), advantages=batch["advantages"].unsqueeze(-1),
            old_log_probs=lp.detach(), cliprange=self.cfg.cliprange, ref_log_probs=batch.get("ref_log_probs"), kl_coef=self.cfg.kl_coef,
        )
        loss = aggregate_token_loss(per_token, mask, self.cfg.length_normalization, float(self.cfg.max_new_tokens))
        rm = batch.get("rollout_metrics", {})
        metrics = {
            "loss": loss.detach(),
            "reward": rm.get("reward_mean", 0.0),
            "format_reward": rm.get("format_reward_mean", 0.0),
            "accuracy": rm.get("answer_reward_mean", 0.0),
            "response_length": rm.get("response_length", 0.0),
            "entropy": masked_mean(out["token_entropy"].detach(), mask).item(),
        }
        if "clipped" in meta:
            metrics["clip_fraction"] = masked_mean(meta["clipped"].float(), mask).item()
        if "kl" in meta:
            metrics["kl"] = masked_mean(meta["kl"], mask).item()
        return loss, metrics

    def num_tokens(self, batch: dict[str, Any]) -> int:
        """Prompt + response tokens of the rollouts."""
        return int(batch["input_ids"].numel())

    def state_dict(self) -> dict[str, Any]:
        """The rollout counter (it seeds sampling, so resume replays the same rollouts)."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rollout counter."""
        self.calls = int(state.get("calls", 0))


def build_objective(cfg, trainer) -> GRPOObjective:
    """The Trainer's plugin hook: GRPO settings from ``cfg.grpo`` when the config has that section.

    Without one, the template is "chat" (grading ``#### N``), matching ``cookmind pack``'s default
    grpo prompt template.
    """
    section = getattr(cfg, "grpo", None)
    values = dict(section) if isinstance(section, dict) else (vars(section).copy() if section is not None else {})
    values.setdefault("template", "chat")
    return GRPOObjective(GRPOConfig.from_dict(values))
