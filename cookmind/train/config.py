"""The one typed training config: sections as dataclasses, YAML presets, dotted overrides.

    cfg = TrainConfig.load("tiny-cpu", overrides=["optim.lr=3e-4", "train.max_steps=100"])

A preset is a name from ``cookmind/configs/`` or a path to a YAML file. Every key must be a
field of the schema: an unknown key is an error that names it and lists the valid ones, so a
typo never silently trains with a default. The resolved config is saved in the run directory
(``config.yaml``) and inside every checkpoint's ``meta.json``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cookmind import text_input

if TYPE_CHECKING:
    import torch

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


@dataclass
class DataConfig:
    """Where the tokens come from; ``train_type`` picks the dataset (seq, sft, dpo, grpo)."""

    train_path: str | None = None
    val_path: str | None = None
    train_type: str | None = None  # None -> the objective's natural type
    # Tokens per training window. For sft/dpo, when neither the user's config file nor an override sets it
    # (a built-in preset's value does not count), the run sizes it from the store: its longest record,
    # capped by the model's max_position_embeddings.
    window_size: int = 256
    stride: int | None = None
    storage_type: str | None = None  # None -> detect (.bin dir or .h5)
    num_workers: int = 0
    shuffle: bool = True
    tokenizer: str | None = None  # tokenizer dir copied into checkpoints and used for samples


@dataclass
class OptimConfig:
    """AdamW with a cosine schedule: lr rises linearly for ``warmup_steps``, then falls to ``min_lr_ratio * lr``."""

    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0
    schedule: str = "cosine"  # cosine | constant
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # <= 0 disables clipping (the norm is still logged)
    impl: str = "cookmind"  # cookmind (our AdamW) | torch (torch.optim.AdamW, fused on GPU: same math, fast path)


@dataclass
class TrainLoopConfig:
    """The loop itself: steps, batch shape, precision and speed options."""

    objective: str = "pretrain"  # pretrain | sft | dpo | grpo
    max_steps: int = 100
    micro_batch_size: int = 8
    grad_accum_steps: int = 1
    precision: str = "fp32"  # fp32 | bf16 | fp16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    init_from: str | None = None  # checkpoint or model dir to start from (SFT/DPO after pretrain)
    compile: bool = False
    # torch.compile mode when compile is on: default | reduce-overhead (CUDA graphs: no per-kernel launch cost)
    # | max-autotune (also benchmarks GEMM/Triton choices at start-up: minutes) | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # what train.compile compiles: model (the whole model as one graph) | blocks (each decoder block
    # on its own: the blocks share one compilation, for a shorter start-up; FSDP always does this)
    compile_scope: str = "model"
    activation_checkpointing: bool = False
    max_bad_steps: int = 10  # consecutive non-finite (or exploding) losses/gradients before the run stops
    # A finite loss above this many times the run's best 10-step mean loss (and above it by > 1) counts as a
    # bad step too, so an exploding run stops instead of finishing "completed"; 0 = off; not for GRPO.
    diverge_loss_ratio: float = 3.0
    # CPU threads (torch.set_num_threads) for a CPU run: 1 makes runs and resumes bit-reproducible; N > 1 is
    # faster and reproducible only with the same N on the same machine (not guaranteed); 0 = torch's default.
    threads: int = 1
    # Where the skip decision stays on the device (CUDA, fused AdamW): read step k's loss/grad-norm and run its
    # callbacks after step k+1 is queued, so the GPU never waits for the host. Same results; false reads each
    # step before queuing the next (the CPU path always does; so does max_bad_steps=0, where any bad step stops).
    defer_metrics: bool = True
    # Capture the whole step (forward, backward, clip, AdamW) once after a few eager steps and replay it, so the
    # host launches one graph per step instead of hundreds of kernels (cookmind.train.cuda_graph): false | true
    # (an error where it cannot: CPU, torchrun, fp16, GRPO) | auto (on where it can, silently off elsewhere)
    cuda_graph: str = "false"
    # The decoder blocks' q/k/v/o and gate/up/down GEMMs in float8 through torchao (cookmind.model.float8_blocks;
    # pip install cookmind[fp8]); CUDA with compute capability >= 8.9. A training transform applied from outside
    # by cookmind.parallel.parallelize, like compile: checkpoints and exports are unchanged.
    fp8_blocks: bool = False
    fp8_scaling: str = "tensorwise"  # tensorwise (one scale per tensor: fastest) | rowwise (per row: more accurate)
    # which projections: all | auto (leave out those too small for float8 to gain, by torchao's size thresholds) |
    # a comma-separated list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
    fp8_projections: str = "all"
    # which FP8 GEMMs (the float8 blocks' and model.lm_head_fp8's) accumulate in the tensor cores' fast,
    # lower-precision mode: output (torchao's default: the forward) | all | none | a comma-separated list of output,
    # grad_input, grad_weight. all: 1.4% faster at qwen3-0.6b B=16 (docs/BENCHMARKS.md); the others move their
    # partial sums into fp32 as they go
    fp8_fast_accum: str = "output"
    # bf16 parameters with fp32 master weights in the optimizer (precision=bf16 only): the forward reads bf16
    # weights and the backward writes bf16 weight gradients with no casts; AdamW updates the fp32 masters and writes
    # the bf16 weights back (cookmind.optim.master_weights). Checkpoints hold the fp32 masters, as without it.
    # false | true (an error where it cannot: not bf16, FSDP, ZeRO-1, torch's AdamW, sharded checkpoints) | auto (on
    # a CUDA device where true would be accepted, off elsewhere: the GPU presets set it)
    master_weights: str = "false"


@dataclass
class DPOConfig:
    """Direct preference optimisation (Rafailov et al. 2023) and its IPO / conservative variants."""

    beta: float = 0.1
    reduction: str = "sum"  # sum | mean  (of the response token log-probs)
    loss: str = "sigmoid"  # sigmoid | ipo
    label_smoothing: float = 0.0
    reference: str | None = None  # None -> the starting model (or the LoRA base with adapters off)
    nll_weight: float = 0.0  # > 0 adds nll_weight * chosen responses' mean token NLL, averaged over pairs (RPO)


@dataclass
class LoRAConfig:
    """Low-rank adapters W + (alpha / r) * B A on the named projections; only A and B train."""

    enabled: bool = False
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class CheckpointConfig:
    """Checkpoints every ``every`` steps (0 = only at the end / on a signal), keeping the last ``keep_last``."""

    dir: str | None = None  # default: <run_dir>/checkpoints
    every: int = 0
    keep_last: int = 2  # of this run's own checkpoints; another run's are never pruned
    resume: str | None = None  # None | auto | a checkpoint path
    overwrite: bool = False  # a fresh run in a directory holding another run: delete that run's checkpoints
    format: str = "auto"  # auto (sharded for an FSDP-sharded model, else full) | full (safetensors) | sharded (DCP)
    async_save: bool = False  # sharded: write in the background; the next save or the end of training completes it


@dataclass
class EvalConfig:
    """Validation loss/perplexity every ``every`` steps plus greedy samples from fixed prompts."""

    every: int = 0  # 0 = only at the end (when a val set is given)
    max_batches: int = 20
    prompts: list[str] = field(default_factory=list)
    max_new_tokens: int = 48


@dataclass
class LoggingConfig:
    """Run directory, metrics cadence and the progress bar."""

    run_dir: str = "runs/default"
    log_every: int = 10
    progress: bool = True
    tensorboard: bool = False
    report: bool = True


@dataclass
class ParallelConfig:
    """Data parallelism: PyTorch DDP or cookmind's own (cookmind.parallel), with optional ZeRO-1; or FSDP2."""

    ddp: str = "torch"  # torch | ours
    zero1: bool = False
    backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
    bucket_mb: float = 25.0
    reduce_dtype: str = "fp32"  # fp32 | bf16: gradients all-reduced in bf16 (half the bytes; ours, or torch's hook)
    fsdp: bool = False  # FSDP2 (fully_shard each block, then the root) in place of DDP: parameters, gradients and
    # optimizer state sharded over the ranks
    reshard_after_forward: bool = True  # fsdp: free each block's gathered weights after its forward (gather again
    # in backward); false keeps them until backward (more memory, less communication)
    fsdp_unit_blocks: int = 1  # fsdp: consecutive blocks sharded as one unit (fewer, larger collectives and hooks)
    fsdp_prefetch: bool = False  # fsdp: each unit issues the next unit's all-gather as it starts (forward and
    # backward), so gathers do not wait for the host to reach the unit that needs them


