"""`cookmind export --hf CKPT OUT`: write a checkpoint as a Hugging Face Llama/Qwen2/Qwen3 model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the export stage."""
    parser.add_argument("--hf", action="store_true", required=True,
                        help="export to Hugging Face format (config.json + model.safetensors + tokenizer files)")
    parser.add_argument("checkpoint", help="CookMind checkpoint or model directory (config.json, model.safetensors), "
                                           "or a run directory: its newest complete checkpoint is used")
    parser.add_argument("out", help="output directory (must not exist; written atomically)")
    parser.add_argument("--dtype", default=None, help="cast weights: fp32, bf16 or fp16 (default: keep)")


def main(args: argparse.Namespace) -> int:
    """Run the export; print where it went and which HF class loads it."""
    from cookmind.model.cli_dtype import parse_dtype
    from cookmind.model.hf import HFInteropError, export_hf
    from cookmind.model.model_io import ModelLoadError, resolve_model_dir

    ckpt = resolve_model_dir(Path(args.checkpoint))
    try:
        out = export_hf(ckpt, args.out, dtype=parse_dtype(args.dtype))
    except (HFInteropError, ModelLoadError, argparse.ArgumentTypeError) as exc:
        print(f"cookmind export: {exc}", file=sys.stderr)
        return 2
    import json

    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    files = sorted(p.name for p in out.iterdir())
    print(f"exported {ckpt} -> {out} as {arch} ({', '.join(files)}); "
          f"load with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


