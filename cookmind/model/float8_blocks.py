"""FP8 training for the decoder blocks' projections (``train.fp8_blocks``), through torchao's float8 linears.

Each block's q/k/v/o and gate/up/down projection becomes torchao's ``Float8Linear``: the weight stays the same
fp32 master ``nn.Parameter`` under the same name (checkpoints and exports see plain tensors and unchanged
keys), and each of the three GEMMs of forward and backward casts its operands to float8 with dynamic scales
(tensorwise: one scale per tensor, torchao's fastest recipe on H100/H200; rowwise: one per row, more accurate,
slower). The embedding, the norms, attention itself and the LM head stay as they are (the head has its own
option, ``model.lm_head_fp8``; both may be on).

torchao swaps only ``torch.nn.Linear`` modules, and our projections are ``cookmind.model.linear.Linear`` (the
same ``x @ W.T``), so each chosen projection is first given an ``nn.Linear`` shell that shares its parameters;
``convert_to_float8_training`` then turns the shells into float8 linears. ``_scaled_mm`` needs both weight
dims to be multiples of 16: a projection that is not stays in the training precision, and the count is
reported. An MoE block's routed experts stay too (the tokens each gets vary from step to step).

``train.fp8_projections`` picks which projections convert: ``all`` (default), a comma-separated list of names
(``q_proj,gate_proj,up_proj``), or ``auto``: leave out the projections too small for float8 to gain, by the size
thresholds torchao published from its H100 GEMM-and-cast measurements (tensorwise: no gain where the reduced dim
K <= 4096 and the output dim N <= 1024; rowwise: where N <= 2048, K <= 1024, or N <= 4096 and K <= 2048). At the
Qwen3-0.6B shape ``auto`` keeps k/v/o/down (1024 wide outputs) in bf16 and converts q and gate/up. Measured on
an H200 there (B=16), ``auto`` was slower than ``all`` (65.3% against 67.0% MFU, docs/BENCHMARKS.md): the H100
thresholds do not transfer, so ``all`` stays the default.

torchao is an optional dependency (``pip install cookmind[fp8]``), imported only when the option is on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from cookmind.model.linear import Linear

if TYPE_CHECKING:
    from cookmind.train.config import TrainConfig

FP8_SCALINGS = ("tensorwise", "rowwise")
FP8_PROJECTION_MODES = ("all", "auto")  # or a comma-separated list of BLOCK_PROJECTIONS names
FP8_GEMMS = ("output", "grad_input", "grad_weight")  # a float8 linear's three GEMMs, by torchao's names
BLOCK_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GEMM_ALIGN = 16  # torch._scaled_mm: the reduced dim and the output-column dim must be multiples of 16


@dataclass
class Float8Conversion:
    """What ``convert_blocks_to_float8`` did: converted projection names, and skipped ones with the reason."""

    scaling: str
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    fast_accum: str = "output"

    def summary(self) -> str:
        """One line for the run's log: how many projections run in float8, how many do not and why."""
        total = len(self.converted) + len(self.skipped)
        how = self.scaling if self.fast_accum == "output" else f"{self.scaling}, fast accumulation: {self.fast_accum}"
        line = f"train.fp8_blocks: {len(self.converted)} of {total} block projections in float8 ({how})"
        if self.skipped:
            reasons: dict[str, int] = {}
            for why in self.skipped.values():
                reasons[why] = reasons.get(why, 0) + 1
            line += "; kept in the training precision: " + ", ".join(f"{n} ({why})" for why, n in reasons.items())
        return line