@dataclass
class TrainConfig:
    """The whole run. ``model`` holds CookMindConfig fields (validated when the model is built) and
    ``grpo`` the GRPO objective's settings (validated by cookmind.align when that objective is built)."""

    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    grpo: dict[str, Any] = field(default_factory=dict)  # GRPOConfig fields (validated by cookmind.align)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> TrainConfig:
        """Build from a nested dict; unknown sections/keys and wrong types raise ValueError naming them."""
        cfg = cls()
        cfg.update(d, source)
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, preset: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
        """Load a preset (name in cookmind/configs or a YAML path), then apply ``a.b=value`` overrides."""
        cfg = cls()
        if preset:
            path = resolve_preset(preset)
            data = _parse_yaml(text_input.read_utf8(path), str(path)) or {}
            if not isinstance(data, dict):
                raise ValueError(f"{path}: a config file must be a mapping of sections, got {type(data).__name__}")
            builtin = path.resolve().parent == CONFIG_DIR
            cfg.update(data, str(path), user=not builtin)
        for item in overrides or []:
            cfg.set_dotted(item)
        cfg.validate()
        return cfg

    def update(self, d: dict[str, Any], source: str = "<dict>", user: bool = True) -> None:
        """Merge a nested dict into this config (only the keys given change); ``user`` records the keys as set
        by the user (``is_user_set``), as opposed to a built-in preset's defaults."""
        for section, values in d.items():
            if user and isinstance(values, dict):
                self.__dict__.setdefault("_user_keys", set()).update(f"{section}.{k}" for k in values)
            if section not in _section_names():
                raise ValueError(_unknown(source, "section", section, _section_names()))
            if section in _FREE_SECTIONS:  # checked by their owner (CookMindConfig, GRPOConfig)
                if not isinstance(values, dict):
                    raise ValueError(f"{source}: section '{section}' must be a mapping, got {values!r}")
                getattr(self, section).update(values)
                continue
            if not isinstance(values, dict):
                raise ValueError(f"{source}: section '{section}' must be a mapping, got {values!r}")
            obj = getattr(self, section)
            for key, value in values.items():
                _set_field(obj, section, key, value, source)

    def is_user_set(self, dotted: str) -> bool:
        """Whether ``section.key`` was set by the user (a dict, their YAML file, an override), not a preset."""
        return dotted in self.__dict__.get("_user_keys", set())

    def set_dotted(self, item: str) -> None:
        """Apply one ``section.key=value`` override; the value is parsed as YAML (3e-4, true, [a, b])."""
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected section.key=value, e.g. optim.lr=3e-4")
        dotted, raw = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) != 2:
            raise ValueError(f"override {item!r}: expected exactly one dot (section.key), e.g. train.max_steps=100")
        value = _parse_yaml(raw, f"override {item!r}") if raw.strip() != "" else None
        self.update({parts[0]: {parts[1]: value}}, source=f"override {item!r}")

    def validate(self) -> None:
        """Check choices and ranges that a type alone cannot express."""
        _choice("train.objective", self.train.objective, ("pretrain", "sft", "dpo", "grpo"))
        _choice("train.precision", self.train.precision, ("fp32", "bf16", "fp16"))
        _choice("parallel.reduce_dtype", self.parallel.reduce_dtype, ("fp32", "bf16"))
        _choice("checkpoint.format", self.checkpoint.format, ("auto", "full", "sharded"))
        if self.parallel.zero1 and self.checkpoint.format == "sharded":
            raise ValueError(
                "checkpoint.format=sharded does not support parallel.zero1 (its optimizer state is sharded "
                "its own way); use checkpoint.format=full"
            )
        if self.checkpoint.async_save and (
            self.checkpoint.format == "full" or (self.checkpoint.format == "auto" and not self.parallel.fsdp)
        ):  # auto is sharded exactly when parallel.fsdp shards the model: decided here, not after it is built
            raise ValueError(
                f"checkpoint.async_save needs checkpoint.format=sharded (format={self.checkpoint.format} is the full "
                "format here: auto is sharded only with parallel.fsdp=true); set checkpoint.format=sharded, "
                "parallel.fsdp=true or checkpoint.async_save=false"
            )
        _choice(
            "train.compile_mode",
            self.train.compile_mode,
            ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        )
        _choice("train.compile_scope", self.train.compile_scope, ("model", "blocks"))
        _choice("train.cuda_graph", self.train.cuda_graph, ("false", "true", "auto"))
        _choice("train.master_weights", self.train.master_weights, ("false", "true", "auto"))
        _choice("train.fp8_scaling", self.train.fp8_scaling, ("tensorwise", "rowwise"))
        from cookmind.model.float8_blocks import fast_accum_gemms, projection_names

        projection_names(self.train.fp8_projections)  # an unknown name is a config error at load
        fast_accum_gemms(self.train.fp8_fast_accum)
        _choice("optim.schedule", self.optim.schedule, ("cosine", "constant"))
        _choice("optim.impl", self.optim.impl, ("cookmind", "torch"))
        _choice("dpo.reduction", self.dpo.reduction, ("sum", "mean"))
        _choice("dpo.loss", self.dpo.loss, ("sigmoid", "ipo"))
        _choice("parallel.ddp", self.parallel.ddp, ("torch", "ours"))
        _choice("parallel.backend", self.parallel.backend, ("auto", "gloo", "nccl"))
        _check_reduce_dtype(self)
        if self.parallel.fsdp:
            _check_fsdp(self)
        if self.train.master_weights == "true":
            _check_master_weights(self)
        if self.data.train_type is not None:
            _choice("data.train_type", self.data.train_type, ("seq", "sft", "dpo", "grpo"))
        from cookmind.model.config import CookMindConfig

        known = sorted(f.name for f in dataclasses.fields(CookMindConfig))
        for key in self.model:  # caught here, not when the model is built after the data and tokenizer load
            if key not in known:
                raise ValueError(_unknown("config", "key in section 'model'", key, known))
        for name, value in (
            ("train.max_steps", self.train.max_steps),
            ("train.micro_batch_size", self.train.micro_batch_size),
            ("train.grad_accum_steps", self.train.grad_accum_steps),
            ("data.window_size", self.data.window_size),
            ("lora.r", self.lora.r),
            ("logging.log_every", self.logging.log_every),
            ("eval.max_batches", self.eval.max_batches),
            ("eval.max_new_tokens", self.eval.max_new_tokens),
            ("data.stride", 1 if self.data.stride is None else self.data.stride),
            ("parallel.fsdp_unit_blocks", self.parallel.fsdp_unit_blocks),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in (
            ("optim.warmup_steps", self.optim.warmup_steps),
            ("train.max_bad_steps", self.train.max_bad_steps),
            ("train.seed", self.train.seed),
            ("train.threads", self.train.threads),
            ("data.num_workers", self.data.num_workers),
            ("checkpoint.every", self.checkpoint.every),
            ("checkpoint.keep_last", self.checkpoint.keep_last),
            ("eval.every", self.eval.every),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self._validate_numbers()
        max_pos = self.model.get("max_position_embeddings")
        # sft/dpo: the run sizes it from the store; grpo: capped at the context (longer prompts are dropped, counted)
        sized_later = (self.data.train_type or self.train.objective) in ("sft", "dpo", "grpo") and not self.is_user_set(
            "data.window_size"
        )
        # a model loaded from train.init_from has its own context, the preset's gives way to it: the trainer checks
        # the window against that one
        loaded_context = bool(self.train.init_from) and not self.is_user_set("model.max_position_embeddings")
        if isinstance(max_pos, int) and self.data.window_size > max_pos and not sized_later and not loaded_context:
            raise ValueError(
                f"data.window_size={self.data.window_size} is longer than the model's context "
                f"(model.max_position_embeddings={max_pos}); lower data.window_size"
            )
        if not 0.0 <= self.dpo.label_smoothing < 0.5:
            raise ValueError(f"dpo.label_smoothing must be in [0, 0.5), got {self.dpo.label_smoothing}")
        if self.dpo.beta <= 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.dpo.beta}")
        if self.dpo.nll_weight < 0:  # a negative weight raises the chosen answers' NLL
            raise ValueError(f"dpo.nll_weight must be >= 0, got {self.dpo.nll_weight}")

    def _validate_numbers(self) -> None:
        """Every float field finite (nan/inf would train NaN weights), then the ranges each one needs."""
        for section in _section_names():
            obj = getattr(self, section)
            if not dataclasses.is_dataclass(obj):
                continue
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"{section}.{f.name} must be a finite number, got {value}")
        o = self.optim
        for name, value, ok, rule in (
            ("optim.lr", o.lr, o.lr > 0, "> 0"),
            ("optim.min_lr_ratio", o.min_lr_ratio, 0 <= o.min_lr_ratio <= 1, "in [0, 1]"),
            ("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0"),
            ("optim.beta1", o.beta1, 0 <= o.beta1 < 1, "in [0, 1)"),
            ("optim.beta2", o.beta2, 0 <= o.beta2 < 1, "in [0, 1)"),
            ("optim.eps", o.eps, o.eps > 0, "> 0"),
            (
                "train.diverge_loss_ratio",
                self.train.diverge_loss_ratio,
                self.train.diverge_loss_ratio == 0 or self.train.diverge_loss_ratio > 1,
                "0 (off) or > 1",
            ),
            ("lora.alpha", self.lora.alpha, self.lora.alpha > 0, "> 0"),
            ("lora.dropout", self.lora.dropout, 0 <= self.lora.dropout < 1, "in [0, 1)"),
            ("parallel.bucket_mb", self.parallel.bucket_mb, self.parallel.bucket_mb > 0, "> 0"),
        ):
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {value}")

    # -- output -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (JSON/YAML-safe)."""
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Every setting by its dotted key (``optim.lr``; a model or grpo entry as ``model.hidden_size``)."""
        return {f"{section}.{k}": v for section, values in self.to_dict().items() for k, v in values.items()}

    def save(self, path: str | Path) -> None:
        """Write the resolved config as YAML, atomically."""
        path = Path(path)
        from cookmind.atomic import write_text

        write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


_FREE_SECTIONS = ("model", "grpo")

# `cookmind train`'s flag for each config key that has one: a message names what the user typed, and the key
CLI_FLAGS = {
    "train.objective": "--objective",
    "data.train_path": "--train-data",
    "data.val_path": "--val-data",
    "data.tokenizer": "--tokenizer",
    "train.init_from": "--init-from",
    "logging.run_dir": "--run-dir",
    "checkpoint.resume": "--resume",
    "checkpoint.overwrite": "--overwrite",
}

_NO_VALUE = object()


def yaml_word(value: Any) -> str:
    """A setting's value as an override spells it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def setting(key: str, value: Any = _NO_VALUE) -> str:
    """A config key as a message names it: ``--resume (checkpoint.resume)`` where `cookmind train` has a flag for
    it, the key alone otherwise; with ``value``, ``--resume auto (checkpoint.resume)`` or ``optim.lr=0.001``."""
    flag = CLI_FLAGS.get(key)
    if value is _NO_VALUE:
        return f"{flag} ({key})" if flag else key
    if flag is None:
        return f"{key}={value}"
    return f"{flag} ({key}={yaml_word(value)})" if isinstance(value, bool) else f"{flag} {value} ({key})"


