"""The one loader: a model and its tokenizer from a cookmind checkpoint, a training run or a Hugging Face folder
(used by generate, chat, serve, eval and the Trainer's init_from / DPO reference)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

from cookmind.tokenizer.hf_adapter import load_tokenizer

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def load_model_dir(
    path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None, progress: bool = False
):
    """A CookMindLM from a model or checkpoint directory, a training run (its newest checkpoint) or a Hugging
    Face Llama/Qwen folder (imported). dtype: a torch dtype or one of DTYPES' names; None keeps the stored one.
    ``progress``: bars of the checks of the weights' SHA-256s (a run's newest checkpoint is found by them)."""
    from cookmind.model import resolve_model_dir
    from cookmind.model.hf import load_model_or_hf

    path = resolve_model_dir(path, progress=progress)
    if not path.is_dir():
        what = "a file, not a model folder" if path.exists() else "no such model folder"
        raise FileNotFoundError(
            f"{path}: {what} (give a cookmind checkpoint, a training run or a Hugging Face model folder)"
        )
    torch_dtype = _torch_dtype(dtype)
    return load_model_or_hf(path, device=device, dtype=torch_dtype, progress=progress)


def _torch_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_for_inference(
    path: str | Path,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    tokenizer_path: str | Path | None = None,
    *,
    hf_native: bool = False,
    progress: bool = True,
):
    """(model in eval mode, tokenizer): the one loader of generate, chat, serve and eval.

    From a cookmind checkpoint/model dir, a training run or a Hugging Face folder. A Hugging Face folder is
    imported into a CookMindLM (Llama/Qwen; the engine serves it), or with hf_native=True loaded as it is by
    transformers (any architecture; its own tokenizer object), offline either way. tokenizer_path overrides the
    checkpoint's tokenizer; one other than the checkpoint carries (cookmind_tokenizer.json) is refused.
    ``progress=False`` (eval --quiet) hides transformers' "Loading weights" bar, and ours of the check of a run's
    newest checkpoint.
    """
    from cookmind.model import resolve_model_dir
    from cookmind.model.hf import is_hf_model_dir

    path = resolve_model_dir(path, progress=progress)
    if hf_native and is_hf_model_dir(path):
        _require_tokenizer(path, tokenizer_path)
        kwargs = {} if dtype is None else {"dtype": _torch_dtype(dtype)}
        if tokenizer_path is not None:  # another tokenizer than the folder's own would feed the model other ids
            _check_given_tokenizer(path, tokenizer_path)
        tokenizer = transformers_load("AutoTokenizer", Path(tokenizer_path or path), "the tokenizer")
        model = transformers_load("AutoModelForCausalLM", path, "the model", progress=progress, **kwargs)
        return model.to(device).eval(), tokenizer
    model = load_model_dir(path, device, dtype, progress)
    _require_tokenizer(path, tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path or path)
    from cookmind.tokenizer.hf_format import transformers_differences

    for difference in transformers_differences(tokenizer_path or path, tokenizer):
        warnings.warn(difference, stacklevel=2)  # the model may expect what transformers gives it
    if tokenizer_path is not None:
        from cookmind.tokenizer.tokenizer import check_carried_tokenizer

        # another tokenizer than the checkpoint's would turn its ids into garbage text
        check_carried_tokenizer(
            path,
            tokenizer,
            model=f"the model {path}",
            given=f"--tokenizer {tokenizer_path}",
            hint="drop --tokenizer to use the checkpoint's own",
        )
        # a model that carries no tokenizer was compared with nothing: ids past its rows crash every generation
        rows, words = model.config.vocab_size, getattr(tokenizer, "vocab_size", None)
        if words is not None and words > rows:
            raise ValueError(
                f"--tokenizer {tokenizer_path} has {words} tokens, more than the model's vocabulary of {rows}: it is "
                f"not the tokenizer {path} was trained with (its ids past {rows - 1} name no row of the model); give "
                "that one"
            )
    return model.eval(), tokenizer


def _check_given_tokenizer(path: Path, tokenizer_path) -> None:
    """transformers' loading: --tokenizer read as cookmind's tokenizer (where it is a byte-level BPE) and compared
    with the one the model folder carries, as cookmind's own loading does."""
    from cookmind.tokenizer import TokenizerError
    from cookmind.tokenizer.hf_adapter import load_tokenizer
    from cookmind.tokenizer.tokenizer import check_carried_tokenizer

    try:
        given = load_tokenizer(tokenizer_path)
    except (TokenizerError, ValueError, OSError):
        return  # not one cookmind reads: transformers loads it, or says why not
    check_carried_tokenizer(
        path,
        given,
        model=f"the model {path}",
        given=f"--tokenizer {tokenizer_path}",
        hint="drop --tokenizer to use the model's own",
    )


