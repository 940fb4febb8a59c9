"""save_model / load_model: config.json + model.safetensors, written atomically, loaded with clear errors."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from cookmind.model.config import CookMindConfig
from cookmind.model.lm import CookMindLM
from cookmind.model.rope import RotaryEmbedding
from cookmind.parallel import unwrap

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def model_state_dict(model: CookMindLM) -> dict[str, torch.Tensor]:
    """Weights to save, HF-named; a tied lm_head is left out (HF ties it back from embed_tokens)."""
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    storages: set[int] = set()
    for k, v in sd.items():  # weights that are views into one fused tensor (the serving runner makes
        # them) share a storage, which safetensors refuses: each gets its own copy
        ptr = v.untyped_storage().data_ptr()
        if ptr in storages:
            sd[k] = v.clone()
        storages.add(ptr)
    return sd


def _write_files(directory: Path, model: CookMindLM) -> None:
    """Write each file under a temporary name inside `directory`, then rename it into place."""
    config_tmp = directory / (CONFIG_NAME + ".tmp")
    config_tmp.write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    weights_tmp = directory / (WEIGHTS_NAME + ".tmp")
    tensors = {k: v.cpu() for k, v in model_state_dict(model).items()}
    save_file(tensors, str(weights_tmp), metadata={"format": "pt"})
    os.replace(weights_tmp, directory / WEIGHTS_NAME)
    os.replace(config_tmp, directory / CONFIG_NAME)


def save_model(directory: str | os.PathLike, model: CookMindLM) -> Path:
    """Save config.json and model.safetensors to `directory`.

    A new directory is built under a temporary sibling name and renamed, so a crash never leaves a half
    model. When `directory` already exists (e.g. a checkpoint the trainer is assembling), each file is
    written to a temporary name inside it and renamed, leaving the other files alone.
    """
    directory = Path(directory)
    model = unwrap(model)
    if not isinstance(model, CookMindLM):
        raise TypeError(f"save_model: expected a CookMindLM (optionally compiled or wrapped), "
                        f"got {type(model).__name__}")
    if directory.is_dir():
        _write_files(directory, model)
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        _write_files(tmp, model)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


class ModelLoadError(ValueError):
    """A saved model cannot be loaded: names the file and what does not match."""


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model directory as given; a training run (or its ``checkpoints/``) -> the newest checkpoint.

    Training checkpoints are ``step_N`` directories written atomically, so the one with the largest N
    that holds weights is the newest complete one. Anything else is returned unchanged, for the
    loader to report.
    """
    path = Path(path)
    if (path / CONFIG_NAME).is_file() or not path.is_dir():
        return path
    for root in (path, path / "checkpoints"):
        steps = [d for d in root.glob("step_*") if d.name[5:].isdigit() and (d / WEIGHTS_NAME).is_file()]
        if steps:
            return max(steps, key=lambda d: int(d.name[5:]))
    return path


def load_config(directory: str | os.PathLike) -> CookMindConfig:
    """Read `directory`/config.json into a CookMindConfig, with errors naming the file."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing; a CookMind model directory needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc}); the file is truncated or corrupt") from exc
    try:
        return CookMindConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def read_weights(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; a missing or truncated file raises ModelLoadError naming it."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing weights file")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: cannot read safetensors ({exc}); the file is truncated or corrupt") from exc


def check_state_dict(path: Path, expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> None:
    """Raise one ModelLoadError listing missing, unexpected and wrongly-shaped tensors of `path`."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = [f"{k}: file {tuple(found[k].shape)} vs config {tuple(expected[k].shape)}"
             for k in sorted(set(expected) & set(found)) if found[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append(f"shape mismatch in {len(wrong)} tensors: " + "; ".join(wrong[:5]))
        if missing:
            parts.append(f"missing {len(missing)} tensors: {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensors: {unexpected[:5]}")
        raise ModelLoadError(f"{path}: does not match {path.parent / CONFIG_NAME}: " + " | ".join(parts))


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> CookMindLM:
    """Load a model saved by save_model (or the model part of a training checkpoint).

    dtype=None keeps the dtype stored in the file. Errors name the file and the mismatch.
    """
    directory = Path(directory)
    cfg = load_config(directory)
    weights_path = directory / WEIGHTS_NAME
    found = read_weights(weights_path)
    with torch.device("meta"):  # shapes only: no random init of weights about to be overwritten
        model = CookMindLM(cfg)
    check_state_dict(weights_path, model_state_dict(model), found)
    if dtype is None:
        dtype = next(iter(found.values())).dtype if found else torch.float32
    model.load_state_dict(found, strict=not cfg.tie_word_embeddings, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # assign=True replaced the shared tensor
    # derived, unsaved buffers (RoPE frequencies) are rebuilt for real
    model.model.rotary_emb = RotaryEmbedding(cfg.resolved_head_dim, cfg.rope_theta, cfg.rope_scaling,
                                             max_positions=cfg.max_position_embeddings)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ModelLoadError(f"{weights_path}: internal error: {left[:5]} were not loaded")
    return model.to(device=device, dtype=dtype)
