"""`cookmind import --hf --model HF_DIR --out OUT` (or `import --hf HF_DIR OUT`): convert a Hugging Face
Llama/Qwen2/Qwen3 model into a CookMind model."""

from __future__ import annotations

import argparse

from cookmind.cli import say
from cookmind.terminal import show


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the import stage."""
    parser.add_argument(
        "--hf",
        action="store_true",
        required=True,
        help="import from Hugging Face format (config.json + safetensors weights)",
    )
    parser.add_argument(
        "--model",
        dest="model_flag",
        metavar="DIR",
        default=None,
        help="Hugging Face model directory (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
    )
    parser.add_argument(
        "--out",
        dest="out_flag",
        metavar="DIR",
        default=None,
        help="output CookMind model directory (must not exist unless --overwrite; written atomically)",
    )
    parser.add_argument("paths", nargs="*", metavar="HF_DIR OUT", help="the same as --model HF_DIR --out OUT")
    from cookmind.model.cli_dtype import DTYPE_HELP

    parser.add_argument("--dtype", default=None, help=DTYPE_HELP)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier output of this command (only such a folder)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    """Run the import; print the resulting model's size."""
    from cookmind.model.cli_dtype import parse_dtype
    from cookmind.model.cli_export import model_and_out
    from cookmind.model.hf import HFInteropError, import_hf
    from cookmind.model.model_io import ModelLoadError, load_config

    hf_dir, out_dir = model_and_out(args)
    try:
        out = import_hf(
            hf_dir, out_dir, dtype=parse_dtype(args.dtype), overwrite=args.overwrite, progress=not args.quiet
        )
    except (HFInteropError, ModelLoadError, argparse.ArgumentTypeError) as exc:
        say("cookmind import", "error", exc)
        return 2
    from cookmind.tokenizer.files import has_tokenizer

    cfg = load_config(out)
    note = (
        ""
        if has_tokenizer(out)
        else f"; {hf_dir} has no tokenizer files: give generate, chat, serve and eval --tokenizer DIR"
    )
    show(
        f"imported {hf_dir} -> {out}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocab {cfg.vocab_size}" + note
    )
    return 0
