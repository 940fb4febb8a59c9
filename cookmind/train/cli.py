"""`cookmind train`: one command for pretrain, SFT, LoRA, DPO (and GRPO) from a preset plus overrides.

    cookmind train --config tiny-cpu --train-data data/seq.bin optim.lr=3e-4 train.max_steps=500
    cookmind train --config demo train.objective=sft train.init_from=runs/pre/checkpoints --resume auto
    torchrun --nproc_per_node 2 -m cookmind train --config gpt2-small --train-data ...   # DDP

Without --run-dir each run gets its own directory, ``<preset's logging.run_dir>-<UTC time>`` (printed at the
start); ``--resume auto`` without --run-dir continues the newest of those. A resume takes the settings from the run's
own config.yaml, this command's flags and overrides on top, so ``--run-dir RUN --resume auto`` is a whole command (a
RUN without one, and no --train-data, holds no run to resume: one line says so); without --run-dir the preset only
names the runs searched, and a line names where it differs from the run found. Only an explicit --config with
--run-dir replaces the run's config.yaml (a line names the settings that differ).
Exit status: 0 completed, 2 bad input or a diverged run, 128 + N stopped by signal N (checkpoint saved; resume
with --resume auto; a SIGTERM or Ctrl-C as the run starts stops it before its first step, nothing saved).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

from cookmind.cli import a_nodes_other_rank, not_global_rank_zero, rank_name, say


def preset_names() -> list[str]:
    """The presets shipped in cookmind/configs, by name."""
    from cookmind.train.config import CONFIG_DIR

    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


MANY_PROCESSES = """\
many processes (one loop for 1..N; the global batch is micro_batch_size x grad_accum_steps x processes):
  torchrun --standalone --nproc-per-node 2 -m cookmind train ... parallel.ddp=torch   # PyTorch's DDP (default)
  torchrun --standalone --nproc-per-node 2 -m cookmind train ... parallel.ddp=ours parallel.zero1=true
  torchrun --standalone --nproc-per-node 2 -m cookmind train ... parallel.fsdp=true   # sharded checkpoints
