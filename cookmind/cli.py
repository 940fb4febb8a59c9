"""`cookmind <stage> ...`: one subcommand per stage of the stack.

Each stage lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``.
Modules are imported only when their subcommand runs, so ``cookmind --help`` stays instant
and a stage's heavy dependencies (torch, ray, transformers) load only when needed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

# name -> (module, one-line help), in pipeline order.
COMMANDS: dict[str, tuple[str, str]] = {
    "curate": ("cookmind.curate.cli", "clean web text: HTML->text, language id, quality rules, PII, dedup"),
    "tokenizer": ("cookmind.tokenizer.cli", "train, use, inspect (info) and convert byte-level BPE tokenizers"),
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


_TORCHRUN_OPTIONS = {  # torchrun's, written with dashes (it takes underscores too)
    "--nnodes", "--nproc-per-node", "--node-rank", "--standalone", "--master-addr", "--master-port", "--max-restarts",
    "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--local-addr", "--monitor-interval",
}  # fmt: skip


class Parser(argparse.ArgumentParser):
    """cookmind's argument parser: a usage error (``cookmind pack: error: unrecognized arguments: ...``) quotes what
    the user typed, and is printed through ``say``, its control and bidi characters escaped (argparse printed an
    unknown argument raw; a bad choice it writes as Python's repr). The stages' subcommand parsers are of this class
    too (argparse makes them of their parent's)."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:") and any(
            word.split("=")[0].replace("_", "-") in _TORCHRUN_OPTIONS for word in message.split()
        ):  # `torchrun -m cookmind train --nnodes 2 ...`: torchrun handed its own option on
            message += "; torchrun's own options go before -m cookmind (torchrun --nnodes 2 ... -m cookmind train ...)"

        def usage_and_error() -> None:
            self.print_usage(sys.stderr)
            say(self.prog, "error", message)

        if under_torchrun():  # a node's ranks have the same arguments: said once a node, not once a rank
            from cookmind.parallel.process_group import say_once_per_node, tell_other_ranks

            say_once_per_node(f"{self.prog}: {message}", usage_and_error)
            tell_other_ranks(message)  # another node, launched with other arguments, waited for this one 30 minutes
        else:
            usage_and_error()
        self.exit(2)

    def _print_message(self, message: str, file=None) -> None:
        # --help, --version and the usage with no stage go to stdout: under torchrun, once a node (its first rank)
        if (file is None or file is sys.stdout) and a_nodes_other_rank():
            return
        super()._print_message(message, file)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    parser = Parser(prog=f"cookmind {name}", description=help_text)
    module.add_arguments(parser)
    return parser, module


MODEL_HELP = (
    "the model: a cookmind checkpoint/model directory, a run directory (its newest checkpoint) or a Hugging Face folder"
)


def add_model_argument(parser: argparse.ArgumentParser, help_text: str = MODEL_HELP, positional: bool = True) -> None:
    """The model, named the same way in every stage: ``--model DIR`` (old spelling ``--checkpoint``) or,
    with ``positional``, as the first positional argument. ``finish_model_argument`` merges the two."""
    parser.add_argument(
        "--model",
        "--checkpoint",
        dest="model_flag",
        metavar="DIR",
        default=None,
        help=help_text + (" (or give it as the first argument)" if positional else ""),
    )
    if positional:
        parser.add_argument("model", nargs="?", default=None, metavar="MODEL", help="the same as --model DIR")
    parser.set_defaults(model=None, _model_argument=True)


def int_in(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high], else a usage error naming the range (a 0 that silently meant
    the default, a port past 65535 that was a traceback)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


# a sampling seed: a 64-bit signed integer, as OpenAI's and the sampler's (SamplingParams) are
SEED = int_in(-(2**63), 2**63 - 1)


def float_in(low: float, high: float | None = None, *, above: bool = False, below: bool = False):
    """An argparse type: a number from ``low`` to ``high`` (``above``/``below``: the bound itself excluded), else a
    usage error naming the range (a --chunk-mb 0 that divided by zero, a probability of 2 taken as always)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = value <= low if above else value < low
        too_high = high is not None and (value >= high if below else value > high)
        if too_low or too_high or value != value or value in (float("inf"), float("-inf")):
            lo = f"above {low:g}" if above else f"{low:g} or more"
            hi = "" if high is None else f" and {'below' if below else 'at most'} {high:g}"
            # an infinity passed "0 or more": a --max-body-mb inf that no integer holds, a temperature of inf
            finite = "a finite number, " if value in (float("inf"), float("-inf")) else ""
            raise argparse.ArgumentTypeError(f"must be {finite}{lo}{hi}, got {text}")
        return value

    return parse


def finish_model_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set ``args.model`` from ``--model``/``--checkpoint`` or the positional; exactly one model is required."""
    if not getattr(args, "_model_argument", False):
        return
    flag, pos = getattr(args, "model_flag", None), args.model
    # a model is a folder: beside --model or --data this file is a word too many after an option's value (alone, the
    # model loader names it: "FILE: a file, not a model folder")
    if pos is not None and os.path.isfile(pos) and (flag is not None or getattr(args, "data", None) is not None):
        how = (
            ": --data takes one file (to score several, pack them into one store with `cookmind pack --input ...` "
            "and pass the store, or join the text files into one)"
            if getattr(args, "data", None) is not None
            else ""
        )
        parser.error(f"{pos!r}, given as an argument, is a file, not a model (a directory){how}")
    if flag is not None and pos is not None and flag != pos:
        parser.error(f"two models given ({flag!r} with --model and {pos!r} as an argument); give one")
    args.model = flag if flag is not None else pos
    if args.model is None:
        parser.error("the model is missing: give --model DIR (a checkpoint, run or Hugging Face directory)")


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


# Options whose value is text a user writes, which may begin with a dash (`--separator ---`, `--prompt "-3 is"`):
# argparse reads such a value as an option and stopped with "expected one argument"; given as the next word it is
# the option's value, as `--separator=---` spells it.
FREE_TEXT_OPTIONS = ("--separator", "--prompt", "--stop", "--system", "--text")


def _join_free_text(argv: list[str], options) -> list[str]:
    """``--separator ---`` as ``--separator=---``; a next word that is one of the stage's ``options`` stays one."""
    out, i = [], 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in FREE_TEXT_OPTIONS and nxt.startswith("-") and nxt.split("=")[0] not in options:
            out.append(f"{argv[i]}={nxt}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands' parsers."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def parse_stage_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse a stage's arguments; options and positionals (``section.key=value`` overrides) may be interleaved. The
    value of a ``FREE_TEXT_OPTIONS`` option may begin with a dash."""
    argv = _join_free_text(argv, _option_strings(parser))
    # parse_args stops filling a nargs="*" positional at the first option; intermixed parsing does not
    # (argparse cannot intermix across subcommands, so stages with subcommands parse plainly)
    if not _has_subcommands(parser):
        args = parser.parse_intermixed_args(argv)
        finish_model_argument(parser, args)
        return args
    # the sub-command says what it does not know, under its own usage (the stage's lists only the sub-commands)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _subcommand_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    finish_model_argument(_subcommand_parser(parser, args), args)  # 'cookmind eval ppl: error: ...', as argparse's
    return args


def _subcommand_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the sub-command ``args`` chose (``eval gsm8k``'s), or ``parser`` itself when none was."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            return action.choices.get(chosen, parser) if chosen else parser
    return parser


def say(command: str, kind: str | None, text: str) -> None:
    """Print ``COMMAND: KIND: TEXT`` ("cookmind pack: error: ...", or ``COMMAND: TEXT`` for a note, kind None) on
    stderr, the text's control and bidi characters escaped (``escape_controls``): an error or warning quotes file
    names and lines of the user's files, and an ESC in one would drive the terminal. Every stage's one-line errors and
    warnings go through here (and ``show`` prints it), as one line: a newline in a file name it quotes reads ``\\n``."""
    from cookmind.terminal import show

    show(f"{command}: {f'{kind}: ' if kind else ''}{text}", file=sys.stderr)


def under_torchrun() -> bool:
    """Whether this process is one of several ranks torchrun started."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and int(os.environ.get("WORLD_SIZE", "1")) > 1


def a_nodes_other_rank() -> bool:
    """Whether this process is one of several ranks and not its node's first (``LOCAL_RANK`` above 0): what every
    rank of a node would print alike (``--help``, ``--version``) is printed by the first alone, as errors are said
    once a node (``say_error``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("LOCAL_RANK", "0") != "0"


def not_global_rank_zero() -> bool:
    """Whether this process is one of several ranks and not the job's first (``RANK`` above 0): what one rank says
    for the whole job (the run directory, the model's shape) is said by rank 0 alone. A single process speaks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0"


def rank_name() -> str:
    """This rank's number as torchrun gave it (``RANK``), or ``?`` outside torchrun: what a line about it names."""
    return os.environ.get("RANK", "?")


def say_error(command: str, line: str, reason: str | None = None) -> None:
    """``say(command, "error", line)``; under torchrun once a node (``say_once_per_node``, by ``reason``, default
    ``line``): every rank met the same bad config key or missing file, and the user read its line once per rank."""
    if not under_torchrun():
        say(command, "error", line)
        return
    from cookmind.parallel.process_group import say_once_per_node

    say_once_per_node(line if reason is None else reason, lambda: say(command, "error", line))


def warnings_as_lines(stage: str) -> None:
    """Print cookmind's own warnings as one line, ``cookmind STAGE: warning: ...``, without the source line
    that raised them (other packages' warnings keep Python's format)."""
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    # the format this replaced (not an earlier call's one_line: main() runs many times in one process, in tests)
    python_format = getattr(warnings.formatwarning, "replaced", warnings.formatwarning)

    def one_line(message, category, filename, lineno, line=None):
        if os.path.abspath(filename).startswith(package):
            # a library warning that names its stage ("curate: ...") has it named once, after "cookmind STAGE"
            from cookmind.terminal import escape_controls

            said = escape_controls(str(message).removeprefix(f"{stage}: "), one_line=True)
            return f"cookmind {stage}: warning: {said}\n"
        return python_format(message, category, filename, lineno, line)

    one_line.replaced = python_format
    warnings.formatwarning = one_line


# What to change when a stage runs out of GPU memory (train says more itself: cookmind.train.cli).
OOM_ADVICE = {
    "train": "lower train.micro_batch_size (raise train.grad_accum_steps to keep the tokens a step), set "
    "train.activation_checkpointing=true, or shard the model over GPUs (torchrun ... parallel.fsdp=true)",
    "serve": "lower --kv-cache-mb, --max-seq-len or --max-batch, or serve in --dtype bfloat16",
    "eval": "lower --batch-size, or run on the CPU with --device cpu",
    "generate": "free the GPU (another process may hold it) or run on the CPU with --device cpu",
    "chat": "free the GPU (another process may hold it) or run on the CPU with --device cpu",
    "": "free the GPU (another process may hold it)",
}


CPU_OOM = "DefaultCPUAllocator: can't allocate memory"  # torch's RuntimeError when the machine's memory runs out
CPU_OOM_ADVICE = {  # OOM_ADVICE's, where the GPU's do not apply
    "serve": "lower --kv-cache-mb, --max-seq-len or --max-batch",
    "train": OOM_ADVICE["train"].split(", or shard")[0],
    "eval": "lower --batch-size",
    "": "free memory (another process may hold it) or use a smaller model",
}


def out_of_memory_line(exc: BaseException, advice: str) -> str:
    """torch's CUDA out-of-memory message cut to what it tried and what the GPU had, then what to do: one line.
    The CPU allocator's ("can't allocate memory: you tried to allocate N bytes") says what it tried, in KiB..TiB."""
    import re

    text = " ".join(str(exc).split())
    if CPU_OOM in text:
        tried = re.search(r"tried to allocate (\d+) bytes", text)
        size = ""
        if tried:
            n, unit = float(tried.group(1)), "bytes"
            for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
                if n < 1024 or unit == "TiB":
                    break
                n /= 1024
            size = f" (tried to allocate {n:.1f} {unit})"
        return f"out of memory on the CPU{size}; {advice}"
    tried = re.search(r"Tried to allocate [^.]*\.\d*\s*[KMGT]?i?B", text)
    had = re.search(r"total capacity of [^.]*\.\d*\s*[KMGT]?i?B of which [^.]*\.\d*\s*[KMGT]?i?B is free", text)
    said = "; ".join(m.group(0) for m in (tried, had) if m) or text[:160]
    return f"out of GPU memory ({said}); {advice}"


def command_name(parser: argparse.ArgumentParser, args: argparse.Namespace, stage: str) -> str:
    """``STAGE`` or ``STAGE SUB-COMMAND`` (``tokenizer export``, ``curate crawl``, ``eval ppl``): what every error
    line (and the Ctrl-C line) names, whether the stage or this module's handler prints it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = getattr(args, action.dest, None)
            return f"{stage} {sub}" if sub else stage
    return stage


def _first_file_in(path: str) -> str | None:
    """The first part of ``path`` that exists and is not a folder (why making or opening under it failed)."""
    from pathlib import Path

    for part in reversed([Path(path), *Path(path).parents]):
        if part.exists() and not part.is_dir():
            return str(part)
    return None


def os_error_line(exc: OSError) -> str:
    """An OSError as one line, "PATH: what; what to do", instead of Python's "[Errno 17] File exists: 'PATH'".

    Our own messages (an OSError made with one sentence, DiskFullError) are kept as they are."""
    path = exc.filename
    if exc.errno is None or not exc.strerror:
        return str(exc)  # one of our sentences: FileExistsError("... already exists; ...")
    if path is None:
        return exc.strerror  # DiskFullError's sentence, or the system's words for an error with no path
    if exc.filename2 is not None:
        path = f"{path} -> {exc.filename2}"
    if exc.strerror != os.strerror(exc.errno):
        return f"{path}: {exc.strerror}"  # a sentence of ours (or a library's) about the path: keep it
    if isinstance(exc, FileExistsError):
        from pathlib import Path

        kind = "is a file, not a folder" if Path(exc.filename).is_file() else "already exists"
        return f"{path}: {kind}; choose another path or move it away"
    if isinstance(exc, NotADirectoryError):
        file = _first_file_in(str(exc.filename))
        where = f"{file} is a file, not a folder" if file and file != str(exc.filename) else "is not a folder"
        return f"{path}: {where}; choose another path or move {file or 'it'} away"
    if isinstance(exc, IsADirectoryError):
        return f"{path}: is a folder, not a file; name a file"
    if isinstance(exc, PermissionError):
        return f"{path}: permission denied; choose a path you may use, or change its permissions"
    if isinstance(exc, FileNotFoundError):
        return f"{path}: no such file or folder; check the path"
    return f"{path}: {exc.strerror[:1].lower()}{exc.strerror[1:]}; check the path and try again"


def _stdout_is_closed() -> bool:
    """Whether stdout's reader has gone (its pipe broken). Then stdout points at /dev/null from here on, so the
    interpreter's own flush at exit does not print "Exception ignored ... BrokenPipeError" instead."""
    import select

    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poll.poll(0))  # a pipe without a reader
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout is no file
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return gone


def run() -> None:
    """The program's entry point (the ``cookmind`` command, ``python -m cookmind``): ``main`` on sys.argv, then the
    exit, through ``end_process`` where this process was in a process group (torchrun)."""
    import atexit

    # registered before main runs, so it runs after the exit callbacks main's libraries register (atexit runs them last
    # registered first): while those run a Ctrl-C still ends the process (keep_exit_status), through the modules'
    # teardown after them it is ignored (Python has put SIGINT's default back by then, which would end it by the signal)
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
    code = main()
    keep_exit_status(code)
    process_group = sys.modules.get("cookmind.parallel.process_group")  # imported only by what may make one
    if process_group is not None:
        leave_process_group(process_group, code)
        process_group.end_process(code)
    raise SystemExit(code)


def leave_process_group(process_group, code: int) -> None:
    """Destroy a process group the command left standing (a run that failed as it started; a Ctrl-C in the train
    CLI's own teardown) before the exit callbacks: ``end_process`` ends without Python's finalization, and no
    destructor would. A Ctrl-C while it is left waits for it, then ends the process with ``code`` (as
    ``keep_exit_status``); a second one ends it at once: leaving can hang where a rank has gone."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    asked = []

    def after_leaving(signum, frame):
        if asked:
            _exit_now(code)
        asked.append(signum)

    signal.signal(signal.SIGINT, after_leaving)
    failed: list[BaseException] = []

    def leave() -> None:
        try:
            process_group.destroy_distributed()
        except Exception as e:  # the command's status stands; the failure is said in one line
            failed.append(e)

    # in a thread of its own: leaving can wait in C++ (a peer gone), where no Python handler runs in the thread
    # that waits; the main thread joins in short waits, so a Ctrl-C is taken at once (and a second ends it)
    leaving = threading.Thread(target=leave, name="leave-process-group", daemon=True)
    try:
        leaving.start()
        while leaving.is_alive():
            leaving.join(0.1)
    finally:
        keep_exit_status(code)
    if failed:
        e = failed[0]
        print(f"cookmind: warning: leaving the process group failed ({type(e).__name__}: {e})", file=sys.stderr)
    if asked:
        _exit_now(code)


def _exit_now(code: int) -> None:
    """End the process with ``code`` at once, its output flushed (no exit callbacks, no finalization)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, its reader gone, or the signal landed inside its write
            pass
    os._exit(code)


def keep_exit_status(code: int) -> None:
    """Once ``main`` has returned, its output is complete: a Ctrl-C as the interpreter exits printed a KeyboardInterrupt
    traceback (in an atexit callback, or as the exit joins a thread still running) or ended the process by the signal
    (the modules' teardown, after Python has put SIGINT's default back): a completed run read as interrupted. Through
    the thread joins and the exit callbacks that libraries registered while main ran, a Ctrl-C ends the process at once
    with ``code`` (a hung join or callback can still be left); ``run`` ignores it from then on."""

    signal.signal(signal.SIGINT, lambda signum, frame: _exit_now(code))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        if not argv:
            parser.print_help()
            return 0
        parser.parse_args(argv)  # prints usage / --help / unknown-stage error and exits
        return 0
    try:  # the stage's module may import torch (seconds): a Ctrl-C then gets the line a Ctrl-C later gets
        stage_parser, module = _stage_parser(argv[0])
    except KeyboardInterrupt:
        return _interrupted(f"cookmind {argv[0]}")
    args = parse_stage_args(stage_parser, argv[1:])
    warnings_as_lines(argv[0])
    command = f"cookmind {command_name(stage_parser, args, argv[0])}"  # "cookmind eval ppl": errors and Ctrl-C
    try:
        result = module.main(args)
    except (ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_is_closed():
            return 128 + signal.SIGPIPE  # the reader of our output stopped early (`| head`): not an error
        # Bad input (a missing file, a wrong shape, a bad line) is reported as one clear line;
        # COOKMIND_DEBUG=1 shows the traceback instead.
        if os.environ.get("COOKMIND_DEBUG"):
            raise
        line = os_error_line(exc) if isinstance(exc, OSError) else str(exc)
        # another rank's reason (RankFailed) is said once a node too, by the failed rank or one that heard it
        say_error(command, line, exc.reason if type(exc).__name__ == "RankFailed" else line)
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") and type(exc).__name__ != "RankFailed":
            # under torchrun, before this rank joined the process group: the ranks waiting for it hear why
            from cookmind.parallel.process_group import tell_other_ranks

            tell_other_ranks(line)
        return 2
    except RuntimeError as exc:
        cpu = CPU_OOM in str(exc)  # the machine's memory, not the GPU's: other advice
        if (type(exc).__name__ != "OutOfMemoryError" and not cpu) or os.environ.get("COOKMIND_DEBUG"):  # torch's,
            raise  # by name: the data stages never import torch
        advice = CPU_OOM_ADVICE if cpu else OOM_ADVICE
        say(command, "error", out_of_memory_line(exc, advice.get(argv[0], advice[""])))
        return 2
    except KeyboardInterrupt:
        return _interrupted(command)
    return int(result or 0)


def _interrupted(command: str) -> int:
    """Ctrl-C, called while the KeyboardInterrupt is handled: one line and 130. Every output is written under a
    temporary name, so nothing half-written is left under the final one (the next run removes the temporary
    files); a traceback would only hide that. COOKMIND_DEBUG=1 re-raises it instead."""
    if os.environ.get("COOKMIND_DEBUG"):
        raise  # the KeyboardInterrupt the caller is handling
    sys.stderr.write(f"{command}: interrupted\n")  # one write: ranks under torchrun share one stderr
    return 128 + signal.SIGINT


if __name__ == "__main__":
    raise SystemExit(main())
