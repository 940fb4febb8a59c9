"""Training checkpoints: one directory per step, written atomically, the newest complete one found on resume.

    <root>/step_00000120/
        model.safetensors, config.json   weights via cookmind.model.save_model (LoRA runs: merged)
        adapter_model.safetensors,       LoRA runs only: the trainable adapter, PEFT names; its config's
        adapter_config.json              base_model_name_or_path is the train.init_from checkpoint it adapts
        cookmind_tokenizer.json, ...     the run's tokenizer files, when it has one
        optimizer.pt                     optimizer (+ grad scaler) state, loaded with weights_only=True
        meta.json                        step, tokens, sampler position, RNG states, world size, config, the
                                         data stores (path, fingerprint) a resume must continue on, and the
                                         SHA-256 of every other file (``sha256``), checked on load

``checkpoint.format=sharded`` (the default for an FSDP-sharded model) writes ``dcp/`` from every rank instead of
model.safetensors and optimizer.pt: ``cookmind.train.sharded_checkpoint``. Loading reads either.

A checkpoint is saved after the optimizer step it names. It is built under a temporary name that
carries our PID (``cookmind.atomic``) and renamed, so a crash mid-save never leaves a directory that
looks complete (the next save removes a dead writer's leftovers); ``meta.json`` is the last file
written and marks completeness. Each run has a ``run_id``: pruning (``keep_last``) removes only the
run's own checkpoints, never while its loss is misbehaving, and never another run's. Which checkpoint
is "the newest" is decided in one place, ``cookmind.model.model_io.latest_checkpoint``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from cookmind.atomic import building_dir, refuse_nested, temp_path, write_json
from cookmind.model.model_io import (
    META_NAME,
    OPTIMIZER_NAME,
    SHA256_KEY,
    content_hashes,
    foreign_files,
    is_own_checkpoint,
    latest_checkpoint,
    step_dirs,
    verify_checksums,
    written_files,
)
from cookmind.model.sharded_layout import is_sharded_checkpoint
from cookmind.run_layout import REPORT_FILES, RUN_ENTRIES, STEP_DIR, is_run_dir
from cookmind.tokenizer.files import copy_tokenizer_files
from cookmind.train.config import setting
from cookmind.train.objectives.base import unwrap
from cookmind.train.sharded_checkpoint import (
    is_fsdp_sharded,
    load_full_model_into_sharded,
    load_full_optimizer_into_sharded,
    load_sharded,
)


def checkpoint_name(step: int) -> str:
    """Directory name for ``step`` (zero-padded so names sort by step)."""
    return f"step_{step:08d}"


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: Any | None,
    meta: dict[str, Any],
    tokenizer_dir: str | Path | None = None,
    keep_last: int = 0,
    scaler: Any | None = None,
    optimizer_state: dict[str, Any] | None = None,
    lora_base: str | None = None,
) -> Path:
    """Write ``<root>/step_<step>`` atomically, then prune the run's own checkpoints to the newest ``keep_last``.

    ``meta["run_id"]`` names the run: only its checkpoints are pruned (0 = keep all), and none when
    ``meta`` says the run is diverged or its last steps were bad (``consecutive_bad`` > 0), so a good
    checkpoint is never dropped for a doubtful one. ``optimizer_state`` replaces ``optimizer.state_dict()``
    when the caller gathered it already (a sharded optimizer's state_dict is collective: every rank calls
    it, rank 0 saves). ``lora_base`` is the base model a LoRA model's adapter was trained on (adapter_config.json's
    ``base_model_name_or_path``).
    """
    from cookmind.model import save_model
    from cookmind.model.lora import has_lora, merged_copy, save_adapter

    root = Path(root)
    final = root / checkpoint_name(step)
    bare = unwrap(model)
    with building_dir(final, replace=True, is_ours=is_own_checkpoint, what="cookmind checkpoint") as tmp:
        if has_lora(bare):
            save_model(tmp, merged_copy(bare))
            save_adapter(tmp, bare, base_model_path=lora_base)
        else:
            save_model(tmp, bare)
        if tokenizer_dir is not None:
            # beside the weights (cookmind_tokenizer.json, tokenizer.json, ...), where export/generate look
            copy_tokenizer_files(tokenizer_dir, tmp, replace=False)  # its files only: --tokenizer may name a model
        if optimizer is not None or optimizer_state is not None:
            state = {"optimizer": optimizer_state if optimizer_state is not None else optimizer.state_dict()}
            if scaler is not None:
                state["scaler"] = scaler.state_dict()
            with temp_path(tmp / OPTIMIZER_NAME) as opt:
                torch.save(state, opt)
        meta = {**meta, "step": step, "saved_at": time.time(), "complete": True, "files": written_files(tmp)}
        meta[SHA256_KEY] = content_hashes(tmp)
        write_json(tmp / META_NAME, meta)
    prune_checkpoints(root, final, meta, keep_last)
    return final


def prune_checkpoints(root: str | Path, final: Path, meta: dict[str, Any], keep_last: int) -> None:
    """After saving ``final``: remove the run's own older checkpoints past the newest ``keep_last`` (0 = keep all),
    and none when ``meta`` says the run diverged or its last steps were bad."""
    doubtful = meta.get("diverged") or meta.get("consecutive_bad", 0) > 0
    if keep_last > 0 and not doubtful:
        own = [d for d in list_checkpoints(root) if d != final and _run_id(d) == meta.get("run_id")]
        for old in own[: max(0, len(own) - (keep_last - 1))]:
            if foreign := foreign_files(old):  # the user put files there: the checkpoint stays, and says why
                warnings.warn(
                    f"{old} is kept past checkpoint.keep_last: it holds files no save wrote "
                    f"({', '.join(foreign[:3])}); move them out and delete it yourself",
                    stacklevel=2,
                )
                continue
            shutil.rmtree(old, ignore_errors=True)


def _run_id(path: Path) -> str | None:
    try:
        return json.loads((path / META_NAME).read_text()).get("run_id")
    except (OSError, ValueError):
        return None


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (a directory without meta.json is ignored)."""
    return [d for _, d in step_dirs(root) if (d / META_NAME).is_file()]


