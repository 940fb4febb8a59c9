"""`cookmind chat MODEL` (or `--model MODEL`): a terminal chat with streaming, history, /reset and /system.

The conversation's text is printed with its control characters escaped (``cookmind.terminal``): the model's,
and the user's in /history; the session keeps it as said."""

from __future__ import annotations

import argparse
import sys

from cookmind.cli import say
from cookmind.device import DEVICE_HELP

HELP = """commands:
  /reset          forget the conversation
  /system TEXT    set the system prompt (empty: none) and start over
  /history        show the conversation
  /quit           leave (or Ctrl-D)
  //TEXT          send a message that begins with / (as /TEXT)
  \"\"\"             a line of three double quotes alone starts a message of several lines (code, a poem), sent
                  when another such line ends it; the lines between are sent as they are, / or not"""

BLOCK = '"""'  # a line of it alone opens and closes a message of several lines (as ollama's chat has it)

TOP_P = 0.95  # chat samples by default: temperature 0.7, this top-p

KEYS = """Ctrl-C while a reply streams stops it (the reply so far stays in the conversation); inside a \"\"\" block it
discards the block; at the you> prompt Ctrl-C leaves (exit 130), Ctrl-D (end of input) leaves quietly. Messages may be
piped in, one a line, or several lines between two lines of \"\"\":
  printf 'What is 2+3?\\n/history\\n' | cookmind chat runs/sft
  printf '\"\"\"\\nRoses are red,\\nsoup is hot.\\n\"\"\"\\n' | cookmind chat runs/sft"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cookmind.cli import add_model_argument
    from cookmind.infer.cli_generate import TOKENIZER_HELP, add_sampling_arguments

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = f"{HELP}\n{KEYS}"
    add_model_argument(parser)
    parser.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP)
    parser.add_argument("--system", default=None, help="system prompt")
    add_sampling_arguments(
        parser,
        max_new_tokens=512,
        temperature=0.7,
        top_p=TOP_P,
        max_new_tokens_help="the chat keeps this much of the model's context free for each reply, at most half of "
        "it, leaving the oldest exchanges out until the conversation fits in the rest (a reply may run on into "
        "whatever room is left, up to this many tokens)",
        seed_help="sampling seed of the session: its reply k (from 0) draws from SEED + k, so the same messages give "
        "the same conversation (default: unseeded)",
    )
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    parser.add_argument(
        "--dtype", default=None, help="float32 | bfloat16 | float16 (default: bfloat16 on CUDA, else the checkpoint's)"
    )


def run(session, stdin=None, stdout=None, color: bool = False) -> int:
    """The read-eval-print loop over text streams (so tests can drive it; default: the process's, as they are when
    it runs); returns how many messages got an error instead of a reply."""
    from cookmind.infer.cli_generate import why_no_text
    from cookmind.terminal import escape_controls

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    errors = 0
    dim, reset = ("\033[2m", "\033[0m") if color else ("", "")
    print("cookmind chat — type a message, /help for commands", file=stdout, flush=True)
    while True:
        print("you> ", end="", file=stdout, flush=True)
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # 'cookmind chat: interrupted' on a line of its own, not after "you> "
            print(file=stdout, flush=True)
            raise
        if not line:
            print(file=stdout)
            return errors
        line = line.rstrip("\n").removesuffix("\r")  # a CRLF file's line too
        block = line.rstrip() == BLOCK
        if block:
            line = _read_block(stdin, stdout)
            if line is None:  # Ctrl-C inside the block: it is dropped, as a shell drops a half-typed command
                continue
        if not line.strip():
            if block:  # a paste that lost its text: the prompt back alone read as if it had been sent
                print(f"(the {BLOCK} block holds no text: nothing was sent)", file=stdout)
            continue
        if block:
            pass  # a message of several lines is sent as typed: a first line of /reset is text
        elif line.startswith("//"):
            line = line[1:]  # a message that begins with /, not a command
        elif line.startswith("/"):
            cmd, _, arg = line.partition(" ")
            if cmd in ("/quit", "/exit"):
                return errors
            if cmd == "/reset":
                session.reset()
                print("(conversation cleared)", file=stdout)
            elif cmd == "/system":
                session.set_system(arg.strip())
                session.reset()
                print(f"(system prompt {'set' if arg.strip() else 'cleared'}; conversation cleared)", file=stdout)
            elif cmd == "/history":
                for m in session.messages():
                    print(f"[{m['role']}] {escape_controls(m['content'])}", file=stdout)
                if not session.messages():
                    print("(the conversation is empty)", file=stdout)
            else:
                if cmd != "/help":
                    print(
                        f"(unknown command {escape_controls(cmd)}: nothing was sent; start a message with // to send "
                        "one that begins with /)",
                        file=stdout,
                    )
                print(HELP, file=stdout)
            continue
        print("bot> ", end="", file=stdout, flush=True)
        kind_before = None
        reply = session.send(line)
        try:
            said = False
            for kind, piece in reply:
                said = said or _say_dropped(session, stdout)  # before the reply: the model no longer sees them
                if kind != kind_before and kind_before == "reasoning":
                    print(reset + "\n", end="", file=stdout)
                if kind == "reasoning" and kind_before != "reasoning":
                    print(dim + "[thinking] ", end="", file=stdout)
                print(escape_controls(piece), end="", file=stdout, flush=True)
                kind_before = kind
            if not said:  # an empty reply: the note on the dropped messages still comes first
                _say_dropped(session, stdout)
            why = why_no_text(session.reply_text, session.tokens, session.stopped, chat=True)
            if why and not session.cut:  # a reply that shows no text says why, or "bot> " stands alone
                print(f"(no reply: {why})", end="", file=stdout)
            if session.limited:  # as the web page shows "length" under it
                print(
                    reset + f" (stopped at --max-new-tokens {session.cfg.max_new_tokens}; raise it for longer replies)",
                    end="",
                    file=stdout,
                )
            if session.cut:  # the reply stopped mid-way without a word otherwise
                print(
                    reset + " (cut: the conversation filled the model's context; /reset to start over)",
                    end="",
                    file=stdout,
                )
        except ValueError as exc:
            errors += 1
            print(f"(error: {exc})", end="", file=stdout)
        except KeyboardInterrupt:
            reply.close()  # the reply so far becomes the assistant's turn (ChatSession.send)
            print(reset + " (interrupted: the reply so far is kept in the conversation)", end="", file=stdout)
        print(reset if kind_before == "reasoning" else "", file=stdout, flush=True)


def _read_block(stdin, stdout) -> str | None:
    """The lines of a message typed or piped after a line of \"\"\", up to the next such line (not sent: it closes the
    message), joined by newlines. The input ending first sends what was read, and says so; Ctrl-C discards the block
    (None), and says so."""
    lines = []
    while True:
        print("...> ", end="", file=stdout, flush=True)
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            print(f"\n(the {BLOCK} block is discarded: its {len(lines)} line(s) were not sent)", file=stdout)
            return None
        if not line:
            print(
                f"\n(the input ended inside a {BLOCK} block: its {len(lines)} line(s) are sent as the message)",
                file=stdout,
            )
            return "\n".join(lines)
        line = line.rstrip("\n").removesuffix("\r")
        if line.rstrip() == BLOCK:
            return "\n".join(lines)
        lines.append(line)


def _say_dropped(session, stdout) -> bool:
    """Say how many of the oldest messages the last turn left out to fit the context (if any); True once said."""
    if session.dropped:
        print(
            f"(the {session.dropped} oldest messages are left out to fit the model's context; /reset to start over) ",
            end="",
            file=stdout,
        )
    return True


def main(args: argparse.Namespace) -> int:
    from cookmind.device import inference_dtype, resolve_device
    from cookmind.infer.chat_session import ChatSession
    from cookmind.infer.cli_generate import greedy_ignores, sampling_params
    from cookmind.infer.loading import load_for_inference

    if warning := greedy_ignores(args, TOP_P):
        say("cookmind chat", "warning", warning)
    device = resolve_device(args.device)
    model, tok = load_for_inference(args.model, str(device), inference_dtype(args.dtype, device), args.tokenizer)
    cfg = sampling_params(args, stop_strings=tuple(args.stop))  # matched on the reply's text: ChatSession.send
    if args.system:  # else every message was refused, each told to be shorter
        try:
            n = len(tok.render_prompt([{"role": "system", "content": args.system}]))
        except ValueError as exc:  # a template that leaves the system message out: every message would be refused
            say("cookmind chat", "error", f"--system: {exc}")
            return 2
        context = model.config.max_position_embeddings
        if n >= context:
            say(
                "cookmind chat",
                "error",
                f"--system ({n} tokens with the chat template) fills the model's context of {context} tokens, "
                "leaving no room for a message; shorten it",
            )
            return 2
    errors = run(ChatSession(model, tok, cfg, args.system), color=sys.stdout.isatty())
    if errors and not sys.stdin.isatty():  # a script piping messages in: its messages got no reply
        print(
            f"cookmind chat: {errors} message(s) got an error instead of a reply (said in the conversation above)",
            file=sys.stderr,
        )
        return 1
    return 0
