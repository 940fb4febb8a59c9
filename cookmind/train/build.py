"""Build the parts of a run from its config: model (+ LoRA), objective, datasets, optimizer.

Kept apart from the loop so a caller (the demo, a test, GRPO) can pass any part ready-made.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cookmind.cli import not_global_rank_zero
from cookmind.model.model_io import resolve_model_dir
from cookmind.tokenizer.documents import tokenizer_identity
from cookmind.train.config import TrainConfig, setting
from cookmind.train.objectives import DPOObjective, Objective, PretrainObjective, SFTObjective

# Objectives that live above the train package register a factory here (or are imported lazily):
# name -> module exposing ``build_objective(cfg: TrainConfig, trainer) -> Objective``.
OBJECTIVE_PLUGINS: dict[str, str] = {"grpo": "cookmind.align.objective"}
_FACTORIES: dict[str, Callable[[TrainConfig, Any], Objective]] = {}


def register_objective(name: str, factory: Callable[[TrainConfig, Any], Objective]) -> None:
    """Make ``train.objective: name`` build its objective with ``factory(cfg, trainer)``."""
    _FACTORIES[name] = factory


def load_tokenizer(path: str | None):
    """The run's tokenizer (ours, or a Hugging Face one read through transformers) or None."""
    if not path:
        return None
    from cookmind.tokenizer.hf_adapter import load_tokenizer

    return load_tokenizer(path)


def build_model(cfg: TrainConfig, tokenizer=None, progress: bool = False) -> torch.nn.Module:
    """A fresh CookMindLM from ``cfg.model``, or the weights at ``train.init_from``; LoRA applied if enabled.
    ``progress``: bars of the checks of the loaded weights' SHA-256s (rank 0's)."""
    from cookmind.model import CookMindConfig, CookMindLM

    if cfg.train.init_from:
        model = _load_weights("train.init_from", cfg.train.init_from, "cpu", progress)
        if cfg.model:
            from cookmind.model.lm import RUNTIME_OPTIONS

            # a preset's shape (the default tiny-cpu's) gives way to the loaded model's: only values the user set
            # (their YAML, an override) can contradict it, and those are refused
            differs = {
                k: v
                for k, v in cfg.model.items()
                if k not in RUNTIME_OPTIONS and getattr(model.config, k, None) != v and cfg.is_user_set(f"model.{k}")
            }
            if differs:
                raise ValueError(
                    f"model settings {differs} differ from the model at "
                    f"{setting('train.init_from', cfg.train.init_from)}; drop them from the config (the loaded model "
                    f"fixes its shape; only {', '.join(RUNTIME_OPTIONS)} may change)"
                )
            runtime = {k: v for k, v in cfg.model.items() if k in RUNTIME_OPTIONS}
            if runtime:
                model.set_runtime_options(**runtime)
            # the run's config.yaml (and a resume from it) records the shape that trained, not the preset's
            shape = {k: getattr(model.config, k) for k in cfg.model if k not in RUNTIME_OPTIONS}
            replaced = {k: v for k, v in shape.items() if cfg.model[k] != v}
            if replaced and not not_global_rank_zero():
                print(
                    f"cookmind train: the model's shape comes from {setting('train.init_from', cfg.train.init_from)}: "
                    + ", ".join(f"{k} {v} (the preset said {cfg.model[k]})" for k, v in replaced.items()),
                    file=sys.stderr,
                )
            cfg.model.update(shape)
    else:
        if cfg.lora.enabled:  # it trained adapters on a random frozen base (and DPO took that base as reference)
            raise ValueError(
                "lora.enabled=true adapts a trained model, and train.init_from is not set: the frozen base would be "
                "random weights; pass --init-from MODEL (a checkpoint, a run directory or a Hugging Face folder)"
            )
        fields = dict(cfg.model)
        if "vocab_size" not in fields:
            if tokenizer is None and not cfg.data.train_path and not (cfg.grpo or {}).get("problems"):
                raise ValueError(  # a new user's bare `cookmind train`: the data is what is missing
                    "no training data: pass --train-data STORE (data.train_path), a token store that `cookmind pack` "
                    "made (it names its tokenizer, which sizes the model's vocabulary)"
                )
            if tokenizer is None:
                raise ValueError(
                    "model.vocab_size is not set and there is no tokenizer to take it from: pass --tokenizer DIR "
                    "(data.tokenizer), or set model.vocab_size"
                )
            fields["vocab_size"] = tokenizer.vocab_size
        if tokenizer is not None:
            fields.setdefault("eos_token_id", tokenizer.eos_id)
            fields.setdefault("pad_token_id", tokenizer.pad_id)
            if len(tokenizer.bos_ids) == 1:  # the BOS pack opens each document with (Llama's <s>)
                fields.setdefault("bos_token_id", tokenizer.bos_ids[0])
        model = CookMindLM(CookMindConfig.from_dict(fields))
    if cfg.lora.enabled:
        from cookmind.model.lora import apply_lora

        apply_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.targets)
    return model