parallel.zero1=true (ZeRO-1: AdamW's state split over the processes) goes with either parallel.ddp, torch or ours.
several nodes (every node the same command, the same paths, --run-dir on a shared filesystem):
  torchrun --nnodes 2 --nproc-per-node 8 --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      --rdzv-id run42 -m cookmind train ... --run-dir /shared/runs/x
a stop (Ctrl-C, SIGTERM to torchrun) saves a checkpoint; --resume auto continues it at any number of processes:
keep the global batch with train.grad_accum_steps (2 processes -> 1: train.grad_accum_steps=2).
README.md "Multi-node" and docs/GUIDE.md#multi-node have the details."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The stage's options; any config field is a ``section.key=value`` override. The help's epilog shows the
    launch on many processes and nodes."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = MANY_PROCESSES
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="config overrides, e.g. optim.lr=3e-4 train.max_steps=100 lora.enabled=true",
    )
    parser.add_argument(
        "-c",
        "--config",
        default=None,
        help=f"preset name in cookmind/configs ({', '.join(preset_names())}) or a YAML path (default tiny-cpu). "
        "A resume takes the run's own config.yaml instead: without --run-dir this only names the runs searched "
        "(its logging.run_dir); with --run-dir a --config given replaces the run's",
    )
    parser.add_argument("--objective", choices=["pretrain", "sft", "dpo", "grpo"], help="= train.objective")
    parser.add_argument("--train-data", help="training token store (= data.train_path)")
    parser.add_argument("--val-data", help="validation token store (= data.val_path)")
    parser.add_argument("--tokenizer", help="tokenizer directory (= data.tokenizer)")
    parser.add_argument("--init-from", help="start from this model/checkpoint (= train.init_from)")
    parser.add_argument("--run-dir", help="where metrics, report and checkpoints go (= logging.run_dir)")
    parser.add_argument(
        "--resume",
        help="'auto': the newest checkpoint of --run-dir's run (without --run-dir, of the newest run of this preset "
        "on the same objective and --train-data, any without it; none: a new run), with the run's saved settings "
        "and this command's flags and overrides on top; or a checkpoint path",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a --run-dir that holds another run, deleting its checkpoints "
        "(= checkpoint.overwrite=true)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (= logging.progress=false), for this command: a resume draws it unless it says --quiet "
        "too; the notes and the summary line stay",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve_config(args: argparse.Namespace):
    """Preset + flags + dotted overrides -> a validated TrainConfig (flags first, overrides win)."""
    from cookmind.train.config import CLI_FLAGS, TrainConfig

    flags = {flag[2:].replace("-", "_"): key for key, flag in CLI_FLAGS.items() if key != "checkpoint.overwrite"}
    items = [
        f"{key}={json.dumps(getattr(args, name))}"
        for name, key in flags.items()
        if getattr(args, name, None) is not None
    ]
    if getattr(args, "overwrite", False):
        items.append("checkpoint.overwrite=true")
    if getattr(args, "quiet", False):
        items.append("logging.progress=false")
    # a resumed run's saved settings: all but the progress bar, which is this command's, as --quiet is (a run started
    # with --quiet was resumed at a terminal showing no progress)
    bar = [] if getattr(args, "quiet", False) else ["logging.progress=true"]
    given = args.config
    if args.config is None:
        saved = run_config_to_resume(args)
        if saved is None:
            refuse_a_resume_of_no_run(args)
        args.config = saved or DEFAULT_PRESET
    from_run = given is None and args.config != DEFAULT_PRESET  # the run's own config.yaml
    cfg = TrainConfig.load(args.config, (bar if from_run else []) + items + list(args.overrides))
    if from_run:
        args.resumed_settings = args.config  # main says where the settings came from
    run_yaml = Path(cfg.logging.run_dir or "") / "config.yaml"
    own = given is not None and Path(given).is_file() and Path(given).resolve() == run_yaml.resolve()
    if given and cfg.checkpoint.resume and cfg.logging.run_dir and run_yaml.is_file() and not own:
        if not cfg.data.train_path and not (cfg.grpo or {}).get("problems"):  # it failed later as "model.vocab_size"
            raise ValueError(
                f"--config {given} replaces {run_yaml}, the resumed run's own config, and names no training data: "
                f"leave --config out to resume with the run's config, or pass --train-data (and --tokenizer)"
            )
        try:  # only for the note: the run's config need not take overrides meant for the config replacing it
            differ = settings_that_differ(
                cfg, TrainConfig.load(str(run_yaml), items + list(args.overrides)), "the run had"
            )
        except (ValueError, KeyError, TypeError) as exc:
            differ = f"not compared ({run_yaml} does not load with this command's overrides: {exc})"
        if differ:
            args.settings_note = (
                f"--config {given} replaces {run_yaml}, the resumed run's own settings: {differ}; leave --config out "
                "to resume the run as it was saved"
            )
    if getattr(args, "run_dir", None) is None and not any(
        o.strip().startswith("logging.run_dir=") for o in getattr(args, "overrides", [])
    ):
        cfg.logging.run_dir = default_run_dir(cfg.logging.run_dir, resume=bool(cfg.checkpoint.resume), cfg=cfg)
        found = Path(cfg.logging.run_dir) / "config.yaml"
        if cfg.checkpoint.resume == "auto" and found.is_file():  # a run found: resumed as --run-dir RUN resumes it
            preset = given or DEFAULT_PRESET
            try:
                run = TrainConfig.load(str(found), bar + items + list(args.overrides))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{found}, the config of the run --resume auto found, does not load with this command's flags and "
                    f"overrides ({exc}); resume it with --run-dir {cfg.logging.run_dir} --config C (a config that "
                    "loads), or leave --resume out to start a new run"
                ) from None
            run.logging.run_dir = cfg.logging.run_dir
            args.resumed_settings = str(found)
            if differ := settings_that_differ(run, cfg, f"{preset} has"):
                args.settings_note = (
                    f"the run being resumed differs from {preset}: {differ}; the run's settings are kept (an "
                    "override section.key=value changes one)"
                )
            cfg = run
    refuse_unread_overrides(cfg, list(args.overrides))  # the config the run trains on: a found run's, where one is
    args.schedule_notes = schedule_notes(cfg, list(args.overrides))
    return cfg


def settings_that_differ(used, other, other_has: str, most: int = 4) -> str:
    """``optim.lr=0.001 (OTHER_HAS 0.003), ...``: the settings of ``used`` (a TrainConfig) that ``other`` sets
    otherwise, at most ``most`` of them and a count of the rest; the run directory, and what either leaves unset
    (a vocabulary size the tokenizer gives), are not compared. "" when they agree."""
    from cookmind.train.config import yaml_word

    ours, theirs = used.flat(), other.flat()
    differ = [
        f"{key}={yaml_word(ours[key])} ({other_has} {yaml_word(theirs[key])})"
        for key in ours
        if key != "logging.run_dir"
        and ours[key] is not None
        and theirs.get(key) is not None
        and ours[key] != theirs[key]
    ]
    more = f" (and {len(differ) - most} more)" if len(differ) > most else ""
    return ", ".join(differ[:most]) + more


