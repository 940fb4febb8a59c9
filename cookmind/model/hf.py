"""Hugging Face interop: export a CookMind model as Llama/Qwen2/Qwen3, import those back.

Weight names and the RoPE layout are already Hugging Face's, so both directions copy tensors by name;
only the config is translated. transformers >= 5 keeps RoPE settings in ``rope_parameters`` (theta inside);
older files use ``rope_theta`` + ``rope_scaling``; both are read, and export writes whatever the installed
transformers' config class expects.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from cookmind.atomic import building_dir, check_replaceable, refuse_nested
from cookmind.model.config import CookMindConfig
from cookmind.model.lm import CookMindLM
from cookmind.model.model_io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    ModelLoadError,
    _adapter_not_model,
    check_state_dict,
    latest_checkpoint,
    load_config,
    model_state_dict,
    read_model_weights,
    read_weights,
    write_safetensors,
)
from cookmind.tokenizer.files import TOKENIZER_FILES, copy_tokenizer_files

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
# the chat template's end of an assistant turn: cookmind's generate/chat/serve stop there too
TURN_END_TOKENS = ("<|im_end|>",)


class HFInteropError(ValueError):
    """A checkpoint cannot be translated to or from Hugging Face format; says what and why."""


def _expected_shapes(cfg: CookMindConfig) -> dict[str, torch.Tensor]:
    """State dict (tied lm_head left out) of a model of this config, on the meta device: shapes, no memory."""
    with torch.device("meta"):
        return model_state_dict(CookMindLM(cfg))


def is_hf_model_dir(path: str | os.PathLike) -> bool:
    """A Hugging Face model directory: its config.json names a model_type or architectures (ours names neither)."""
    cfg = Path(path) / CONFIG_NAME
    if not cfg.is_file():
        return False
    try:
        d = json.loads(cfg.read_text())
    except json.JSONDecodeError:
        return False
    return "model_type" in d or "architectures" in d


def hf_architecture(cfg: CookMindConfig) -> str:
    """The HF class a CookMind config exports as: Qwen3 with QK-norm, Qwen2 with q/k/v biases, else Llama."""
    if cfg.num_experts > 0:
        raise HFInteropError(
            "export --hf: mixture-of-experts models are not supported (num_experts="
            f"{cfg.num_experts}); export a dense model (num_experts=0)"
        )
    if cfg.qk_norm and cfg.attention_bias:
        raise HFInteropError(
            "export --hf: QK-norm together with q/k/v biases has no Hugging Face equivalent "
            "(Qwen3's attention_bias also adds an o_proj bias)"
        )
    if cfg.qk_norm:
        return "Qwen3ForCausalLM"
    if cfg.attention_bias:
        return "Qwen2ForCausalLM"
    return "LlamaForCausalLM"


def _rope_parameters(cfg: CookMindConfig) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if cfg.rope_scaling is not None:
        rs = {k: v for k, v in cfg.rope_scaling.items() if k != "type" and v is not None}
        params.update(rs)
        params["rope_type"] = cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type"))
    return params


def to_hf_config(cfg: CookMindConfig, dtype: torch.dtype = torch.float32):
    """A transformers config object equivalent to `cfg` (class chosen by hf_architecture)."""
    import transformers

    arch = hf_architecture(cfg)
    eos = None if cfg.eos_token_id is None else eos_ids(cfg.eos_token_id)
    config_cls = {
        "LlamaForCausalLM": transformers.LlamaConfig,
        "Qwen2ForCausalLM": transformers.Qwen2Config,
        "Qwen3ForCausalLM": transformers.Qwen3Config,
    }[arch]
    kwargs: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.resolved_head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        initializer_range=cfg.initializer_range,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=eos[0] if eos and len(eos) == 1 else eos,  # an int when there is one, as config.json has it
        pad_token_id=cfg.pad_token_id,
        architectures=[arch],
    )
    if arch == "LlamaForCausalLM":
        kwargs.update(attention_bias=False, mlp_bias=False)
    if arch == "Qwen3ForCausalLM":
        kwargs.update(attention_bias=False)
    if arch != "LlamaForCausalLM":
        kwargs.update(use_sliding_window=False)
    rope = _rope_parameters(cfg)
    if "rope_parameters" in config_cls().to_dict():  # transformers >= 5
        kwargs["rope_parameters"] = rope
    else:  # transformers 4.x: theta beside a rope_scaling dict
        kwargs["rope_theta"] = rope.pop("rope_theta")
        kwargs["rope_scaling"] = None if rope["rope_type"] == "default" else rope
    hf = config_cls(**kwargs)
    if "dtype" in hf.to_dict():  # transformers 5 renamed torch_dtype
        hf.dtype = dtype
    else:
        hf.torch_dtype = dtype
    return hf


def _added_token_ids(folder: Path, names: tuple[str, ...]) -> list[int]:
    """Ids of the added (special) tokens ``names`` in ``folder/tokenizer.json``, in that order; [] without one."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return []
    try:
        added = {t["content"]: int(t["id"]) for t in json.loads(path.read_text()).get("added_tokens", [])}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HFInteropError(f"{path}: not a readable tokenizer.json ({exc}); re-save the tokenizer") from None
    return [added[n] for n in names if n in added]


