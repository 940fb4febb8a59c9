"""Training checkpoints: one directory per step, written atomically, the newest complete one found on resume.

    <root>/step_00000120/
        model.safetensors, config.json   weights via cookmind.model.save_model (LoRA runs: merged)
        adapter_model.safetensors,       LoRA runs only: the trainable adapter, PEFT names
        adapter_config.json
        cookmind_tokenizer.json, ...     the run's tokenizer files, when it has one
        optimizer.pt                     optimizer (+ grad scaler) state, loaded with weights_only=True
        meta.json                        step, tokens, sampler position, RNG states, world size, config

A checkpoint is saved after the optimizer step it names. It is written under a temporary name
and renamed, so a crash mid-save never leaves a directory that looks complete; ``meta.json`` is
the last file written and marks completeness.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from cookmind.train.objectives.base import unwrap

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_name(step: int) -> str:
    """Directory name for ``step`` (zero-padded so names sort by step)."""
    return f"step_{step:08d}"


def save_checkpoint(root: str | Path, step: int, model: torch.nn.Module, optimizer: Any | None,
                    meta: dict[str, Any], tokenizer_dir: str | Path | None = None, keep_last: int = 0,
                    scaler: Any | None = None, optimizer_state: dict[str, Any] | None = None) -> Path:
    """Write ``<root>/step_<step>`` atomically and prune to the newest ``keep_last`` (0 = keep all).

    ``optimizer_state`` replaces ``optimizer.state_dict()`` when the caller gathered it already
    (a sharded optimizer's state_dict is collective: every rank calls it, rank 0 saves).
    """
    from cookmind.model import save_model
    from cookmind.model.lora import has_lora, merged_copy, save_adapter

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    bare = unwrap(model)
    if has_lora(bare):
        save_model(tmp, merged_copy(bare))
        save_adapter(tmp, bare)
    else:
        save_model(tmp, bare)
    if tokenizer_dir is not None:
        # Beside the weights (cookmind_tokenizer.json, tokenizer.json, ...), where export/generate look.
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and not (tmp / f.name).exists():
                shutil.copy2(f, tmp / f.name)
    if optimizer is not None or optimizer_state is not None:
        state = {"optimizer": optimizer_state if optimizer_state is not None else optimizer.state_dict()}
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        torch.save(state, tmp / "optimizer.pt")
    meta = {**meta, "step": step, "saved_at": time.time(), "complete": True}
    _write_json(tmp / "meta.json", meta)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep_last > 0:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (a directory without meta.json is ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / "meta.json").is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def find_latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (or ``root`` itself if it is one), else None."""
    root = Path(root)
    if (root / "meta.json").is_file():
        return root
    found = list_checkpoints(root)
    return found[-1] if found else None


def read_meta(path: str | Path) -> dict[str, Any]:
    """A checkpoint's meta.json, with a clear error when it is missing or damaged."""
    f = Path(path) / "meta.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f}: missing; {path} is not a complete cookmind checkpoint")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{f}: damaged JSON ({exc}); delete this checkpoint or resume from another") from exc


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: Any | None = None,
                    scaler: Any | None = None) -> dict[str, Any]:
    """Load weights (or the LoRA adapter), optimizer and scaler state into live objects; return meta."""
    from cookmind.model import load_model
    from cookmind.model.lora import has_lora, load_adapter

    path = Path(path)
    meta = read_meta(path)
    bare = unwrap(model)
    if has_lora(bare):
        # The base weights are frozen and rebuilt from train.init_from; only the adapter trained.
        if not (path / "adapter_model.safetensors").is_file():
            raise FileNotFoundError(f"{path}/adapter_model.safetensors: missing, but the model has LoRA adapters")
        load_adapter(bare, path)
    else:
        saved = load_model(path, device="cpu")
        own = bare.state_dict()
        theirs = saved.state_dict()
        if set(own) != set(theirs):
            raise ValueError(f"{path}/model.safetensors: parameter names differ from the model being trained "
                             f"(missing {sorted(set(own) - set(theirs))[:5]}, unexpected "
                             f"{sorted(set(theirs) - set(own))[:5]}); resume with the same model config")
        with torch.no_grad():
            for k, v in theirs.items():
                if own[k].shape != v.shape:
                    raise ValueError(f"{path}/model.safetensors: {k} has shape {tuple(v.shape)}, the model has "
                                     f"{tuple(own[k].shape)}; resume with the same model config")
                own[k].copy_(v)
    if optimizer is not None:
        f = path / "optimizer.pt"
        if not f.is_file():
            raise FileNotFoundError(f"{f}: missing; cannot resume the optimizer (use train.init_from to start fresh)")
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:  # torch advises turning weights_only off: that would run the file's code
            why = next((ln.strip() for ln in str(exc).splitlines() if "global" in ln.lower()), "an unsupported object")
            raise ValueError(f"{f}: refused to load: it holds Python objects other than tensors and plain data "
                             f"({why}); only resume from checkpoints cookmind wrote, or start fresh with "
                             "train.init_from") from None
        optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
    return meta


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