def fp8_blocks_problem(device: torch.device) -> str | None:
    """Why ``train.fp8_blocks`` cannot train on ``device`` (None when it can): for the Trainer's start-up check."""
    if device.type != "cuda":
        return (
            f"train.fp8_blocks needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9: Ada, Hopper); "
            f"this run is on {device.type}; set train.fp8_blocks=false"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        return (
            f"train.fp8_blocks needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}; set train.fp8_blocks=false"
        )
    return None


def import_torchao_float8():
    """``torchao.float8``, imported quietly, or a one-line ImportError saying how to install it.

    torchao's import logs a warning for each optional C++ kernel library it cannot load (the MX / CUTLASS
    kernels, unused here: float8 training runs on torch._scaled_mm and compiled casts); those are hidden.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        for name in ("torchao", "torch.utils._pytree"):
            logger = logging.getLogger(name)
            stack.callback(logger.setLevel, logger.level)
            logger.setLevel(logging.ERROR)
        try:
            import torchao.float8 as float8
        except ImportError as exc:
            raise ImportError(
                f"train.fp8_blocks needs torchao ({exc}); install it with: pip install cookmind[fp8]"
            ) from None
    return float8


def _projection_problem(module: nn.Module) -> str | None:
    """Why this block projection cannot be a float8 linear (None when it can)."""
    if module.in_features % GEMM_ALIGN or module.out_features % GEMM_ALIGN:
        return f"dims not multiples of {GEMM_ALIGN}"
    return None


def _name_list(key: str, value: str, choices: tuple[str, ...], modes: str) -> frozenset[str]:
    """A comma-separated list of ``choices`` as a set; ValueError (one line: the key, what is wrong, the choices and
    the ``modes`` words it also takes) for an unknown name or none."""
    names = [n.strip() for n in str(value).split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise ValueError(
            f"{key}={value!r}: {'unknown ' + ', '.join(unknown) if unknown else 'no names'}; "
            f"give {modes}, or a comma-separated list of {', '.join(choices)}"
        )
    return frozenset(names)


def projection_names(projections: str) -> frozenset[str] | None:
    """``train.fp8_projections`` as the set of names it converts (None: all or auto). Raises ValueError (one line,
    naming the key and the choices) for an unknown name."""
    if projections in FP8_PROJECTION_MODES:
        return None
    return _name_list("train.fp8_projections", projections, BLOCK_PROJECTIONS, "all, auto")


def fast_accum_gemms(fast_accum: str) -> frozenset[str]:
    """``train.fp8_fast_accum`` as the set of GEMMs that accumulate fast: ``all``, ``none``, or a comma-separated
    list of output, grad_input, grad_weight. Raises ValueError (one line, naming the key and the choices)."""
    modes = {"all": frozenset(FP8_GEMMS), "none": frozenset()}
    text = str(fast_accum).strip()
    return modes[text] if text in modes else _name_list("train.fp8_fast_accum", fast_accum, FP8_GEMMS, "all, none")


def too_small_to_gain(module: nn.Module, scaling: str) -> bool:
    """``train.fp8_projections=auto``: whether a projection's GEMMs are too small for float8 (with the casts that
    feed them) to beat bf16, by torchao's published thresholds for the recipe (see the module docstring)."""
    n, k = module.out_features, module.in_features
    if scaling == "rowwise":
        return n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)
    return k <= 4096 and n <= 1024


def _as_torch_linear(module: Linear) -> nn.Linear:
    """An ``nn.Linear`` that shares ``module``'s weight and bias (same math: x @ W.T + b), for torchao's swap."""
    with torch.device("meta"):
        shell = nn.Linear(module.in_features, module.out_features, bias=False)
    shell.weight = module.weight
    shell.bias = module.bias
    return shell


