"""Objectives: one small object per training type; the Trainer is the same for all of them."""

from cookmind.train.objectives.base import Objective, unwrap
from cookmind.train.objectives.dpo import DPOObjective, dpo_loss, sequence_log_probs
from cookmind.train.objectives.pretrain import PretrainObjective
from cookmind.train.objectives.sft import SFTObjective

__all__ = ["Objective", "unwrap", "DPOObjective", "dpo_loss", "sequence_log_probs", "PretrainObjective", "SFTObjective"]