_FSDP_ONLY = ("reshard_after_forward", "fsdp_unit_blocks", "fsdp_prefetch")  # parallel.* that only FSDP reads


def refuse_unread_overrides(cfg, overrides: list[str]) -> None:
    """An override of a section the run does not read is a ValueError: ``lora.*`` without ``lora.enabled=true``,
    ``dpo.*`` or ``grpo.*`` in another objective's run, ``grpo.eval_size``/``eval_max_new_tokens`` without
    ``grpo.eval_problems``, FSDP's ``parallel.*`` settings without ``parallel.fsdp=true`` and DDP's
    ``parallel.bucket_mb`` with it. They were taken and ignored: ``--objective sft lora.r=4``,
    with ``lora.enabled=true`` forgotten, fine-tuned the whole model, saying nothing. A config file's sections are not
    checked (a preset, or ``--print-config``'s output, holds every section)."""
    for item in overrides:
        section, _, key = item.partition("=")[0].strip().partition(".")
        if section == "lora" and key != "enabled" and not cfg.lora.enabled:
            raise ValueError(
                f"override {item!r}: changes nothing without lora.enabled=true; add lora.enabled=true to train LoRA "
                "adapters, or leave it out"
            )
        if section in ("dpo", "grpo") and cfg.train.objective != section:
            raise ValueError(
                f"override {item!r}: only a {section} run reads the {section} section (train.objective="
                f"{cfg.train.objective}); pass --objective {section}, or leave it out"
            )
        if section == "parallel" and key in _FSDP_ONLY and not cfg.parallel.fsdp:
            raise ValueError(
                f"override {item!r}: changes nothing without parallel.fsdp=true (the run is data-parallel); add "
                "parallel.fsdp=true to shard the model, or leave it out"
            )
        if section == "parallel" and key == "bucket_mb" and cfg.parallel.fsdp:
            raise ValueError(
                f"override {item!r}: changes nothing with parallel.fsdp=true (FSDP2 reduces each unit's gradients "
                "itself; bucket_mb sizes DDP's buckets); leave it out, or set parallel.fsdp_unit_blocks"
            )
        if (
            section == "grpo"
            and key in ("eval_size", "eval_max_new_tokens")
            and not (cfg.grpo or {}).get("eval_problems")
        ):
            raise ValueError(
                f"override {item!r}: changes nothing without grpo.eval_problems (the held-out problems it applies "
                "to); add grpo.eval_problems=FILE, or leave it out"
            )


def schedule_notes(cfg, overrides: list[str]) -> list[str]:
    """Lines for schedule overrides the run takes but that change nothing: ``optim.min_lr_ratio`` (the cosine's floor)
    with ``optim.schedule=constant``. Notes, not refusals: a resume following the schedule warning's advice repeats
    its command with ``optim.schedule=constant`` added."""
    notes = []
    for item in overrides:
        if item.partition("=")[0].strip() == "optim.min_lr_ratio" and cfg.optim.schedule == "constant":
            notes.append(
                f"{item.strip()} changes nothing with optim.schedule=constant (the learning rate stays at optim.lr "
                "after its warmup; the ratio is the cosine schedule's floor): set optim.schedule=cosine to decay to "
                "it, or leave it out"
            )
    return notes


def printable_config(cfg) -> dict:
    """``--print-config``: every field of the run, the grpo objective's settings with their defaults filled in (its
    section holds only what was set), whatever the objective, as the dpo section shows its defaults."""
    import dataclasses

    from cookmind.align.objective import grpo_settings

    d = cfg.to_dict()
    settings = dataclasses.asdict(grpo_settings(cfg.grpo))
    d["grpo"] = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    return d


DEFAULT_PRESET = "tiny-cpu"


def _flag_or_override(args: argparse.Namespace, name: str, key: str) -> str | None:
    """The value given for ``key`` by its flag ``--name`` or a ``key=value`` override (the override wins)."""
    value = getattr(args, name, None)
    for o in getattr(args, "overrides", []):
        k, sep, v = o.strip().partition("=")
        if sep and k == key:
            value = v.strip().strip("'\"")
    return value or None