def find_latest_checkpoint(root: str | Path, need_optimizer: bool = False, progress: bool = False) -> Path | None:
    """The newest usable checkpoint under ``root`` (or ``root`` itself if it is one), else None.

    The one rule, ``cookmind.model.model_io.latest_checkpoint``: damaged or diverged ones are passed over
    with a warning. ``progress``: a bar of the check of the SHA-256s its meta.json recorded.
    """
    return latest_checkpoint(root, need_optimizer, progress)


def refuse_overwriting_inputs(
    ckpt_dir: str | Path, run_dir: str | Path, resume: str | None, overwrite: bool, reads: dict[str, str | None]
) -> None:
    """Before the run writes or deletes anything (and on every rank, so all stop alike): a run directory (or
    ``checkpoint.dir``) in another run's checkpoints folder, or that is one of its ``step_N`` checkpoints, is
    refused (that run's keep_last pruning or --overwrite would delete this run, and its newest-checkpoint rule take
    this run's files for its model); ``overwrite`` with a resume from the same run is a contradiction, and with an
    input the run reads (``reads``: setting -> path, such as ``train.init_from``) in the checkpoints it would
    delete, it would delete the model it was told to start from."""
    from cookmind.run_layout import checkpoints_folder_of, refuse_output_in_checkpoints

    refuse_output_in_checkpoints(run_dir, "--run-dir")
    if checkpoints_folder_of(ckpt_dir) not in (None, Path(os.path.abspath(ckpt_dir))):  # not its own folder
        refuse_output_in_checkpoints(ckpt_dir, "checkpoint.dir")
    # a fresh run (a resume that finds nothing to continue is one: scripts pass --resume auto always) writes its
    # folders inside none of the folders it reads (a resume's are there); one that is that folder, or holds it, is
    # another run's or its own: check_run_dir and the checks below say so. A run directory it reads (--init-from
    # runs/pre) is read only through its checkpoints/, which refuse any output inside them (above): beside them is no
    # harm.
    if not resume or (resume == "auto" and not list_checkpoints(ckpt_dir)):
        outs = {"--run-dir": run_dir}
        if not Path(ckpt_dir).resolve().is_relative_to(Path(run_dir).resolve()):  # a checkpoint.dir elsewhere
            outs["checkpoint.dir"] = ckpt_dir
        for key, value in reads.items():
            if not value or not Path(value).is_dir() or is_run_dir(value):
                continue
            for name, out in outs.items():
                if Path(value).resolve() != Path(out).resolve():
                    refuse_nested(value, out, f"the folder {setting(key)} reads", Path(out).name, name, around=False)
    if not overwrite:
        return
    ckpt_dir, run_dir = Path(ckpt_dir).resolve(), Path(run_dir).resolve()

    def inside(path: Path) -> bool:
        path = path.resolve()
        return path == run_dir or path.is_relative_to(ckpt_dir)

    if resume and (resume == "auto" or inside(Path(resume))):
        raise ValueError(
            f"--resume {resume} continues the run in {run_dir} and --overwrite deletes its checkpoints: give one of "
            "them (--overwrite starts afresh)"
        )
    for key, value in reads.items():
        if value and inside(Path(value)):
            raise ValueError(
                f"{setting(key, value)} is a checkpoint of the run in {run_dir}, which --overwrite would delete before "
                f"reading it: give the new run another --run-dir (it starts from {value} all the same)"
            )


