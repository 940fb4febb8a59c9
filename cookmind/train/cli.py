"""`cookmind train`: one command for pretrain, SFT, LoRA, DPO (and GRPO) from a preset plus overrides.

    cookmind train --config tiny-cpu --train-data data/seq.bin optim.lr=3e-4 train.max_steps=500
    cookmind train --config demo train.objective=sft train.init_from=runs/pre/checkpoints --resume auto
    torchrun --nproc_per_node 2 -m cookmind train --config gpt2-small --train-data ...   # DDP
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The stage's options; any config field is a ``section.key=value`` override."""
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, e.g. optim.lr=3e-4 train.max_steps=100 lora.enabled=true")
    parser.add_argument("-c", "--config", default="tiny-cpu",
                        help="preset name in cookmind/configs (tiny-cpu, demo, gpt2-small, minimind) or a YAML path")
    parser.add_argument("--objective", choices=["pretrain", "sft", "dpo", "grpo"], help="= train.objective")
    parser.add_argument("--train-data", help="training token store (= data.train_path)")
    parser.add_argument("--val-data", help="validation token store (= data.val_path)")
    parser.add_argument("--tokenizer", help="tokenizer directory (= data.tokenizer)")
    parser.add_argument("--init-from", help="start from this model/checkpoint (= train.init_from)")
    parser.add_argument("--run-dir", help="where metrics, report and checkpoints go (= logging.run_dir)")
    parser.add_argument("--resume", help="'auto' (newest checkpoint in the run) or a checkpoint path")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve_config(args: argparse.Namespace):
    """Preset + flags + dotted overrides -> a validated TrainConfig (flags first, overrides win)."""
    from cookmind.train.config import TrainConfig

    flags = {"objective": "train.objective", "train_data": "data.train_path", "val_data": "data.val_path",
             "tokenizer": "data.tokenizer", "init_from": "train.init_from", "run_dir": "logging.run_dir",
             "resume": "checkpoint.resume"}
    items = [f"{key}={json.dumps(getattr(args, name))}" for name, key in flags.items()
             if getattr(args, name, None) is not None]
    return TrainConfig.load(args.config, items + list(args.overrides))


def main(args: argparse.Namespace) -> int:
    """Train; print a one-line JSON summary (rank 0)."""
    import yaml

    from cookmind.train.trainer import Trainer, TrainingDiverged

    try:
        cfg = resolve_config(args)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"cookmind train: {exc}")
    if args.print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return 0
    trainer = Trainer(cfg)
    try:
        summary = trainer.fit()
    except TrainingDiverged as exc:
        print(f"cookmind train: {exc}")
        return 2
    finally:
        from cookmind.parallel import destroy_distributed

        destroy_distributed()
    if trainer.dist.is_main:
        print(json.dumps({"run_dir": str(trainer.run_dir), **summary}))
    return 0
