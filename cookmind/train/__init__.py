"""The one training loop (pretrain, SFT, LoRA, DPO; GRPO plugs into the same seam), checkpoints, config."""

from cookmind.train.callbacks import Callback
from cookmind.train.checkpoint import find_latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from cookmind.train.config import TrainConfig
from cookmind.train.objectives import DPOObjective, Objective, PretrainObjective, SFTObjective
from cookmind.train.trainer import Trainer, TrainingDiverged

__all__ = [
    "Callback",
    "DPOObjective",
    "Objective",
    "PretrainObjective",
    "SFTObjective",
    "TrainConfig",
    "Trainer",
    "TrainingDiverged",
    "find_latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]