def check_run_dir(
    ckpt_dir: str | Path,
    run_dir: str | Path,
    resume: str | None,
    overwrite: bool,
    cfg: Any = None,
    progress: bool = False,
) -> None:
    """Refuse to start a fresh run where another run left checkpoints or metrics (``--resume`` continues it); where
    that run is ``cfg``'s own (its config.yaml the same: the command run again after a crash), the refusal says so,
    where it stopped, and how to go on.

    With ``overwrite`` the old run's checkpoints, metrics and report (with its plots) are deleted first: the user
    asked for that. A folder
    holding other files is refused before this, by ``refuse_foreign_files`` (the Trainer, before it takes the lock).
    ``progress``: a bar of the check of the SHA-256s of the checkpoint an explicit ``--resume PATH`` names.
    """
    ckpt_dir, run_dir = Path(ckpt_dir), Path(run_dir)
    old = [d for _, d in step_dirs(ckpt_dir)]
    metrics = run_dir / "metrics.jsonl"
    into_another_run = (
        resume and resume != "auto" and old and _check_explicit_resume(Path(resume), ckpt_dir, run_dir, progress)
    )
    if (resume and not into_another_run) or not (old or metrics.exists()):
        return
    if not overwrite:
        what = f"checkpoints {', '.join(d.name for d in old[-3:])}" if old else "metrics.jsonl"
        if not into_another_run and cfg is not None and _same_config(run_dir, cfg):
            raise FileExistsError(_own_run_stopped(ckpt_dir, run_dir, old, cfg.train.max_steps))
        if into_another_run:
            raise FileExistsError(
                f"{run_dir} already holds another run ({what}); resuming {resume} there would mix the two runs' "
                "checkpoints and metrics (and replace a step of the same number): resume into an empty --run-dir, "
                "or pass --overwrite to delete that run's checkpoints"
            )
        raise FileExistsError(
            f"{run_dir} already holds another run ({what}); continue it with --resume auto, "
            f"choose another --run-dir, or pass --overwrite to delete that run's checkpoints"
        )
    for d in old:  # all or nothing: a folder the user put files in stops the deletion before it starts
        if foreign := foreign_files(d):
            raise FileExistsError(
                f"{d} holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, which no checkpoint save "
                "wrote: --overwrite deletes a run's checkpoints, never other files; move them out, then run again"
            )
    for d in old:
        shutil.rmtree(d)
    metrics.unlink(missing_ok=True)
    for name in REPORT_FILES:  # its report and plots: a new run that plots less would leave the old ones beside its own
        (run_dir / name).unlink(missing_ok=True)


# settings a run resolves as it starts (a window sized from the store, the model sized from the tokenizer or
# init_from), saved so in its config.yaml: compared only where the user set them
_RESOLVED_AT_START = ("model.", "data.window_size", "data.tokenizer")


def _same_config(run_dir: Path, cfg: Any) -> bool:
    """Whether ``run_dir``'s config.yaml is ``cfg``'s: every setting both give agrees, but the run directory, the
    resume and overwrite flags and what a run resolves as it starts (``_RESOLVED_AT_START``, unless set)."""
    from cookmind.train.config import TrainConfig

    try:
        saved = TrainConfig.load(str(run_dir / "config.yaml")).flat()
    except (OSError, ValueError, KeyError, TypeError):  # none, or one that no longer loads: not this command's
        return False
    for key, value in cfg.flat().items():
        if key in ("logging.run_dir", "checkpoint.resume", "checkpoint.overwrite") or value is None:
            continue
        if key.startswith(_RESOLVED_AT_START) and not cfg.is_user_set(key):
            continue
        if saved.get(key) is not None and saved[key] != value and not _same_path(saved[key], value):
            return False
    return True