def lora_base(cfg: TrainConfig, progress: bool = False) -> str | None:
    """The model a LoRA run adapts, for its adapter_config.json's ``base_model_name_or_path``: the folder
    ``train.init_from`` loaded (a run's newest checkpoint then, a Hugging Face folder as it is), made absolute so the
    adapter names it from anywhere; None without ``train.init_from``. ``progress``: a bar of the check of a run's
    newest checkpoint's SHA-256s."""
    if not cfg.train.init_from:
        return None
    return str(Path(resolve_model_dir(cfg.train.init_from, progress=progress)).absolute())


def _load_weights(field: str, path: str, device: str, progress: bool = False):
    """The model at a config path (a checkpoint, a run's newest checkpoint or a Hugging Face folder) through the one
    loader; errors name the config field."""
    from cookmind.infer.loading import load_model_dir
    from cookmind.model.model_io import ModelLoadError

    try:
        return load_model_dir(path, device=device, progress=progress)
    except (FileNotFoundError, ModelLoadError) as exc:
        raise type(exc)(f"{field}={path}: {exc}") from exc


def build_objective(cfg: TrainConfig, trainer: Any) -> Objective:
    """The objective named by ``train.objective``."""
    name = cfg.train.objective
    if name == "pretrain":
        return PretrainObjective()
    if name == "sft":
        return SFTObjective()
    if name == "dpo":
        d = cfg.dpo
        if d.reference is None and cfg.lora.enabled:
            from cookmind.model.lora import adapters_disabled

            return DPOObjective(
                d.beta,
                d.reduction,
                d.loss,
                d.label_smoothing,
                reference_context=adapters_disabled,
                nll_weight=d.nll_weight,
            )
        if d.reference in ("none", "copy", "base") and not Path(d.reference).exists():  # grpo.reference's words
            raise ValueError(
                f"dpo.reference={d.reference}: no such model folder; dpo.reference names a model (a checkpoint, a run "
                "or a Hugging Face folder), not grpo.reference's none/copy/base: leave it out for a frozen copy of "
                "the train.init_from model (under lora.enabled=true, that model with its adapters off)"
            )
        ref_path = d.reference or cfg.train.init_from
        if ref_path is None:
            raise ValueError(
                f"DPO needs a frozen reference: set dpo.reference or {setting('train.init_from')} (or use LoRA, whose "
                "base model is the reference)"
            )
        where = "cpu" if cfg.parallel.fsdp else str(trainer.device)  # FSDP: sharding moves each rank's shards
        field = "dpo.reference" if d.reference else "train.init_from"
        progress = cfg.logging.progress and trainer.dist.is_main
        ref = _load_weights(field, ref_path, where, progress).eval()
        ref.requires_grad_(False)
        # one that carries no tokenizer to check (a Hugging Face folder) may still have another vocabulary
        ours = getattr(getattr(trainer.bare_model, "config", None), "vocab_size", None)
        theirs = getattr(getattr(ref, "config", None), "vocab_size", None)
        if ours is not None and theirs is not None and ours != theirs:
            raise ValueError(
                f"{field}={ref_path} has {theirs} token ids and the model being trained {ours}: a DPO reference "
                "scores the pairs' ids with the run's tokenizer; give one trained with it (or leave dpo.reference "
                "out: the reference is then the model at train.init_from)"
            )
        if cfg.parallel.fsdp:  # sharded like the policy; every rank runs its forwards together with the policy's
            from cookmind.parallel import shard_frozen

            shard_frozen(ref, cfg)
        return DPOObjective(d.beta, d.reduction, d.loss, d.label_smoothing, reference=ref, nll_weight=d.nll_weight)
    if name not in _FACTORIES and name in OBJECTIVE_PLUGINS:
        module = importlib.import_module(OBJECTIVE_PLUGINS[name])
        _FACTORIES[name] = module.build_objective
    if name in _FACTORIES:
        return _FACTORIES[name](cfg, trainer)
    known = ", ".join(["pretrain", "sft", "dpo", *OBJECTIVE_PLUGINS])
    raise ValueError(f"unknown {setting('train.objective')} {name!r}; known: {known}")


