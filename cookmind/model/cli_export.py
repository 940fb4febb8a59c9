"""`cookmind export --hf --model CKPT --out OUT` (or `export --hf CKPT OUT`): write a checkpoint as a Hugging Face
Llama/Qwen2/Qwen3 model."""

from __future__ import annotations

import argparse
from pathlib import Path

from cookmind.cli import say
from cookmind.terminal import show


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the export stage."""
    parser.add_argument(
        "--hf",
        action="store_true",
        required=True,
        help="export to Hugging Face format (config.json + model.safetensors + tokenizer files)",
    )
    parser.add_argument(
        "--model",
        "--checkpoint",
        dest="model_flag",
        metavar="DIR",
        default=None,
        help="CookMind checkpoint or model directory (config.json, model.safetensors or a sharded checkpoint's "
        "dcp/), or a run directory: its newest complete checkpoint is used",
    )
    parser.add_argument(
        "--out",
        dest="out_flag",
        metavar="DIR",
        default=None,
        help="output directory (must not exist unless --overwrite; written atomically)",
    )
    parser.add_argument("paths", nargs="*", metavar="MODEL OUT", help="the same as --model MODEL --out OUT")
    from cookmind.model.cli_dtype import DTYPE_HELP

    parser.add_argument("--dtype", default=None, help=DTYPE_HELP)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier output of this command (only such a folder)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """Run the export; print where it went and which HF class loads it."""
    from cookmind.model.cli_dtype import parse_dtype
    from cookmind.model.hf import HFInteropError, export_hf
    from cookmind.model.model_io import ModelLoadError, resolve_model_dir

    model, out_dir = model_and_out(args)
    ckpt = resolve_model_dir(Path(model), progress=not args.quiet)
    try:
        out = export_hf(ckpt, out_dir, dtype=parse_dtype(args.dtype), overwrite=args.overwrite, progress=not args.quiet)
    except (HFInteropError, ModelLoadError, argparse.ArgumentTypeError) as exc:
        say("cookmind export", "error", exc)
        return 2
    import json

    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    files = sorted(p.name for p in out.iterdir())
    from cookmind.tokenizer.files import has_tokenizer

    note = (
        ""
        if has_tokenizer(out)
        else f"; {ckpt} has no tokenizer files, so neither has {out}: add the model's with "
        f"`cookmind tokenizer export --tokenizer TOK --out {out} --format hf`"
    )
    show(
        f"exported {ckpt} -> {out} as {arch} ({', '.join(files)}); "
        f"load with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})" + note
    )
    return 0


def model_and_out(args: argparse.Namespace) -> tuple[str, str]:
    """(model, out) from --model/--out and the positionals (MODEL OUT, or only the ones the flags left out)."""
    paths = list(args.paths)
    model = args.model_flag if args.model_flag is not None else (paths.pop(0) if paths else None)
    out = args.out_flag if args.out_flag is not None else (paths.pop(0) if paths else None)
    if model is None or out is None or paths:
        raise ValueError(
            f"give the model and the output directory: --model DIR --out DIR (or the two as "
            f"arguments); got model={model!r}, out={out!r}" + (f", and extra {paths}" if paths else "")
        )
    return model, out
