"""LoRA (Hu et al. 2021): a frozen projection plus a trainable low-rank update.

    y = x W^T + (alpha / r) * B(A(dropout(x)))        A: (r, in), B: (out, r), B = 0 at init

so the adapted model starts exactly equal to the base. Targets are chosen by module name (the
last component of the qualified name: ``q_proj``, ``down_proj``, ...), never by shape. A wrapped
projection keeps its ``weight`` (and ``bias``) under the same name and adds ``lora_A.weight`` /
``lora_B.weight`` beside it, which is exactly the layout PEFT uses; ``save_adapter`` writes
``adapter_model.safetensors`` (keys prefixed ``base_model.model.``) and ``adapter_config.json``
so ``peft.PeftModel.from_pretrained`` loads it onto the exported Hugging Face model.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from cookmind.atomic import building_dir, save_safetensors, temp_path, write_json
from cookmind.model.linear import Linear

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
BASE_FINGERPRINT = "cookmind.base_fingerprint"  # adapter_model.safetensors metadata


class LoRALinear(nn.Module):
    """A frozen projection (same ``weight`` name as before) with a rank-r update that trains."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        if r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {r}")
        self.in_features, self.out_features = base.weight.shape[1], base.weight.shape[0]
        self.weight = base.weight
        self.weight.requires_grad_(False)
        self.bias = getattr(base, "bias", None)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        dev, dt = base.weight.device, base.weight.dtype
        self.lora_A = nn.Linear(self.in_features, r, bias=False, device=dev, dtype=dt)
        self.lora_B = nn.Linear(r, self.out_features, bias=False, device=dev, dtype=dt)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        # A as nn.Linear's default (Kaiming-uniform, a=sqrt(5)), B = 0: the update starts at zero.
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.merged = False
        self.disabled = False

    def delta_weight(self) -> torch.Tensor:
        """The update the adapter adds to W: (alpha / r) * B A, shape (out, in)."""
        return self.scaling * (self.lora_B.weight @ self.lora_A.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.t()
        if self.bias is not None:
            y = y + self.bias
        if self.merged:
            if self.disabled:
                raise RuntimeError("cannot disable a merged LoRA adapter; unmerge it first")
            return y
        if self.disabled:
            return y
        return y + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / r) B A; the forward then skips the low-rank path."""
        if not self.merged:
            self.weight.add_(self.delta_weight().to(self.weight.dtype))
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W <- W - (alpha / r) B A, undoing ``merge`` (equal up to rounding)."""
        if self.merged:
            self.weight.sub_(self.delta_weight().to(self.weight.dtype))
            self.merged = False

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, r={self.r}, alpha={self.alpha}, merged={self.merged}"


def _matches(name: str, targets: tuple[str, ...] | list[str]) -> bool:
    return name.rsplit(".", 1)[-1] in targets


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: tuple[str, ...] | list[str] = DEFAULT_TARGETS,
) -> list[str]:
    """Wrap every projection whose name ends in one of ``targets``; freeze everything else.

    Returns the wrapped module names. Raises if a target matches no module (a typo in a target name), even beside
    others that match: the typo would leave that projection unadapted, saying nothing.
    """
    if has_lora(model):
        raise ValueError("model already has LoRA adapters")
    found = [(n, m) for n, m in model.named_modules() if _matches(n, targets) and isinstance(m, (Linear, nn.Linear))]
    names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, (Linear, nn.Linear))})
    unmatched = [t for t in targets if t not in names]
    if not found or unmatched:
        also = f" (of {list(targets)})" if found else ""
        raise ValueError(
            f"LoRA targets {unmatched or list(targets)} match no linear layer{also}; linear layer names are {names}"
        )
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, r, alpha, dropout))
    model.lora_config = {
        "r": r,
        "alpha": alpha,
        "dropout": dropout,
        "targets": sorted({n.rsplit(".", 1)[-1] for n, _ in found}),
    }
    return [n for n, _ in found]