def build_dataset(cfg: TrainConfig, path: str, train_type: str, tokenizer=None, key: str | None = None):
    """A dataset over the store at ``path`` for ``train_type``; a store packed by another tokenizer than
    ``tokenizer`` (the run's) is refused, naming both. ``key`` (``data.val_path``) is the setting that gave ``path``:
    a refusal names it and its flag first."""
    from cookmind.data import DatasetFactory

    stride = cfg.data.stride if train_type == "seq" else None
    fingerprint, framing = tokenizer_identity(tokenizer)  # a store packed otherwise is refused
    return DatasetFactory.load(
        train_type,
        path,
        cfg.data.window_size,
        stride=stride,
        storage_type=cfg.data.storage_type,
        tokenizer_fingerprint=fingerprint,
        tokenizer_path=cfg.data.tokenizer,
        tokenizer_framing=framing,
        source=setting(key) if key else None,
    )


# the store each built-in objective reads: its class's ``train_type`` (grpo's class lives above this package)
STORE_TYPE_OF_OBJECTIVE = {
    "pretrain": PretrainObjective.train_type,
    "sft": SFTObjective.train_type,
    "dpo": DPOObjective.train_type,
    "grpo": "grpo",
}


def check_train_store(cfg: TrainConfig, objective: Objective | None = None) -> None:
    """Refuse, before anything is built, a missing training store or one of another kind than the run reads
    (``objective``'s, when the caller passed one, else ``train.objective``'s), naming the flag to change (it showed
    as a missing tokenizer, or a KeyError while sizing the window). GRPO has no validation loss: a
    ``data.val_path`` is refused, naming ``grpo.eval_problems`` (it crashed the run's last evaluation)."""
    reads = objective.train_type if objective is not None else STORE_TYPE_OF_OBJECTIVE.get(cfg.train.objective)
    if cfg.data.val_path and (cfg.data.train_type or reads) == "grpo":
        raise ValueError(
            f"--val-data {cfg.data.val_path}: GRPO has no validation loss to take on a store of prompts; its "
            "held-out check is grpo.eval_problems=FILE (JSON lines of question and answer, as `pack --train-type "
            "grpo` reads), graded greedily at every evaluation: pass that instead"
        )
    from cookmind.store import StoreError

    want = cfg.data.train_type or reads
    if cfg.data.train_path:
        store = open_store("data.train_path", cfg.data.train_path)  # a missing one: "no such store; make one ..."
        if want is not None and store.train_type != want:
            fits = {v: k for k, v in STORE_TYPE_OF_OBJECTIVE.items()}.get(store.train_type, store.train_type)
            if cfg.data.train_type:
                reader = f"data.train_type={cfg.data.train_type}"
            elif objective is not None:
                reader = f"the run's objective ({type(objective).__name__})"
            else:
                reader = setting("train.objective", cfg.train.objective)
            raise StoreError(
                f"{setting('data.train_path', cfg.data.train_path)} is a {store.train_type!r} store and {reader} "
                f"reads {want!r} stores: pass --objective {fits} to train on it, or pack a {want!r} store "
                f"(`cookmind pack --train-type {want}`)"
            )
    if cfg.data.val_path:  # checked here too: it was found only once the model was built, named as a bare path
        val = open_store("data.val_path", cfg.data.val_path)
        if want is not None and val.train_type != want:
            raise StoreError(
                f"{setting('data.val_path', cfg.data.val_path)} is a {val.train_type!r} store and the run trains on "
                f"{want!r} stores: validate on a {want!r} store (`cookmind pack --train-type {want} --val-fraction F "
                "--val-out VAL` splits one off the training input)"
            )