def convert_blocks_to_float8(
    blocks: nn.ModuleList,
    scaling: str = "tensorwise",
    pad_inner_dim: bool = False,
    fsdp_float8_all_gather: bool = False,
    emulate: bool = False,
    projections: str = "all",
    fast_accum: str = "output",
) -> Float8Conversion:
    """Turn each block's q/k/v/o and gate/up/down projection into a torchao float8 training linear, in place.

    blocks: the model's list of decoder blocks (``cookmind.parallel.compile_blocks.find_blocks``).
    scaling: "tensorwise" (fastest) or "rowwise" (more accurate).
    pad_inner_dim: zero-pad each GEMM's reduced dim to a multiple of 16; needed when the tokens of a step are
        not (the weight-gradient GEMM reduces over them): variable-length batches.
    fsdp_float8_all_gather: FSDP2 all-gathers the weights in float8 (tensorwise only; torchao's
        ``enable_fsdp_float8_all_gather``).
    emulate: run the float8 GEMMs as emulated high-precision matmuls (torchao's ``emulate``): CPU tests only.
    projections: ``all``, ``auto`` or a comma-separated list of names (``train.fp8_projections``).
    fast_accum: which GEMMs accumulate in the tensor cores' faster, lower-precision mode (``train.fp8_fast_accum``):
        ``output`` (torchao's default: the forward only), ``all``, ``none``, or a list of output, grad_input,
        grad_weight.
    Projections already converted (a second Trainer over the same model) count as converted.
    """
    if scaling not in FP8_SCALINGS:
        raise ValueError(f"train.fp8_scaling={scaling!r}: choose one of {FP8_SCALINGS}")
    if fsdp_float8_all_gather and scaling != "tensorwise":
        raise ValueError(
            "train.fp8_scaling=rowwise with FSDP's float8 all-gather: torchao gathers float8 weights only with "
            "tensorwise scales; set train.fp8_scaling=tensorwise"
        )
    chosen = projection_names(projections)
    fast = fast_accum_gemms(fast_accum)
    float8 = import_torchao_float8()
    config = float8.Float8LinearConfig.from_recipe_name(scaling)
    gemm_configs = {f"gemm_config_{gemm}": float8.Float8GemmConfig(use_fast_accum=gemm in fast) for gemm in FP8_GEMMS}
    config = dataclasses.replace(
        config,
        pad_inner_dim=pad_inner_dim,
        enable_fsdp_float8_all_gather=fsdp_float8_all_gather,
        emulate=emulate,
        **gemm_configs,
    )
    report = Float8Conversion(scaling, fast_accum=",".join(g for g in FP8_GEMMS if g in fast) or "none")
    for i, block in enumerate(blocks):
        shells = set()
        for name, module in list(block.named_modules()):
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in BLOCK_PROJECTIONS:
                continue
            where = f"layers.{i}.{name}"
            if type(module).__name__ == "Float8Linear":
                report.converted.append(where)
            elif ".experts." in f".{name}.":
                report.skipped[where] = "MoE routed experts"
            elif type(module) is not Linear:
                report.skipped[where] = f"a {type(module).__name__}, not a plain projection"
            elif (why := _projection_problem(module)) is not None:
                report.skipped[where] = why
            elif chosen is not None and leaf not in chosen:
                report.skipped[where] = "not in train.fp8_projections"
            elif projections == "auto" and too_small_to_gain(module, scaling):
                report.skipped[where] = "too small for float8 to gain: train.fp8_projections=auto"
            else:
                parent = block.get_submodule(name.rsplit(".", 1)[0]) if "." in name else block
                shell = _as_torch_linear(module)
                setattr(parent, leaf, shell)
                shells.add(id(shell))
                report.converted.append(where)
        if shells:
            float8.convert_to_float8_training(
                block, module_filter_fn=lambda m, fqn, ids=shells: id(m) in ids, config=config
            )
    return report


def apply_fp8_blocks(model: nn.Module, cfg: TrainConfig, device: torch.device | None = None) -> Float8Conversion | None:
    """``cfg.train.fp8_blocks``: check the run can train in FP8, then convert ``model``'s blocks (in place).

    Called by ``cookmind.parallel.parallelize`` before checkpointing, torch.compile and data parallelism, so
    the compiler traces the float8 casts and FSDP2 shards the float8 linears' weights. Returns None when off.
    Raises ValueError (one line: what, why, what to do) on CPU, on a GPU without FP8 tensor cores, with LoRA,
    without torchao.
    """
    t = cfg.train
    if not t.fp8_blocks:
        return None
    from cookmind.model.lora import has_lora

    if cfg.lora.enabled or has_lora(model):
        raise ValueError(
            "train.fp8_blocks with LoRA: the adapted projections are LoRA wrappers, which torchao's float8 "
            "linears do not replace, so nothing would run in float8; set train.fp8_blocks=false"
        )
    device = device if device is not None else next(model.parameters()).device  # FSDP: still on the CPU here
    problem = fp8_blocks_problem(device)
    if problem is not None:
        raise ValueError(problem)
    try:
        import_torchao_float8()
    except ImportError as exc:  # bad set-up, reported like bad input: one line from `cookmind train`, status 2
        raise ValueError(str(exc)) from None
    from cookmind.parallel.compile_blocks import find_blocks

    fixed_windows = (cfg.data.train_type or ("seq" if t.objective == "pretrain" else None)) == "seq"
    aligned = fixed_windows and (t.micro_batch_size * cfg.data.window_size) % GEMM_ALIGN == 0
    fsdp = getattr(cfg.parallel, "fsdp", False)  # FSDP2 (parallel.fsdp, when present) gathers weights in float8
    fsdp = fsdp not in (False, None, "false", "off", "none", "")
    return convert_blocks_to_float8(
        find_blocks(model),
        t.fp8_scaling,
        pad_inner_dim=not aligned,
        fsdp_float8_all_gather=fsdp and t.fp8_scaling == "tensorwise",
        projections=t.fp8_projections,
        fast_accum=t.fp8_fast_accum,
    )