def lora_modules(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    """(name, module) for every LoRA-wrapped projection."""
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            yield name, m


def has_lora(model: nn.Module) -> bool:
    """True when any projection of ``model`` is LoRA-wrapped."""
    return any(True for _ in lora_modules(model))


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter weights, named as in the model (``...q_proj.lora_A.weight``)."""
    return {k: v for k, v in model.state_dict().items() if ".lora_A." in k or ".lora_B." in k}


def merge_lora(model: nn.Module) -> None:
    """Fold every adapter into its base weight."""
    for _, m in lora_modules(model):
        m.merge()


def unmerge_lora(model: nn.Module) -> None:
    """Take every merged adapter back out of its base weight."""
    for _, m in lora_modules(model):
        m.unmerge()


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block the model computes as its base (the DPO reference without a second copy)."""
    mods = [m for _, m in lora_modules(model)]
    before = [m.disabled for m in mods]
    for m in mods:
        m.disabled = True
    try:
        yield model
    finally:
        for m, b in zip(mods, before):
            m.disabled = b


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with adapters folded in and plain ``Linear`` layers back (saves HF-named)."""
    out = copy.deepcopy(model)
    for name, m in list(lora_modules(out)):
        w = m.weight.detach() + (0 if m.merged else m.delta_weight().detach().to(m.weight.dtype))
        plain = Linear(m.in_features, m.out_features, bias=m.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            plain.weight.copy_(w)
            if m.bias is not None:
                plain.bias.copy_(m.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent_name) if parent_name else out, child, plain)
    for p in out.parameters():
        p.requires_grad_(True)
    if hasattr(out, "lora_config"):
        del out.lora_config
    return out


def save_adapter(
    directory: str | os.PathLike, model: nn.Module, base_model_path: str | None = None, overwrite: bool = False
) -> Path:
    """Write ``adapter_model.safetensors`` + ``adapter_config.json`` (PEFT LoRA format) into ``directory``.

    The weights file's metadata also records the base's ``fingerprint.weights_fingerprint``, which serving checks
    (PEFT and vLLM ignore it; a new key in adapter_config.json would make PEFT warn that it is out of date).
    A new directory is built under a temporary sibling name and renamed, so a crash never leaves half an adapter;
    into an existing one (a checkpoint being assembled) each file is written to a temporary name and renamed. One
    that holds an adapter's files already is refused (FileExistsError) unless ``overwrite``: they may not be ours."""
    from cookmind.model.fingerprint import weights_fingerprint

    directory = Path(directory)
    cfg = getattr(model, "lora_config", None)
    if cfg is None or not has_lora(model):
        raise ValueError("save_adapter: the model has no LoRA adapters (call apply_lora first)")
    tensors = {PEFT_PREFIX + k: v.detach().contiguous().cpu() for k, v in lora_state_dict(model).items()}
    peft_cfg = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": cfg["r"],
        "lora_alpha": cfg["alpha"],
        "lora_dropout": cfg["dropout"],
        "target_modules": list(cfg["targets"]),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "base_model_name_or_path": base_model_path,
    }
    metadata = {"format": "pt"}
    if (fingerprint := weights_fingerprint(model)) is not None:
        metadata[BASE_FINGERPRINT] = json.dumps(fingerprint)
    if directory.is_dir():
        there = [n for n in (ADAPTER_WEIGHTS, ADAPTER_CONFIG) if (directory / n).exists()]
        if there and not overwrite:
            raise FileExistsError(
                f"{directory}: holds an adapter already ({', '.join(there)}); choose another folder, or pass "
                "overwrite=True to replace it"
            )
        _write_adapter_files(directory, tensors, metadata, peft_cfg)
        return directory
    with building_dir(directory) as tmp:
        _write_adapter_files(tmp, tensors, metadata, peft_cfg)
    return directory