def open_store(key: str, path: str):
    """The token store at ``path``, the config ``key`` that named it (``data.val_path``) as its errors' first words:
    a missing or unreadable store says which flag gave it."""
    from cookmind.store import StoreError, TokenStore

    try:
        return TokenStore(path)
    except StoreError as exc:
        raise StoreError(f"{setting(key)}: {exc}") from exc


def window_for_store(path: str, train_type: str, max_positions: int) -> int:
    """A window that truncates nothing in the sft/dpo store at ``path``: its longest record, at most
    ``max_positions`` (the model's context)."""
    from cookmind.store import TokenStore

    store = TokenStore(path)
    keys = ("sequence",) if train_type == "sft" else ("chosen", "rejected")
    longest = max(int(store.lengths(k).max()) if len(store) else 1 for k in keys)
    return max(1, min(longest, max_positions))


def find_tokenizer(cfg: TrainConfig, progress: bool = False) -> str | None:
    """The tokenizer a run without ``data.tokenizer`` should use: the one a checkpoint at ``train.init_from``
    carries, else the one the training store recorded at pack time (when that folder still exists). ``progress``: a
    bar of the check of a run's newest checkpoint's SHA-256s (finding it reads its weights)."""
    import json

    if cfg.train.init_from:
        try:
            d = resolve_model_dir(cfg.train.init_from, progress=progress)
        except FileNotFoundError:
            d = None
        if d is not None and (d / "cookmind_tokenizer.json").is_file():
            return str(d)
    if cfg.data.train_path:
        meta = Path(cfg.data.train_path) / "meta.json"
        try:
            recorded = json.loads(meta.read_text()).get("tokenizer", {}).get("path")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded and Path(recorded).is_dir():
            return recorded
        if recorded:  # moved or deleted since pack: say so, not "no tokenizer to take model.vocab_size from"
            raise FileNotFoundError(
                f"{setting('data.train_path', cfg.data.train_path)}: its meta.json names the tokenizer it was packed "
                f"with, {recorded}, which is no longer there; pass --tokenizer DIR (that tokenizer, wherever it is now)"
            )
    return None


def check_init_tokenizer(cfg: TrainConfig, tokenizer, progress: bool = False) -> None:
    """Refuse to fine-tune a checkpoint (``train.init_from``) with another tokenizer than the one it carries, and a
    DPO reference (``dpo.reference``) that carries another one: it scored the pairs' ids as other text, or crashed
    at the first step with an IndexError from its smaller embedding. ``progress``: bars of the checks of a run's
    newest checkpoint's SHA-256s (finding it reads its weights)."""
    from cookmind.tokenizer.tokenizer import check_carried_tokenizer

    models = [("train.init_from", cfg.train.init_from, "drop --tokenizer to use the checkpoint's")]
    if cfg.train.objective == "dpo":
        models.append(
            (
                "dpo.reference",
                cfg.dpo.reference,
                "give a reference trained with the run's tokenizer (or leave "
                "dpo.reference out: the reference is then the model at train.init_from)",
            )
        )
    for field, path, hint in models:
        if not path:
            continue
        try:
            d = resolve_model_dir(path, progress=progress)
        except FileNotFoundError:
            continue  # build_model or build_objective reports it
        check_carried_tokenizer(
            d,
            tokenizer,
            model=setting(field, path),
            given=setting("data.tokenizer", cfg.data.tokenizer),
            hint=hint,
        )


