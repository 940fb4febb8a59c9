"""A model's weights in brief, to tell whether two models are the same: a few values sampled at fixed places of a
few of its matrices. A LoRA adapter records its base's (``lora.save_adapter``) and serving compares it with the base
it is given (``infer.loading.load_adapters``).

Values are compared within a tolerance, not hashed: the same weights in another dtype (``export --hf --dtype bf16``,
``serve --dtype float16``) or another folder are the same base, while a model of the same shape with other weights
(another fine-tune) is not.
"""

from __future__ import annotations

import torch
from torch import nn

TENSORS = 8  # matrices sampled, spread over the model's names in sorted order
VALUES = 16  # values sampled from each, evenly spaced in its flattened order
TOLERANCE = 0.01  # relative L2 distance: bf16/fp16 rounding moves each value by at most 2**-8, fine-tuning by more


def base_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as its base holds them: LoRA A/B left out, a merged LoRA update taken back out."""
    sd = {k: v for k, v in model.state_dict().items() if ".lora_A." not in k and ".lora_B." not in k}
    for name, m in model.named_modules():
        if getattr(m, "merged", False):  # a merged LoRALinear holds W + s B A
            sd[f"{name}.weight"] = m.weight.detach() - m.delta_weight().detach().to(m.weight.dtype)
    return sd


def weights_fingerprint(model: nn.Module, gather: bool = False) -> dict[str, dict] | None:
    """{name: {"shape", "values"}} for a few of the model's matrices; None when its weights are not plain tensors
    (an FSDP-sharded model's DTensors: each rank holds only a shard), unless ``gather``: then the picked ones are
    gathered whole (a collective: call it on every rank)."""
    sd = base_weights(model)
    names = sorted(k for k, v in sd.items() if v.dim() >= 2)
    picked = sorted({names[i * len(names) // TENSORS] for i in range(min(TENSORS, len(names)))})
    if any(type(sd[k]) is not torch.Tensor for k in picked):
        if not gather or not all(type(sd[k]) is torch.Tensor or hasattr(sd[k], "full_tensor") for k in picked):
            return None
        sd = {k: sd[k] if type(sd[k]) is torch.Tensor else sd[k].full_tensor() for k in picked}
    return {k: {"shape": list(sd[k].shape), "values": [float(f"{x:.6g}") for x in _sample(sd[k])]} for k in picked}


def fingerprint_mismatch(recorded: dict[str, dict], model: nn.Module) -> str | None:
    """The first recorded matrix whose shape or sampled values differ in ``model`` (values: by more than TOLERANCE,
    relative L2), or None when every one that ``model`` has matches."""
    sd = base_weights(model)
    now = {
        name: {"shape": list(t.shape), "values": _sample(t).tolist()}
        for name, t in sd.items()
        if name in recorded and type(t) is torch.Tensor  # named otherwise or quantized: nothing to compare
    }
    return fingerprints_differ(recorded, now)


def fingerprints_differ(recorded: dict[str, dict], now: dict[str, dict]) -> str | None:
    """The first matrix of fingerprint ``recorded`` whose shape or values differ in fingerprint ``now`` (values: by
    more than TOLERANCE, relative L2), or None when every one both hold matches."""
    for name, rec in sorted(recorded.items()):
        cur = now.get(name)
        if cur is None:
            continue
        if list(cur["shape"]) != list(rec["shape"]):
            return name
        then = torch.tensor(rec["values"], dtype=torch.float64)
        if (torch.tensor(cur["values"], dtype=torch.float64) - then).norm() > TOLERANCE * then.norm():
            return name
    return None


def _sample(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    # float32 places, as every recorded adapter took them; past 2**24 values the last can round to numel: clamp it
    places = torch.linspace(0, flat.numel() - 1, VALUES).round().long().clamp_(max=flat.numel() - 1)
    return flat[places.to(flat.device)].float().cpu()