def _same_path(a: Any, b: Any) -> bool:
    """Whether two settings are one file or folder spelled two ways (``seq/``, ``./seq``, an absolute path)."""
    if not (isinstance(a, str) and isinstance(b, str)) or not (os.path.exists(a) or os.path.exists(b)):
        return False
    return os.path.realpath(a) == os.path.realpath(b)


def _own_run_stopped(ckpt_dir: Path, run_dir: Path, old: list[Path], max_steps: int) -> str:
    """The refusal for a fresh start of the run already in ``run_dir`` (the same config): where it stopped (its
    newest complete checkpoint, or before its first) and the way on: --resume auto from a checkpoint, --overwrite
    to start again."""
    newest = find_latest_checkpoint(ckpt_dir)
    if newest is None:
        deleting = "its metrics and checkpoints" if old else "its metrics"
        incomplete = f" ({', '.join(d.name for d in old[-3:])}: none complete)" if old else ""
        return (
            f"{run_dir} holds this command's own run, stopped before its first complete checkpoint{incomplete}: pass "
            f"--overwrite to start it again (deleting {deleting})"
        )
    step = int(STEP_DIR.match(newest.name).group(1))
    if step >= max_steps:
        return (
            f"{run_dir} holds this command's own run, completed at step {step} ({newest}): use that model, or pass "
            "--overwrite to train it again (deleting its checkpoints)"
        )
    return (
        f"{run_dir} holds this command's own run, stopped at step {step} (its newest checkpoint {newest.name}): "
        "continue it with --resume auto, or pass --overwrite to start it again (deleting its checkpoints)"
    )


def refuse_foreign_files(run_dir: Path, ckpt_dir: Path | None = None) -> None:
    """A fresh run writes config.yaml, report.md, plots and checkpoints/ into its directory, replacing files of those
    names: it refuses a folder holding anything a run did not write (a token store, the user's files), --overwrite
    or not (that deletes a run's checkpoints, never other files). A killed write's temporary file is a run's. A
    ``checkpoint.dir`` elsewhere may hold step_N folders only."""
    if run_dir.is_dir():
        ours = RUN_ENTRIES | ({ckpt_dir.name} if ckpt_dir is not None and ckpt_dir.parent == run_dir else set())
        what_to_do = "a run writes config.yaml, report.md and checkpoints/ there; choose a new or empty --run-dir"
        _refuse_others(run_dir, ours, what_to_do)
    if ckpt_dir is not None and ckpt_dir.is_dir():  # checkpoint.dir may name any folder: it holds step_N/ only
        steps = {d.name for _, d in step_dirs(ckpt_dir)}
        _refuse_others(
            ckpt_dir, steps, "checkpoints go into step_N folders there; choose a new or empty checkpoint.dir"
        )


def _refuse_others(folder: Path, ours: set[str], what_to_do: str) -> None:
    """FileExistsError naming the entries of ``folder`` other than ``ours`` (and temporary files), if any."""
    from cookmind.atomic import is_temp_name

    foreign = sorted(p.name for p in folder.iterdir() if p.name not in ours and not is_temp_name(p.name))
    if foreign:
        raise FileExistsError(
            f"{folder} holds files a training run did not write ({', '.join(foreign[:4])}"
            f"{', ...' if len(foreign) > 4 else ''}): {what_to_do}"
        )


def _check_explicit_resume(resume: Path, ckpt_dir: Path, run_dir: Path, progress: bool = False) -> bool:
    """``--resume PATH`` into a run directory that holds checkpoints: it must be this directory's own newest.
    Another run's directory would get this run's checkpoints beside its own, a step of the same number overwritten
    and the rest pruned; an older step of its own leaves the abandoned steps after it as the newest. True: PATH is
    another run's, which --overwrite (checked by the caller) may clear the directory for."""
    source = find_latest_checkpoint(resume, need_optimizer=True, progress=progress)  # the one the resume loads
    if source is None:
        return False  # the resume itself says there is no checkpoint there
    source = source.resolve()
    steps = step_dirs(ckpt_dir)
    if source.parent != ckpt_dir.resolve():
        return True
    mine = next((s for s, d in steps if d.resolve() == source), None)
    newer = [d.name for s, d in steps if mine is not None and s > mine]
    if newer:
        raise FileExistsError(
            f"{ckpt_dir} holds checkpoints newer than {source.name} ({', '.join(newer)}): after this run they would "
            "still be taken as the newest (by --resume auto, export and generate); move them out of the folder, or "
            "resume from the newest"
        )
    return False


