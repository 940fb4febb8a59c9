"""`cookmind <stage> ...`: one subcommand per stage of the stack.

Each stage lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``.
Modules are imported only when their subcommand runs, so ``cookmind --help`` stays instant
and a stage's heavy dependencies (torch, ray, transformers) load only when needed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help), in pipeline order.
COMMANDS: dict[str, tuple[str, str]] = {
    "curate": ("cookmind.curate.cli", "clean web text: HTML->text, language id, quality rules, PII, dedup"),
    "tokenizer": ("cookmind.tokenizer.cli", "train, inspect and convert byte-level BPE tokenizers"),
    "pack": ("cookmind.store.cli", "tokenize text, chats, preferences or RL prompts into a token store"),
    "train": ("cookmind.train.cli", "pretrain, SFT, LoRA, DPO or GRPO with one training loop"),
    "export": ("cookmind.model.cli_export", "export a checkpoint to Hugging Face format (--hf)"),
    "import": ("cookmind.model.cli_import", "import a Hugging Face Llama/Qwen checkpoint (--hf)"),
    "generate": ("cookmind.infer.cli_generate", "generate text from a checkpoint with a KV cache"),
    "chat": ("cookmind.infer.cli_chat", "chat with a model in the terminal"),
    "serve": ("cookmind.infer.cli_serve", "OpenAI-compatible HTTP server and web chat page"),
    "eval": ("cookmind.evals.cli", "evaluate: perplexity, GSM8K, MMLU"),
    "demo": ("cookmind.demo", "run every stage end to end on the embedded synthetic data"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cookmind",
        description="cookmind: raw web text in, a chatting, aligned small LLM out.",
    )
    parser.add_argument("--version", action="version", version="cookmind " + _version())
    sub = parser.add_subparsers(dest="command", metavar="<stage>")
    for name, (_module, help_text) in COMMANDS.items():
        # add_help=False: the real parser (with the stage's own arguments) is built on demand.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _version() -> str:
    from cookmind import __version__

    return __version__


def _stage_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"cookmind {name}", description=help_text)
    module.add_arguments(parser)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        if not argv:
            parser.print_help()
            return 0
        parser.parse_args(argv)  # prints usage / --help / unknown-stage error and exits
        return 0
    stage_parser, module = _stage_parser(argv[0])
    args = stage_parser.parse_args(argv[1:])
    try:
        result = module.main(args)
    except (ValueError, OSError) as exc:
        # Bad input (a missing file, a wrong shape, a bad line) is reported as one clear line;
        # COOKMIND_DEBUG=1 shows the traceback instead.
        if os.environ.get("COOKMIND_DEBUG"):
            raise
        print(f"cookmind {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