def run_config_to_resume(args: argparse.Namespace) -> str | None:
    """Without --config, a resume of a named run directory starts from that run's config.yaml (what it trained
    with), so ``--run-dir RUN --resume auto train.max_steps=N`` continues it; None otherwise (the default preset)."""
    run_dir = _flag_or_override(args, "run_dir", "logging.run_dir")
    resume = _flag_or_override(args, "resume", "checkpoint.resume")
    if run_dir is None or resume in (None, "null", "none", "false"):
        return None
    saved = Path(run_dir) / "config.yaml"
    return str(saved) if saved.is_file() else None


def refuse_a_resume_of_no_run(args: argparse.Namespace) -> None:
    """``--run-dir RUN --resume auto`` with no --config and no training data, where RUN holds no config.yaml: there
    is nothing to take the settings from, and the default preset failed on what it lacks (no tokenizer to size the
    vocabulary); a ValueError says there is no run to resume and what to pass. With --train-data it is a fresh start
    (a job that always resumes), as before. ``--resume RUN/checkpoints/step_N`` alone, with no data, is refused
    naming RUN and ``--run-dir RUN``, which takes its settings (the default preset said "no training data")."""
    run_dir = _flag_or_override(args, "run_dir", "logging.run_dir")
    resume = _flag_or_override(args, "resume", "checkpoint.resume")
    data = _flag_or_override(args, "train_data", "data.train_path") or _flag_or_override(
        args, "grpo_problems", "grpo.problems"
    )
    if run_dir is None and resume not in (None, "auto", "null", "none", "false") and data is None:
        saved_by = Path(resume).parent.parent  # RUN/checkpoints/step_N: a copied path the stop's note printed
        if Path(resume).parent.name == "checkpoints" and (saved_by / "config.yaml").is_file():
            raise ValueError(
                f"--resume {resume} takes its settings from --run-dir: the run that saved it is {saved_by} (its "
                f"config.yaml); resume it with --run-dir {saved_by} --resume {resume} (or --resume auto, its newest "
                "checkpoint), or pass --train-data STORE and the settings to train a new run from it"
            )
    if run_dir is None or resume != "auto" or data is not None:
        return
    run = Path(run_dir)
    checkpoints = run / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        raise ValueError(
            f"{run} holds checkpoints but no config.yaml, which says how the run trained: resume it with the "
            "--config and --train-data it trained with"
        )
    why = "no config.yaml and no checkpoint there" if run.is_dir() else "the folder does not exist"
    raise ValueError(
        f"no run to resume in {run} ({why}): pass the --run-dir of an existing run, or --train-data STORE to start a "
        "new run there"
    )


STAMP = r"-\d{8}-\d{6}(-\d+)?"  # what default_run_dir appends to a preset's logging.run_dir


def default_run_dir(base: str, resume: bool, now: float | None = None, cfg=None) -> str:
    """``<base>-<UTC time>``, unique, for a fresh run; for ``--resume`` the newest such directory (or a new one)
    that ran ``cfg``'s objective on its training data, or on any without one (a preset's SFT run is not where its
    pretraining resumes).
    A ``base`` that already ends in such a time (a run's saved config.yaml fed back as --config) is that run's base:
    its runs are searched, and a new one is named ``<base>-<UTC time>``, not ``<base>-<time>-<time>``."""
    base = re.sub(STAMP + "$", "", base)
    base_path = Path(base)
    if resume:
        runs = sorted(
            p
            for p in base_path.parent.glob(base_path.name + "-*")
            if re.fullmatch(STAMP, p.name[len(base_path.name) :])  # not another preset's: tiny-cpu-sft-<time>
            and (p / "checkpoints").is_dir()
            and (cfg is None or _same_job(p, cfg))
        )
        if runs:
            return str(runs[-1])
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    candidate, n = Path(f"{base}-{stamp}"), 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{base}-{stamp}-{n}")
    return str(candidate)