def _require_tokenizer(path: Path, tokenizer_path) -> None:
    """Without --tokenizer, the model folder must hold one: say so, and what to give."""
    if tokenizer_path is not None:
        return
    from cookmind.tokenizer import TokenizerError
    from cookmind.tokenizer.files import has_tokenizer

    if not has_tokenizer(path):
        raise TokenizerError(
            f"{path}: the model folder holds no tokenizer (cookmind_tokenizer.json, tokenizer.json or vocab.json "
            "+ merges.txt); give the one it was trained with: --tokenizer DIR"
        )


def transformers_load(auto_class: str, path: str | Path, what: str, progress: bool = True, **kwargs):
    """``transformers.<auto_class>.from_pretrained(path)`` offline, never running Python code from the folder
    (transformers asked "Do you wish to run the custom code? [y/N]" on a terminal for a folder whose auto_map names
    its own files); its refusal, or any error loading, is one line naming the folder. ``progress=False`` hides its
    progress bars meanwhile."""
    import transformers
    from safetensors import SafetensorError
    from transformers.utils import logging as transformers_logging

    from cookmind.progress import is_terminal

    bars = transformers_logging.is_progress_bar_enabled()
    progress = progress and is_terminal(sys.stderr)  # its raw tqdm bar: carriage returns into a pipe or a log
    if not progress:
        transformers_logging.disable_progress_bar()
    try:
        return getattr(transformers, auto_class).from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False, **kwargs
        )
    except (OSError, ValueError, SafetensorError) as exc:  # a weights file that is none: "header too large"
        if "trust_remote_code" in str(exc):
            raise ValueError(
                f"{path}: {what} needs Python code from the folder (auto_map in its config), and cookmind runs no "
                "code from a model folder; use a model of an architecture transformers ships (Llama, Qwen, ...)"
            ) from None
        raise ValueError(f"{path}: transformers cannot load {what}: {' '.join(str(exc).split())}") from None
    finally:
        if bars and not progress:
            transformers_logging.enable_progress_bar()