def _write_adapter_files(directory: Path, tensors: dict, metadata: dict[str, str], peft_cfg: dict) -> None:
    """Write each file under a temporary name inside `directory`, then rename it into place."""
    with temp_path(directory / ADAPTER_WEIGHTS) as tmp:
        save_safetensors(tensors, tmp, metadata=metadata)
    write_json(directory / ADAPTER_CONFIG, peft_cfg, indent=2)


def adapter_base(directory: str | os.PathLike) -> tuple[str | None, dict | None]:
    """What an adapter records of the base it was trained on: its name (adapter_config.json's
    base_model_name_or_path, or a LoRA run's train.init_from) and weights fingerprint (``save_adapter``); None for
    what it does not record (PEFT's adapters and cookmind's older ones have no fingerprint)."""
    directory = Path(directory)
    name = fingerprint = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        name = json.loads((directory / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        name = name or json.loads((directory / "meta.json").read_text())["config"]["train"]["init_from"]
    if (directory / ADAPTER_WEIGHTS).is_file():
        with safe_open(directory / ADAPTER_WEIGHTS, "pt") as f:
            fingerprint = json.loads((f.metadata() or {}).get(BASE_FINGERPRINT) or "null")
    else:  # a sharded LoRA checkpoint: its meta.json records the base (sharded_checkpoint.save)
        from cookmind.model.model_io import BASE_FINGERPRINT_KEY

        with contextlib.suppress(OSError, ValueError, AttributeError):
            fingerprint = json.loads((directory / "meta.json").read_text()).get(BASE_FINGERPRINT_KEY)
    return name, fingerprint


def read_adapter_config(directory: str | os.PathLike) -> dict:
    """What a PEFT ``adapter_config.json`` says about the adapter's weights: r, alpha, dropout, targets (a list of
    module names, or PEFT's regex string), use_rslora, layers_to_transform and ``scaling`` (alpha / r, or
    alpha / sqrt(r) with rsLoRA). Refuses what a plain low-rank update cannot express (a trained bias, DoRA,
    modules_to_save, per-module rank or alpha patterns, fan_in_fan_out) with the field named."""
    f = Path(directory) / ADAPTER_CONFIG
    if not f.is_file() and (sharded := _sharded_lora_settings(directory)) is not None:
        r, alpha = int(sharded["r"]), float(sharded["alpha"])
        targets = sorted(sharded["targets"])
        return {  # LoRALinear's: alpha / r on every targeted module
            "r": r,
            "alpha": alpha,
            "dropout": 0.0,
            "targets": targets,
            "use_rslora": False,
            "layers_to_transform": None,
            "scaling": alpha / r,
        }
    if not f.is_file():
        raise FileNotFoundError(f"{f}: missing; {directory} holds no LoRA adapter")
    c = json.loads(f.read_text())
    if c.get("peft_type") != "LORA":
        raise ValueError(f"{f}: peft_type is {c.get('peft_type')!r}, only LORA adapters are supported")
    refused = {
        "bias": c.get("bias", "none") not in (None, "none"),
        "use_dora": bool(c.get("use_dora")),
        "modules_to_save": bool(c.get("modules_to_save")),
        "rank_pattern": bool(c.get("rank_pattern")),
        "alpha_pattern": bool(c.get("alpha_pattern")),
        "fan_in_fan_out": bool(c.get("fan_in_fan_out")),
    }
    for field, bad in refused.items():
        if bad:
            raise ValueError(
                f"{f}: {field} is {c[field]!r}; only plain LoRA (bias 'none', no DoRA, no modules_to_save, one rank "
                "and alpha for every module) is supported: merge it into its base (peft's merge_and_unload) instead"
            )
    targets = c.get("target_modules")
    if not targets:
        raise ValueError(f"{f}: target_modules is empty; the adapter names no module")
    targets = targets if isinstance(targets, str) else sorted(targets)
    r, alpha, rslora = int(c["r"]), float(c["lora_alpha"]), bool(c.get("use_rslora", False))
    layers = c.get("layers_to_transform")
    return {
        "r": r,
        "alpha": alpha,
        "dropout": float(c.get("lora_dropout") or 0.0),  # training only
        "targets": targets,
        "use_rslora": rslora,
        "layers_to_transform": [layers] if isinstance(layers, int) else layers,
        "scaling": alpha / math.sqrt(r) if rslora else alpha / r,
    }


def _sharded_lora_settings(directory: str | os.PathLike) -> dict | None:
    """The ``lora`` settings (r, alpha, targets) of a LoRA run's sharded checkpoint, whose ``dcp/`` holds the adapter
    only and no PEFT files (``cookmind.train.sharded_checkpoint``), from its meta.json; None for anything else."""
    from cookmind.model.sharded_layout import is_sharded_checkpoint

    if not is_sharded_checkpoint(directory):
        return None
    try:
        lora = json.loads((Path(directory) / "meta.json").read_text())["config"]["lora"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return lora if isinstance(lora, dict) and lora.get("enabled") else None


def read_adapter_tensors(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The adapter's tensors named as in the model (``model.layers.0.self_attn.q_proj.lora_A.weight``): PEFT's
    ``base_model.model.`` prefix and adapter name (``lora_A.default.weight``) taken off."""
    f = Path(directory) / ADAPTER_WEIGHTS
    if not f.is_file() and _sharded_lora_settings(directory) is not None:
        from cookmind.model.sharded_io import read_sharded_weights  # DCP, imported only for a sharded checkpoint

        return read_sharded_weights(directory)  # a LoRA run's dcp/ holds its adapter only, named as in the model
    if not f.is_file():
        raise FileNotFoundError(f"{f}: missing; {directory} holds no LoRA adapter weights")
    from cookmind.model.model_io import OPTIMIZER_NAME, WEIGHTS_NAME, verify_checksums

    verify_checksums(directory, skip=(WEIGHTS_NAME, OPTIMIZER_NAME))  # a training checkpoint's adapter, as saved
    saved = {k[len(PEFT_PREFIX) :] if k.startswith(PEFT_PREFIX) else k: v for k, v in load_file(str(f)).items()}
    return {k.replace(".default.", "."): v for k, v in saved.items()}


def load_adapter(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Load an adapter into ``model``: wraps the targets first if the model has no adapters yet."""
    directory = Path(directory)
    if not has_lora(model):
        c = read_adapter_config(directory)
        if isinstance(c["targets"], str) or c["use_rslora"] or c["layers_to_transform"] is not None:
            raise ValueError(
                f"{directory / ADAPTER_CONFIG}: a regex target_modules, use_rslora or layers_to_transform cannot be "
                "trained further here (LoRALinear scales by alpha / r on every named module); serve it with "
                "`cookmind serve --lora` or merge it"
            )
        apply_lora(model, c["r"], c["alpha"], c["dropout"], c["targets"])
    own = lora_state_dict(model)
    with torch.no_grad():
        for k, v in adapter_tensors_for(model, directory).items():
            own[k].copy_(v)
    return model


def adapter_tensors_for(model: nn.Module, directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The adapter's whole tensors named as in ``model`` (which has its LoRA layers), checked against them: the
    same names and shapes. Shapes are the whole tensors' for an FSDP2-sharded model too (DTensors), whose resume
    from a full checkpoint keeps each rank's shard of these (``cookmind.train.sharded_checkpoint``)."""
    f = Path(directory) / ADAPTER_WEIGHTS
    saved = read_adapter_tensors(directory)
    own = lora_state_dict(model)
    if set(saved) != set(own):
        raise ValueError(
            f"{f}: adapter tensors do not match the model's LoRA layers (missing "
            f"{sorted(set(own) - set(saved))[:4]}, unexpected {sorted(set(saved) - set(own))[:4]})"
        )
    for k, v in saved.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{f}: {k} has shape {tuple(v.shape)}, the model expects {tuple(own[k].shape)}")
    return saved