def resolve_preset(preset: str | Path) -> Path:
    """A preset name (``tiny-cpu``) or a YAML path -> the file; a clear error listing presets otherwise."""
    p = Path(preset)
    if p.exists() and not p.is_dir() and (p.suffix in (".yaml", ".yml") or not p.is_file()):
        return p  # a YAML file, or a pipe (--config <(...)), which has no suffix and is no preset
    candidate = CONFIG_DIR / f"{preset}.yaml"
    if candidate.exists():
        return candidate
    names = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))
    if p.suffix in (".yaml", ".yml"):
        raise FileNotFoundError(
            f"config file {str(preset)!r} not found: give a YAML path or one of the presets {names}"
        )
    raise FileNotFoundError(f"config preset {str(preset)!r} not found: give a YAML path or one of {names}")


def _section_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def _parse_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` whose syntax errors are one line naming ``source`` and the line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{source}: not valid YAML{where}: {problem}") from None


def _unknown(source: str, what: str, name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{source}: unknown {what} {name!r}{hint}; valid: {', '.join(valid)}"


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{setting(name)} must be one of {list(choices)}, got {value!r}")


def _set_field(obj: Any, section: str, key: str, value: Any, source: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    if key not in fields:
        raise ValueError(_unknown(source, f"key in section '{section}'", key, list(fields)))
    hints = typing.get_type_hints(type(obj))
    setattr(obj, key, coerce_value(value, hints[key], f"{source}: {section}.{key}"))


def coerce_value(value: Any, tp: Any, where: str) -> Any:
    """Check/convert a YAML value to the field's annotated type (int -> float allowed)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce_value(value, inner[0], where)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return [coerce_value(v, args[0], where) for v in value] if args else list(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool) and where.endswith(("cuda_graph", "master_weights")):  # false | true | auto: YAML
            # reads two of them as bools
            return "true" if value else "false"
        if isinstance(value, (list, tuple)) and where.endswith(("fp8_projections", "fp8_fast_accum")):  # YAML lists
            return ",".join(coerce_value(v, str, where) for v in value)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def _check_reduce_dtype(cfg: TrainConfig) -> None:
    """parallel.reduce_dtype=bf16 through torch's DDP (its bf16 hook) needs NCCL: refused where the config says the
    backend is gloo (parallel.backend=gloo, or auto on train.device=cpu), not once the model is built. A train.device
    of auto on a machine without CUDA is only known there (``wrap_data_parallel`` refuses it)."""
    p = cfg.parallel
    if p.fsdp or p.ddp != "torch" or p.reduce_dtype != "bf16":
        return
    if p.backend == "gloo":
        runs = "parallel.backend=gloo"
    elif p.backend == "auto" and str(cfg.train.device).split(":")[0] == "cpu":
        runs = "train.device=cpu runs parallel.backend=auto as gloo"
    else:
        return
    raise ValueError(
        f"parallel.reduce_dtype=bf16 with parallel.ddp=torch needs the NCCL backend (torch's bf16 hook), and "
        f"{runs}; use parallel.ddp=ours, which reduces in bf16 on any backend, or parallel.reduce_dtype=fp32"
    )


def _check_fsdp(cfg: TrainConfig) -> None:
    """Refuse what cannot go with parallel.fsdp, in one line each."""
    if cfg.parallel.ddp == "ours":
        raise ValueError(
            "parallel.fsdp=true shards the model itself and cannot go inside parallel.ddp=ours; "
            "set parallel.ddp=torch (FSDP reduces the gradients itself; a resume keeps the run's ddp: ours unless "
            "told) or parallel.fsdp=false"
        )
    if cfg.parallel.zero1:
        raise ValueError(
            "parallel.fsdp=true shards the optimizer state already; set parallel.zero1=false (ZeRO-1 is for DDP runs)"
        )
    if cfg.train.cuda_graph == "true":
        raise ValueError(
            "train.cuda_graph=true cannot capture FSDP's collectives (parallel.fsdp=true); "
            "set train.cuda_graph=false or auto"
        )
    if cfg.checkpoint.format == "full":  # FSDP shards the model on any number of ranks, one included
        raise ValueError(
            "checkpoint.format=full cannot save an FSDP-sharded model (parallel.fsdp=true: every rank holds a part "
            "of it); set checkpoint.format=sharded or auto"
        )


def master_weights_problems(cfg: TrainConfig) -> list[str]:
    """Why train.master_weights=true cannot go with the rest of ``cfg``, one line each (empty when it can)."""
    fix = "set train.master_weights=false"
    problems = []
    if cfg.train.precision != "bf16":
        problems.append(
            f"train.master_weights=true keeps the model's parameters in bf16 and needs train.precision=bf16, "
            f"got {cfg.train.precision!r}; set train.precision=bf16 or {fix}"
        )
    if cfg.parallel.fsdp:
        problems.append(
            f"train.master_weights=true cannot go with parallel.fsdp=true (FSDP2 has its own mixed precision: "
            f"bf16 gathers of fp32 shards); {fix}"
        )
    if cfg.parallel.zero1:
        problems.append(
            f"train.master_weights=true cannot go with parallel.zero1=true (its sharded optimizer keeps no "
            f"masters); {fix} or parallel.zero1=false"
        )
    if cfg.optim.impl != "cookmind":
        problems.append(
            f"train.master_weights=true needs optim.impl=cookmind (our AdamW keeps the fp32 masters), got "
            f"{cfg.optim.impl!r}; set optim.impl=cookmind or {fix}"
        )
    if cfg.checkpoint.format == "sharded":
        problems.append(
            f"train.master_weights=true saves full checkpoints (the fp32 masters in model.safetensors); set "
            f"checkpoint.format=full (or auto), or {fix}"
        )
    return problems


def _check_master_weights(cfg: TrainConfig) -> None:
    """Refuse what cannot go with train.master_weights=true: the first problem, in one line."""
    problems = master_weights_problems(cfg)
    if problems:
        raise ValueError(problems[0])


def uses_master_weights(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether a run of ``cfg`` on ``device`` keeps bf16 parameters with fp32 masters: always under ``true``; under
    ``auto`` on a CUDA device when nothing refuses it (``master_weights_problems``), silently not elsewhere."""
    mode = cfg.train.master_weights
    if mode == "auto":
        return device.type == "cuda" and not master_weights_problems(cfg)
    return mode == "true"