# what marks a folder as export's or import's own output: --overwrite replaces only such a folder (a downloaded
# Hugging Face model or a cookmind model of the same files was replaced too)
EXPORT_MARK, IMPORT_MARK = ".cookmind-export.json", ".cookmind-import.json"


def _own_file(name: str) -> bool:
    """A file export and import write: the config, the weights, a tokenizer's files and their mark."""
    return name in (CONFIG_NAME, WEIGHTS_NAME, *TOKENIZER_FILES, EXPORT_MARK, IMPORT_MARK)


def _is_cookmind_model_dir(path: Path) -> bool:
    return (path / CONFIG_NAME).is_file() and (path / WEIGHTS_NAME).is_file() and not is_hf_model_dir(path)


def _an_export(path: Path) -> bool:
    return is_hf_model_dir(path) and (path / EXPORT_MARK).is_file()


def _an_import(path: Path) -> bool:
    return _is_cookmind_model_dir(path) and (path / IMPORT_MARK).is_file()


def _mark(folder: Path, mark: str, command: str, source: Path) -> None:
    (folder / mark).write_text(json.dumps({"written_by": command, "source": str(source)}) + "\n")


def _check_out(out: Path, overwrite: bool, is_ours, what: str, src: Path, command: str, suffix: str) -> None:
    """Refuse ``out`` before any work unless it is absent, or ``overwrite`` and a ``what`` holding only its files;
    never in a run's checkpoints folder, where training prunes it or takes it for the run's newest checkpoint, nor
    inside ``src``, the folder ``command`` reads, or around it (``<src>-<suffix>`` is offered instead)."""
    from cookmind.run_layout import refuse_output_in_checkpoints

    refuse_output_in_checkpoints(out, error=HFInteropError)
    try:
        refuse_nested(src, out, f"the folder {command} reads", suffix=suffix)
    except ValueError as exc:
        raise HFInteropError(str(exc)) from None
    try:
        check_replaceable(out, overwrite, is_ours, what, _own_file)
    except FileExistsError as exc:
        raise HFInteropError(str(exc)) from None


def _atomic_dir(out: Path, fill, overwrite: bool, is_ours, what: str) -> Path:
    """Build `out` under a temporary sibling name with fill(tmp), then rename it into place (replacing, with
    ``overwrite``, only a ``what`` holding nothing but its own files)."""
    try:
        with building_dir(out, replace=overwrite, is_ours=is_ours, what=what, own_file=_own_file) as tmp:
            fill(tmp)
    except FileExistsError as exc:
        raise HFInteropError(str(exc)) from None
    return out