def check_vocab(cfg: TrainConfig, model: torch.nn.Module, tokenizer=None) -> str | None:
    """Refuse a tokenizer or token store whose ids run past the model's embedding (an IndexError mid-step, a
    device-side assert on CUDA), and first a store packed by another tokenizer than ``tokenizer``; return a note
    when the model's vocabulary is larger than the data's (rows that never train: a preset's vocab_size kept with a
    smaller tokenizer of one's own), else None."""
    from cookmind.store import StoreError, TokenStore

    config = getattr(model, "config", None)
    n = getattr(config, "vocab_size", None)
    if n is None:
        return None
    where = f"the model at {setting('train.init_from')}" if cfg.train.init_from else "model.vocab_size"
    fix = (
        "use the tokenizer the model was trained with"
        if cfg.train.init_from
        else "set model.vocab_size to at least {v} (e.g. model.vocab_size={v}), or drop it to take the tokenizer's"
    )
    sources = []
    if tokenizer is not None and hasattr(tokenizer, "vocab_size"):
        sources.append((f"the tokenizer at {setting('data.tokenizer', cfg.data.tokenizer)}", int(tokenizer.vocab_size)))
    fingerprint, framing = tokenizer_identity(tokenizer)
    for field in ("train_path", "val_path"):
        path = getattr(cfg.data, field)
        if path and cfg.train.objective != "grpo":
            try:
                store = TokenStore(path)
            except Exception:  # noqa: BLE001 -- a missing or broken store is reported by build_dataset
                store = None
            packed = store.meta.get("vocab_size") if store is not None else None
            if tokenizer is not None and store is not None:
                # a store of another tokenizer is that, whatever its vocabulary: not a model.vocab_size to raise
                try:
                    store.check_tokenizer(fingerprint, cfg.data.tokenizer, framing)
                except StoreError as exc:  # which flag gave the store: --train-data or --val-data
                    raise StoreError(f"{setting(f'data.{field}')}: {exc}") from exc
            if packed is not None:
                sources.append((f"the store at data.{field}={path}", int(packed)))
    for what, v in sources:
        if v > n:
            raise ValueError(
                f"{where} has {n} token ids but {what} has {v}: ids {n}..{v - 1} would index past the "
                f"embedding; {fix.format(v=v)}"
            )
    if sources and not cfg.train.init_from:  # a loaded model's vocabulary is fixed: nothing to suggest
        v = max(v for _, v in sources)
        if v < n:
            rows = (n - v) * config.hidden_size * (1 if config.tie_word_embeddings else 2)
            return (
                f"model.vocab_size={n} is larger than the data's vocabulary ({v}): {n - v} rows ({rows:,} parameters) "
                f"never train; set model.vocab_size={v} to drop them"
            )
    return None


def build_optimizer(
    cfg: TrainConfig, model: torch.nn.Module, device: torch.device, zero1_group: Any = None, masters: dict | None = None
):
    """AdamW over the trainable parameters (decay on matrices only: ``param_groups``); ZeRO-1 when asked.

    ``masters`` ({bf16 parameter: fp32 master}, ``train.master_weights``): AdamW updates the masters and writes
    the parameters back."""
    from cookmind.optim import AdamW, param_groups

    o = cfg.optim
    groups = param_groups(model, o.weight_decay)
    if not groups:
        raise ValueError("the model has no trainable parameters (LoRA targets matched nothing trainable?)")
    kwargs = {"lr": o.lr, "betas": (o.beta1, o.beta2), "eps": o.eps, "weight_decay": o.weight_decay}
    if masters is not None:
        groups = [{**g, "params": [masters[p] for p in g["params"]]} for g in groups]
        model_params = {m: p for p, m in masters.items()}
        return AdamW(groups, fused=device.type == "cuda", model_params=model_params, **kwargs)
    import torch.distributed as dist

    if cfg.parallel.zero1 and dist.is_initialized() and dist.get_world_size() > 1:
        from cookmind.parallel import ShardedOptimizer

        return ShardedOptimizer(groups, torch.optim.AdamW if o.impl == "torch" else AdamW, **kwargs)
    if o.impl == "torch":
        # The library's fused kernel: the same AdamW update (tests/test_optim compares ours to it).
        return torch.optim.AdamW(groups, fused=device.type == "cuda", **kwargs)
    # On CUDA our AdamW's fused path (one kernel for all parameters; tests/test_optim checks it equals the
    # foreach math and torch's AdamW); the readable foreach path elsewhere.
    return AdamW(groups, fused=device.type == "cuda", **kwargs)