def read_meta(path: str | Path) -> dict[str, Any]:
    """A checkpoint's meta.json, with a clear error when it is missing or damaged."""
    f = Path(path) / "meta.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f}: missing; {path} is not a complete cookmind checkpoint")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{f}: damaged JSON ({exc}); delete this checkpoint or resume from another") from exc


def update_meta(path: str | Path, **fields: Any) -> None:
    """Set ``fields`` in a complete checkpoint's meta.json (e.g. the end-of-run evaluation, which comes after the
    final save), atomically: a crash leaves the old file whole. The hashes it holds are of the other files."""
    meta = read_meta(path)
    meta.update(fields)
    write_json(Path(path) / META_NAME, meta)


def load_checkpoint(
    path: str | Path, model: torch.nn.Module, optimizer: Any | None = None, scaler: Any | None = None
) -> dict[str, Any]:
    """Load weights (or the LoRA adapter), optimizer and scaler state into live objects; return meta.

    A sharded checkpoint (``dcp/``) is loaded through ``cookmind.train.sharded_checkpoint``: call this on every
    rank then (DCP reads each rank's part), or in one process without a group.
    """
    from cookmind.model import load_model
    from cookmind.model.lora import adapter_tensors_for, has_lora, load_adapter

    path = Path(path)
    meta = read_meta(path)
    if meta.get("diverged"):
        raise ValueError(f"{path}: saved by a diverged run; resume from an earlier checkpoint")
    verify_checksums(path, skip=() if optimizer is not None else (OPTIMIZER_NAME,))  # a checkpoint saved with hashes
    if is_sharded_checkpoint(path):
        load_sharded(path, model, optimizer, scaler, meta)
        return meta
    bare = unwrap(model)
    fsdp = is_fsdp_sharded(model)  # a run that outgrew one GPU: every rank reads the whole tensors, keeps its shard
    if has_lora(bare):
        # The base weights are frozen and rebuilt from train.init_from; only the adapter trained.
        if not (path / "adapter_model.safetensors").is_file():
            raise FileNotFoundError(f"{path}/adapter_model.safetensors: missing, but the model has LoRA adapters")
        if fsdp:  # the optimizer below holds the adapter only: its numbers name the adapter's parameters
            load_full_model_into_sharded(bare, adapter_tensors_for(bare, path), strict=False)
        else:
            load_adapter(bare, path)
    else:
        own = bare.state_dict()  # under FSDP2 DTensors, whose shapes are the whole tensors'
        theirs = load_model(path, device="cpu").state_dict()
        if set(own) != set(theirs):
            raise ValueError(
                f"{path}/model.safetensors: parameter names differ from the model being trained "
                f"(missing {sorted(set(own) - set(theirs))[:5]}, unexpected "
                f"{sorted(set(theirs) - set(own))[:5]}); resume with the same model config"
            )
        for k, v in theirs.items():
            if own[k].shape != v.shape:
                raise ValueError(
                    f"{path}/model.safetensors: {k} has shape {tuple(v.shape)}, the model has "
                    f"{tuple(own[k].shape)}; resume with the same model config"
                )
        if fsdp:
            load_full_model_into_sharded(bare, theirs)
        else:
            with torch.no_grad():
                for k, v in theirs.items():
                    own[k].copy_(v)
    if optimizer is not None:
        f = path / "optimizer.pt"
        if not f.is_file():
            raise FileNotFoundError(
                f"{f}: missing; cannot resume the optimizer (use --init-from (train.init_from) to start fresh)"
            )
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:  # torch advises turning weights_only off: that would run the file's code
            why = next((ln.strip() for ln in str(exc).splitlines() if "global" in ln.lower()), "an unsupported object")
            raise ValueError(
                f"{f}: refused to load: it holds Python objects other than tensors and plain data "
                f"({why}); only resume from checkpoints cookmind wrote, or start fresh with "
                "--init-from (train.init_from)"
            ) from None
        if fsdp:
            load_full_optimizer_into_sharded(bare, optimizer, state["optimizer"], f)
        else:
            optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
    return meta