def export_hf(
    ckpt_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write `out_dir` with config.json + model.safetensors (+ tokenizer files found in `ckpt_dir`).

    The result loads strictly with transformers.AutoModelForCausalLM.from_pretrained(out_dir).
    dtype=None keeps the checkpoint's dtype; ``overwrite`` replaces an earlier export (nothing else); ``progress``
    shows the weights being read (a sharded checkpoint's) and written (``write_safetensors``).
    """
    ckpt_dir, out_dir = Path(ckpt_dir), Path(out_dir)
    if is_hf_model_dir(ckpt_dir):
        arch = (json.loads((ckpt_dir / CONFIG_NAME).read_text()).get("architectures") or ["?"])[0]
        raise ModelLoadError(
            f"{ckpt_dir}: already a Hugging Face model folder ({arch}); it needs no export (generate, serve and eval "
            "take it as is; import --hf makes a cookmind model of it)"
        )
    cfg = load_config(ckpt_dir)
    arch = hf_architecture(cfg)
    _check_out(out_dir, overwrite, _an_export, "folder export --hf wrote", ckpt_dir, "export --hf", "hf")
    tokenizer_files = [name for name in TOKENIZER_FILES if (ckpt_dir / name).is_file()]  # before it may go
    # model.safetensors, or a sharded checkpoint's dcp/
    weights_path, tensors = read_model_weights(ckpt_dir, cfg, progress=progress)
    check_state_dict(weights_path, _expected_shapes(cfg), tensors)
    file_dtype = dtype or next(iter(tensors.values())).dtype  # each tensor cast as it is written
    hf_config = to_hf_config(cfg, file_dtype)

    def fill(tmp: Path) -> None:
        hf_config.save_pretrained(tmp)
        write_safetensors(tensors, tmp / WEIGHTS_NAME, metadata={"format": "pt"}, progress=progress, dtype=dtype)
        try:
            copied = copy_tokenizer_files(ckpt_dir, tmp)
        except FileNotFoundError:
            copied = None
        if copied is None or not ckpt_dir.is_dir() or set(tokenizer_files) - set(copied):
            # a running training's checkpoint.keep_last deleted it: the export went out without its tokenizer
            raise HFInteropError(
                f"{ckpt_dir}: deleted while export read it (a running training removes checkpoints past "
                "checkpoint.keep_last); nothing was written: export again (a run directory gives its newest checkpoint)"
            )
        if "tokenizer_config.json" in copied:
            _set_model_max_length(tmp / "tokenizer_config.json", cfg.max_position_embeddings)
        if "generation_config.json" not in copied and cfg.eos_token_id is not None:
            # lets HF generate / vLLM stop where cookmind does (end of text, and end of a chat turn) without flags
            gen = {
                k: getattr(cfg, k)
                for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                if getattr(cfg, k) is not None
            }
            eos = eos_ids(cfg.eos_token_id)
            stops = eos + [i for i in _added_token_ids(tmp, TURN_END_TOKENS) if i not in eos]
            if len(stops) > 1:
                gen["eos_token_id"] = stops  # one flat list, as transformers reads it
            (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        _mark(tmp, EXPORT_MARK, "cookmind export --hf", ckpt_dir)

    _atomic_dir(out_dir, fill, overwrite, _an_export, "folder export --hf wrote")
    assert json.loads((out_dir / CONFIG_NAME).read_text())["architectures"] == [arch]
    return out_dir


def _set_model_max_length(path: Path, context: int) -> None:
    """Make the model's context the model_max_length of the tokenizer_config.json at ``path`` (where transformers
    truncates, and warns of longer texts); a tokenizer saved alone says 1,000,000 (ours) or 1e30 (transformers')."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))  # a copied tokenizer_config.json: a BOM is no text
        doc["model_max_length"] = context
    except (ValueError, TypeError) as exc:
        raise HFInteropError(f"{path}: not a JSON object ({exc}); re-save the tokenizer") from None
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _rope_from_hf(d: dict[str, Any], path: Path) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either the 5.x rope_parameters dict or 4.x rope_theta/rope_scaling."""
    params = dict(d.get("rope_parameters") or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise HFInteropError(f"{path}: per-layer-type rope_parameters {sorted(params)} are not supported")
    legacy = d.get("rope_scaling") or {}
    merged = {**legacy, **params}
    theta = merged.pop("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = merged.pop("rope_type", merged.pop("type", "default"))
    merged.pop("type", None)
    if merged.pop("partial_rotary_factor", 1.0) not in (1, 1.0, None):
        raise HFInteropError(f"{path}: partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return float(theta), None
    if rope_type in ("yarn", "llama3"):
        merged.setdefault(
            "original_max_position_embeddings", d.get("original_max_position_embeddings", d["max_position_embeddings"])
        )
    if rope_type in ("yarn", "llama3", "linear"):
        try:
            CookMindConfig._validate_rope_scaling({"rope_type": rope_type, **merged})
        except ValueError as exc:
            raise HFInteropError(f"{path}: {exc}") from exc
        return float(theta), {"rope_type": rope_type, **merged}
    raise HFInteropError(
        f"{path}: rope type {rope_type!r} is not supported (supported: default, linear, "
        "llama3, yarn); "
        "importing it would silently change the model's positions"
    )


# What transformers' config classes (LlamaConfig, Qwen2Config, Qwen3Config; 4.x and 5.x alike) take for a key a
# config.json leaves out, where that is not what cookmind would derive: Qwen2/Qwen3 take 32 key/value heads (not
# num_attention_heads) and Qwen3 a head_dim of 128 (not hidden_size // num_attention_heads); Llama derives both.
ABSENT_DEFAULTS: dict[str, dict[str, int]] = {
    "llama": {},
    "qwen2": {"num_key_value_heads": 32},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128},
}


def from_hf_config(d: dict[str, Any], path: Path) -> CookMindConfig:
    """Translate a HF Llama/Qwen2/Qwen3 config.json dict into a CookMindConfig; unsupported options raise."""
    archs = d.get("architectures") or []
    arch = archs[0] if archs else None
    family = (
        SUPPORTED_ARCHITECTURES.get(arch)
        if arch
        else {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(d.get("model_type"))
    )
    if family is None:
        raise HFInteropError(
            f"{path}: architecture {arch or d.get('model_type')!r} is not supported; "
            f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    if d.get("hidden_act", "silu") != "silu":
        raise HFInteropError(f"{path}: hidden_act={d['hidden_act']!r} is not supported (only silu / SwiGLU)")
    if d.get("mlp_bias"):
        raise HFInteropError(f"{path}: mlp_bias=true is not supported")
    if d.get("use_sliding_window"):
        raise HFInteropError(f"{path}: use_sliding_window=true is not supported (CookMind attends globally)")
    if family in ("llama", "qwen3") and d.get("attention_bias"):
        raise HFInteropError(f"{path}: attention_bias=true ({family} puts a bias on o_proj too) is not supported")
    if d.get("pretraining_tp", 1) not in (1, None):
        raise HFInteropError(f"{path}: pretraining_tp={d['pretraining_tp']} is not supported")
    theta, rope_scaling = _rope_from_hf(d, path)
    heads = d["num_attention_heads"]
    absent = ABSENT_DEFAULTS[family]  # a key left out of config.json means what transformers' config class says
    kv_heads = d["num_key_value_heads"] if "num_key_value_heads" in d else absent.get("num_key_value_heads")
    head_dim = d["head_dim"] if "head_dim" in d else absent.get("head_dim")
    kv_heads, head_dim = kv_heads or heads, head_dim or d["hidden_size"] // heads  # null: derived, as there
    try:
        return CookMindConfig(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=None if head_dim * heads == d["hidden_size"] else head_dim,
            max_position_embeddings=d["max_position_embeddings"],
            rope_theta=theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            attention_bias=family == "qwen2",
            initializer_range=d.get("initializer_range", 0.02),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
        )
    except (KeyError, ValueError) as exc:
        raise HFInteropError(f"{path}: cannot translate to a CookMind config: {exc}") from exc


def _read_hf_weights(hf_dir: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the file named in errors, the weights): model.safetensors when there is one (transformers reads it before
    an index, so a stale index beside it is ignored as there), else the shards model.safetensors.index.json names
    (mapped, not read: ``read_weights``)."""
    index = hf_dir / "model.safetensors.index.json"
    if not (hf_dir / WEIGHTS_NAME).is_file() and index.is_file():
        return index, {k: v for shard in _index_shards(index) for k, v in read_weights(hf_dir / shard).items()}
    if not (hf_dir / WEIGHTS_NAME).is_file() and any(hf_dir.glob("*.bin")):
        raise HFInteropError(
            f"{hf_dir}: only pickle .bin weights found; convert to safetensors first "
            "(cookmind never unpickles untrusted files)"
        )
    return hf_dir / WEIGHTS_NAME, read_weights(hf_dir / WEIGHTS_NAME)


def _index_shards(index: Path) -> list[str]:
    """The shard file names a model.safetensors.index.json maps its tensors to, each a file beside it."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as exc:
        raise HFInteropError(f"{index}: not valid JSON ({exc}); re-save the model or restore the file") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise HFInteropError(f"{index}: no weight_map (tensor name -> shard file); re-save the model")
    shards = sorted(set(map(str, weight_map.values())))
    for shard in shards:
        if Path(shard).name != shard or shard in (".", ".."):
            raise HFInteropError(f"{index}: shard {shard!r} is not a file name in the folder; re-save the model")
    return shards


def _with_generation_eos(cfg: CookMindConfig, hf_dir: Path) -> CookMindConfig:
    """``cfg`` ending generation where transformers' generate does: generation_config.json's eos ids join
    config.json's (Llama 3 Instruct's <|eot_id|>)."""
    path = hf_dir / "generation_config.json"
    try:
        eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    except (OSError, ValueError, AttributeError) as exc:
        raise HFInteropError(f"{path}: not valid JSON ({exc}); re-save the model or remove the file") from None
    have = [] if cfg.eos_token_id is None else list(eos_ids(cfg.eos_token_id))
    extra = [i for i in ([] if eos is None else eos_ids(eos)) if i not in have]
    return dataclasses.replace(cfg, eos_token_id=have + extra) if extra else cfg


def eos_ids(value) -> list[int]:
    """An eos_token_id field (an int or a list of ints) as a list."""
    return [int(value)] if isinstance(value, int) else [int(i) for i in value]


def import_hf(
    hf_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Convert a HF Llama/Qwen2/Qwen3 directory into a CookMind model directory (+ its tokenizer files);
    ``overwrite`` replaces an earlier import (nothing else); ``progress`` shows the weights being written."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config_path = hf_dir / CONFIG_NAME
    if not hf_dir.is_dir():
        what = "a file, not a Hugging Face model folder" if hf_dir.exists() else "no such folder"
        raise ModelLoadError(f"{hf_dir}: {what}; import --hf reads a folder holding config.json and the weights")
    if config_path.is_file():
        try:
            json.loads(config_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # it was taken for a cookmind model
            raise ModelLoadError(f"{config_path}: not valid JSON ({exc}); the file is truncated or corrupt") from None
    if not is_hf_model_dir(hf_dir) and latest_checkpoint(hf_dir) is not None:
        raise ModelLoadError(
            f"{hf_dir}: a cookmind model, not a Hugging Face folder; it needs no import (generate, serve and eval "
            "take it as is; export --hf makes a Hugging Face folder of it)"
        )
    if not config_path.is_file() and (hf_dir / "adapter_config.json").is_file():  # as generate and serve say it
        raise ModelLoadError(_adapter_not_model(hf_dir))
    if not config_path.is_file():
        raise ModelLoadError(f"{config_path}: missing; a Hugging Face model directory needs config.json")
    cfg = from_hf_config(json.loads(config_path.read_text()), config_path)  # generation_config.json is copied along
    _check_out(out_dir, overwrite, _an_import, "folder import --hf wrote", hf_dir, "import --hf", "import")
    weights_path, tensors = _read_hf_weights(hf_dir)
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
    for name in [k for k in tensors if k.endswith("rotary_emb.inv_freq")]:
        # transformers < 4.31 saved each layer's RoPE frequencies, which follow from the config; transformers leaves
        # them out on load, as here (they were "unexpected tensors", and the model refused)
        del tensors[name]
    check_state_dict(weights_path, _expected_shapes(cfg), tensors)

    def fill(tmp: Path) -> None:
        (tmp / CONFIG_NAME).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        write_safetensors(tensors, tmp / WEIGHTS_NAME, metadata={"format": "pt"}, progress=progress, dtype=dtype)
        copy_tokenizer_files(hf_dir, tmp)
        _mark(tmp, IMPORT_MARK, "cookmind import --hf", hf_dir)

    return _atomic_dir(out_dir, fill, overwrite, _an_import, "folder import --hf wrote")


def load_model_or_hf(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = False,
) -> CookMindLM:
    """A CookMindLM from a cookmind model directory or a Hugging Face Llama/Qwen folder (imported on the way), its
    config's eos ids joined by those of the folder's generation_config.json (``_with_generation_eos``). ``progress``:
    ``load_model``'s bars."""
    from cookmind.model.model_io import load_model

    if not is_hf_model_dir(path):
        model = load_model(path, device=device, dtype=dtype, progress=progress)
    else:
        with tempfile.TemporaryDirectory(prefix="cookmind-import-") as tmp:
            import_hf(path, Path(tmp) / "model")
            model = load_model(Path(tmp) / "model", device=device, dtype=dtype)
    model.config = _with_generation_eos(model.config, Path(path))
    return model