def _same_job(run_dir: Path, cfg) -> bool:
    """Whether the run in ``run_dir`` (its config.yaml; a run without one counts) trained ``cfg``'s objective on
    ``cfg``'s training data (any, where ``cfg`` names none: the resume takes the run's own)."""
    import yaml

    try:
        ran = yaml.safe_load((run_dir / "config.yaml").read_text())
        objective, train_path = ran["train"]["objective"], ran["data"]["train_path"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return True
    same_data = (
        cfg.data.train_path is None
        or train_path == cfg.data.train_path
        or (
            train_path is not None
            and cfg.data.train_path is not None
            and Path(train_path).resolve() == Path(cfg.data.train_path).resolve()
        )
    )
    return objective == cfg.train.objective and same_data


def _out_of_memory(exc: BaseException, cfg, trainer) -> str:
    """One line for a CUDA out-of-memory error in a run: where, the micro-batch's size, what to change, and the
    newest complete checkpoint to resume from (a step cut short by the error is not saved: its state is half done)."""
    from cookmind.cli import OOM_ADVICE, out_of_memory_line
    from cookmind.train.checkpoint import find_latest_checkpoint

    t = cfg.train
    size = f"micro-batches of {t.micro_batch_size} x {cfg.data.window_size} tokens"
    if trainer is None:
        return out_of_memory_line(exc, f"while the run was set up ({size}); {OOM_ADVICE['train']}")
    newest = find_latest_checkpoint(trainer.ckpt_dir) if trainer.dist.is_main else None
    resume = f"; the newest complete checkpoint is {newest}: continue with --resume auto --run-dir {trainer.run_dir}"
    return out_of_memory_line(
        exc, f"at step {trainer.step + 1} ({size}); {OOM_ADVICE['train']}" + (resume if newest else "")
    )


def _interrupted(trainer) -> str:
    """The line for a second Ctrl-C: the step it stopped at, whether that step's checkpoint is whole (it may have been
    saved before the stop: checkpoint.every, or the stop's save had ended) or else the newest complete one, and how to
    continue."""
    from cookmind.train.checkpoint import checkpoint_name, find_latest_checkpoint

    newest = find_latest_checkpoint(trainer.ckpt_dir) if trainer.dist.is_main else None
    resume = f"continue with --resume auto --run-dir {trainer.run_dir}"
    saved = newest is not None and newest.name == checkpoint_name(trainer.step)
    if saved and trainer.step >= trainer.cfg.train.max_steps:  # nothing to resume: only the run's last words are cut
        return (
            f"interrupted after its last step ({trainer.step}) and that step's checkpoint ({newest}) were done: the "
            "training is complete; its final evaluation or report.md may be missing"
        )
    if saved:
        return f"interrupted at step {trainer.step} after its checkpoint was saved ({newest}): {resume}"
    return (
        f"interrupted at step {trainer.step} before its checkpoint was saved; the newest complete one is "
        f"{newest or 'none'}: {resume}"
    )


def _where_the_run_is(trainer) -> str:
    """Where a run that failed mid-fit was: the step under way, or past its last one (the last checkpoint, the
    final evaluation, the report)."""
    if trainer.step < trainer.cfg.train.max_steps:
        return f"at step {trainer.step + 1}"
    return f"after its last step ({trainer.step}), saving or reporting"


def _lost_peer(exc: BaseException, when: str, run_dir, info) -> str | None:
    """The line for a collective whose peer has gone (a node killed, a process out of host memory), or None for any
    other error: this rank, what the backend said, and how to go on. It was gloo's traceback through the autograd
    engine on every surviving rank, which named neither the step nor what to do. ``info``: the Trainer's DistInfo,
    or None before there is one (torchrun's RANK / WORLD_SIZE then)."""
    import socket

    from cookmind.parallel.process_group import lost_peer_reason

    rank, world = (info.rank, info.world_size) if info is not None else (rank_name(), None)
    if os.environ.get("COOKMIND_DEBUG"):  # the traceback, as for every other error
        return None
    if (world or int(os.environ.get("WORLD_SIZE", "1"))) < 2 or (reason := lost_peer_reason(exc)) is None:
        return None
    return (
        f"rank {rank} (on {socket.gethostname()}) lost another rank {when} ({reason}): a "
        "process of the job ended (killed, out of host memory) or its node went away; its own log or torchrun's "
        f"summary says why; continue with --resume auto --run-dir {run_dir} once every node is back"
    )


def _note(text: str) -> None:
    """``cookmind train: TEXT`` on stderr, its control and bidi characters escaped (``say``): the notes quote the run
    directory, the config file and the stop's reason."""
    say("cookmind train", None, text)


class _StoppedAtStart(BaseException):
    """A SIGTERM while the Trainer sets the run up, before fit's own stop handlers (a BaseException: no start-up
    ``except Exception`` takes it for a failure to report)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stopping_at_start():
    """SIGTERM raises ``_StoppedAtStart`` in the block (its default handler ended the process without a word), the
    previous handler back after it. A Ctrl-C is a KeyboardInterrupt there already (``main`` says it alike)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise _StoppedAtStart(signum)

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(args: argparse.Namespace) -> int:
    """Train; print a one-line JSON summary (rank 0)."""
    import torch
    import yaml

    from cookmind.train.trainer import Trainer

    cfg = resolve_config(args)  # bad input: cookmind.cli says it in one line, exit status 2 (and tells other ranks)
    if args.print_config:
        if not a_nodes_other_rank():  # under torchrun once a node, as --help
            print(yaml.safe_dump(printable_config(cfg), sort_keys=False))
        return 0
    if not not_global_rank_zero():  # under torchrun every rank takes rank 0's (the Trainer agrees it)
        _note(f"run directory {cfg.logging.run_dir}")
        if saved := getattr(args, "resumed_settings", None):
            _note(f"settings from {saved} (the run being resumed), with this command's flags and overrides on top")
        if note := getattr(args, "settings_note", None):
            _note(note)
        for note in getattr(args, "schedule_notes", []):
            _note(note)
    try:
        with _stopping_at_start():
            trainer = Trainer(cfg)
    except (_StoppedAtStart, KeyboardInterrupt) as stop:  # a Ctrl-C got cookmind.cli's bare "interrupted"
        if isinstance(stop, KeyboardInterrupt) and os.environ.get("COOKMIND_DEBUG"):
            raise  # the traceback, as cookmind.cli shows it for a Ctrl-C
        signum = getattr(stop, "signum", signal.SIGINT)
        if not a_nodes_other_rank():  # every rank got it: said once a node
            _note(
                f"{signal.Signals(signum).name} came as the run was starting: stopped before its first step; "
                "nothing was saved"
            )
        return 128 + signum
    except torch.OutOfMemoryError as exc:
        say("cookmind train", "error", _out_of_memory(exc, cfg, None))
        return 2
    except RuntimeError as exc:
        if (line := _lost_peer(exc, "as the run started", cfg.logging.run_dir, None)) is None:
            raise
        say("cookmind train", "error", line)
        return 2
    # the stop handlers stay until the run is reported: a Ctrl-C as fit returns leaves the completed run completed
    with trainer.handling_signals():
        return _fit_and_report(trainer, cfg)


def _fit_and_report(trainer, cfg) -> int:
    """Run ``trainer.fit``, say how it ended (a JSON summary line on rank 0) and return the exit status."""
    import torch

    from cookmind.train.trainer import TrainingDiverged

    try:
        summary = trainer.fit()
    except TrainingDiverged as exc:
        _note(str(exc))
        return 2
    except torch.OutOfMemoryError as exc:
        say("cookmind train", "error", _out_of_memory(exc, cfg, trainer))
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C: stopped without waiting for the step's checkpoint
        _note(_interrupted(trainer))
        return 128 + signal.SIGINT
    except RuntimeError as exc:  # torch.distributed's errors are RuntimeErrors
        if (line := _lost_peer(exc, _where_the_run_is(trainer), trainer.run_dir, trainer.dist)) is None:
            raise
        say("cookmind train", "error", line)
        return 2
    finally:
        from cookmind.parallel import destroy_distributed

        try:
            trainer.close()  # the wrappers first: DDP's reducer must not be what frees the process group
        finally:  # a second Ctrl-C in close leaves the group too
            destroy_distributed()
    if trainer.dist.is_main:
        print(json.dumps({"run_dir": str(trainer.run_dir), **summary}))
        if summary["status"] == "completed" and trainer.stop_reason is not None:  # its handler said "stopping"
            _note(
                f"{trainer.stop_reason} came once the last step was under way; the run completed its "
                f"{summary['steps']} steps"
            )
    if summary["status"] == "stopped":
        # Not 0: `cookmind train && cookmind export` must not export a half-trained model.
        reason = trainer.stop_reason or "a stop request"
        # every rank stops; one a node says so (its own log may be all a user of that node reads)
        if trainer.dist.is_main or not a_nodes_other_rank():
            _note(
                f"stopped by {reason} at step {summary['steps']}; checkpoint saved, continue with "
                f"--resume auto --run-dir {trainer.run_dir}"
            )
        signum = getattr(signal, reason.removeprefix("signal "), None) if reason.startswith("signal ") else None
        return 128 + int(signum) if signum is not None else 3
    return 0