def parse_lora_specs(specs: list[str], base_name: str) -> dict[str, Path]:
    """``--lora name=PATH`` arguments as {name: path}; ValueError for a malformed, repeated or base-shadowing name."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise ValueError(f"--lora {spec!r}: expected NAME=PATH (e.g. --lora cooking=runs/lora/adapter)")
        if name in out or name == base_name:
            what = "another --lora" if name in out else "the base model (--model-name)"
            raise ValueError(f"--lora {spec!r}: the name {name!r} is already taken by {what}; pick another name")
        out[name] = Path(path)
    return out


def load_adapters(model, specs: dict[str, str | Path], base_name: str = "the base model", progress: bool = False):
    """Read LoRA adapters ({name: directory}) for ``model``: cookmind's ``save_adapter`` output, PEFT's own
    ``save_pretrained`` on the Hugging Face export (both PEFT-format adapter_config.json + adapter_model.safetensors)
    or a LoRA training run (its newest checkpoint holds the adapter). Each is checked against the base: every
    tensor's module must be a linear layer of the model with matching shapes and rank, and every module the config
    targets must have its pair; a mismatch is a ValueError naming the adapter and the module. An adapter that
    recorded its base's weights (``save_adapter``) and finds other ones in ``model`` (named ``base_name``) loads with
    a warning naming both: the same shapes, but not the outputs it was trained for. ``progress``: a bar of the check
    of a run's newest checkpoint's SHA-256s. Returns
    ``multi_lora.LoRAAdapter``s in the given order."""
    import re
    import warnings

    from cookmind.infer.multi_lora import LoRAAdapter
    from cookmind.model import resolve_model_dir
    from cookmind.model.fingerprint import fingerprint_mismatch
    from cookmind.model.linear import Linear
    from cookmind.model.lora import ADAPTER_CONFIG, adapter_base, read_adapter_config, read_adapter_tensors

    linear = {n: m for n, m in model.named_modules() if isinstance(m, (Linear, torch.nn.Linear))}
    adapters = []
    for name, directory in specs.items():
        if Path(directory).is_file():  # an adapter's file: its folder is the adapter
            raise FileNotFoundError(
                f"{directory}: is a file, not a folder; name the folder that holds it, {Path(directory).parent} "
                f"(adapter {name!r})"
            )
        if not Path(directory).is_dir():
            raise FileNotFoundError(
                f"{directory}: no such directory; name a LoRA adapter folder or a LoRA training run (adapter {name!r})"
            )
        if not (Path(directory) / ADAPTER_CONFIG).is_file():  # a training run: its newest checkpoint
            directory = resolve_model_dir(directory, progress=progress)
        where = f"adapter {name!r} ({directory})"
        try:
            cfg = read_adapter_config(directory)
        except FileNotFoundError as exc:  # "DIR/adapter_config.json: missing", naming neither the --lora nor a fix
            raise FileNotFoundError(
                f"{where} holds no LoRA adapter (no {ADAPTER_CONFIG}): name a LoRA training run (cookmind train ... "
                "lora.enabled=true), cookmind's save_adapter output or a PEFT adapter folder"
            ) from exc
        trained_on, fingerprint = adapter_base(directory)
        differs = fingerprint_mismatch(fingerprint, model) if fingerprint else None
        # what a structural mismatch below most likely means: an adapter trained on another model
        other = (
            f" (the adapter was trained on {trained_on or 'another model'}, not on {base_name}: their weights differ "
            f"at {differs}; serve it on the model it was trained on)"
            if differs
            else " (an adapter for another model?)"
        )
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in read_adapter_tensors(directory).items():
            match = re.fullmatch(r"(.+)\.(lora_A|lora_B)\.weight", key)
            if match is None:
                raise ValueError(
                    f"{where}: tensor {key} is not a LoRA A/B weight (embedding LoRA, DoRA magnitudes and trained "
                    "biases are not supported)"
                )
            module, part = match.groups()
            if module not in linear:
                raise ValueError(f"{where}: module {module} is not a linear layer of the base model{other}")
            pairs.setdefault(module, {})[part] = tensor
        for module in _targeted(linear, cfg):
            if module not in pairs:
                raise ValueError(f"{where}: module {module} is a target in adapter_config.json but has no weights")
        weights = {}
        for module, pair in sorted(pairs.items()):
            out_f, in_f = linear[module].weight.shape
            want = {"lora_A": (cfg["r"], in_f), "lora_B": (out_f, cfg["r"])}
            for part, shape in want.items():
                got = pair.get(part)
                if got is None:
                    raise ValueError(f"{where}: module {module} has no {part} weight")
                if tuple(got.shape) != shape:
                    raise ValueError(
                        f"{where}: {module}.{part}.weight has shape {tuple(got.shape)}, the base model with r="
                        f"{cfg['r']} expects {shape}{other}"
                    )
            weights[module] = (pair["lora_A"], pair["lora_B"])
        if differs:
            warnings.warn(
                f"{where} was trained on {trained_on or 'another model'}, not on {base_name} (their weights differ "
                f"at {differs}), so it will not give the outputs it was trained for; serve it on "
                f"{trained_on or 'the model it was trained on'} (or a copy of it) or train it again from {base_name}",
                stacklevel=2,
            )
        adapters.append(LoRAAdapter(name, Path(directory), cfg["scaling"], weights))
    return adapters


def _targeted(linear: dict, cfg: dict) -> list[str]:
    """The linear modules an adapter_config.json's target_modules (names, a regex or "all-linear") and
    layers_to_transform select, as PEFT selects them."""
    import re

    targets, layers = cfg["targets"], cfg["layers_to_transform"]
    out = []
    for name in linear:
        if targets == "all-linear":
            hit = name != "lm_head"
        elif isinstance(targets, str):
            hit = re.fullmatch(targets, name) is not None
        else:
            hit = name.rsplit(".", 1)[-1] in targets
        if hit and layers is not None:
            m = re.search(r"\.layers\.(\d+)\.", name)
            hit = m is not None and int(m.group(1)) in layers
        if hit:
            out.append(name)
    return out
