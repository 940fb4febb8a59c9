"""`cookmind generate --model DIR --prompt TEXT`: stream a completion with the KV cache.

Control tokens (<|im_start|>, <|endoftext|>, ...) are not printed (--keep-special-tokens prints them); with --chat
the reply ends at the first one and its reasoning is split out, as in `cookmind chat`. Control characters are printed
escaped (``cookmind.terminal``) unless --raw."""

from __future__ import annotations

import argparse
import sys

from cookmind.cli import say
from cookmind.device import DEVICE_HELP
from cookmind.infer.reasoning import split_reasoning
from cookmind.terminal import escape_controls
from cookmind.tokenizer.documents import prompt_ids

TOKENIZER_HELP = (  # generate's, chat's and serve's
    "tokenizer directory (default: the checkpoint's own, which it carries; one other than the model was trained with, "
    "by fingerprint, is refused)"
)


def add_sampling_arguments(
    parser: argparse.ArgumentParser,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    max_new_tokens_help="",
    seed_help="sampling seed (default: unseeded)",
):
    """The sampling options of generate and chat: the same names, help and validation, each command's defaults
    (and what ``--max-new-tokens`` means to the command, in ``max_new_tokens_help``)."""
    from cookmind.cli import SEED, float_in, int_in

    parser.add_argument(
        "--max-new-tokens",
        type=int_in(1),
        default=max_new_tokens,
        help=f"default {max_new_tokens}" + (f"; {max_new_tokens_help}" if max_new_tokens_help else ""),
    )
    greedy = "0 = greedy (default)" if temperature == 0 else f"default {temperature:g}; 0 = greedy"
    parser.add_argument("--temperature", type=float_in(0), default=temperature, help=greedy)
    parser.add_argument("--top-k", type=int_in(0), default=0, help="default 0 (off)")
    off = " (off)" if top_p == 1 else ""
    parser.add_argument("--top-p", type=float_in(0, 1, above=True), default=top_p, help=f"default {top_p}{off}")
    parser.add_argument("--min-p", type=float_in(0, 1), default=0.0, help="default 0 (off)")
    # the sampler's ranges (SamplingParams): checked here, they read as the flag's usage error
    parser.add_argument("--repetition-penalty", type=float_in(0.01, 100), default=1.0, help="default 1.0 (off)")
    parser.add_argument(
        "--stop", action="append", default=[], type=_stop_string, help="stop string (repeatable; not printed)"
    )
    parser.add_argument("--seed", type=SEED, default=None, help=seed_help)


def _stop_string(text: str) -> str:
    """An argparse type: a non-empty stop string (an empty one was refused only after the model had loaded)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (it matches everywhere); give a string or leave it out")
    return text


def greedy_ignores(args: argparse.Namespace, top_p_default: float = 1.0) -> str | None:
    """The warning for sampling options given with --temperature 0 (greedy: generate's default), where they change
    nothing: greedy takes the likeliest token, which every filter keeps, and draws no random number to seed. A user
    who asked for --seed 3 or --top-p 0.9 got the greedy text, the same for every seed, and no word; None when
    nothing given is left unused. ``top_p_default``: the command's (chat's 0.95 is not the user's)."""
    if args.temperature != 0:
        return None
    unused = [
        name
        for name, given in (
            ("--top-k", args.top_k > 0),
            ("--top-p", args.top_p != top_p_default),
            ("--min-p", args.min_p > 0),
            ("--seed", args.seed is not None),
            ("--num-samples", getattr(args, "num_samples", 1) > 1),  # generate's: N copies of the greedy text
        )
        if given
    ]
    if not unused:
        return None
    return (
        f"{', '.join(unused)} change{'s' if len(unused) == 1 else ''} nothing with --temperature 0 (greedy: the "
        "likeliest token each step); give a --temperature above 0 to sample"
    )


def sampling_params(args: argparse.Namespace, **fields):
    """SamplingParams from the options ``add_sampling_arguments`` added, but the stop strings, which the callers
    match on the text they print (``stop.StopStringMatcher``)."""
    from cookmind.infer.sampling import SamplingParams

    return SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        **fields,
    )


def read_prompt_file(path: str) -> str:
    """A --prompt-file's text as it is ('-': standard input's, its bytes read as UTF-8)."""
    from cookmind.text_input import decode_utf8, read_utf8

    if path == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        return decode_utf8(stdin.read(), "standard input") if stdin is not None else sys.stdin.read()
    return read_utf8(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cookmind.cli import add_model_argument, int_in

    add_model_argument(parser)
    parser.add_argument(
        "--prompt",
        action="append",
        default=[],
        help="prompt text; repeat for a batch (printed one after another)",
    )
    parser.add_argument(
        "--prompt-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a prompt from a UTF-8 file's whole text, as it is (its final newline too); '-' reads what is piped in "
        "(... | cookmind generate MODEL --prompt-file -); repeatable, joining the --prompt ones in a batch after them",
    )
    parser.add_argument(
        "--num-samples",
        type=int_in(1),
        default=1,
        metavar="N",
        help="samples of each prompt (default 1; with a --temperature above 0 they differ); with --seed, sample k "
        "draws from SEED + k, as the server's n choices for that prompt and seed",
    )
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the chat template")
    parser.add_argument("--system", default=None, help="system prompt (with --chat)")
    parser.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP)
    add_sampling_arguments(parser, max_new_tokens=128, temperature=0.0, top_p=1.0)
    parser.add_argument(
        "--keep-special-tokens",
        action="store_true",
        help="print the control tokens the model generates (<|im_start|>, ...); left out by default. Not with "
        "--chat, whose reply ends at the first one",
    )
    parser.add_argument(
        "--raw",
        action="store_true",
        help="print the text exactly as generated, control characters included. By default those other than newline "
        "and tab, and the bidirectional controls, are printed escaped (\\x1b, \\r, \\u202e), to a pipe as to a "
        "terminal (a pipe often ends on one: | less, | tee): raw, an ESC the model wrote drives the terminal (clears "
        "it, sets its title, writes the clipboard), a \\r overwrites the line and a right-to-left override shows the "
        "line reordered",
    )
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    parser.add_argument(
        "--dtype", default=None, help="float32 | bfloat16 | float16 (default: bfloat16 on CUDA, else the checkpoint's)"
    )


def main(args: argparse.Namespace) -> int:
    from cookmind.device import inference_dtype, resolve_device
    from cookmind.infer.detokenize import IncrementalDetokenizer, decode_text
    from cookmind.infer.generate import generate, stream
    from cookmind.infer.loading import load_for_inference
    from cookmind.infer.stop import (
        StopStringMatcher,
        chat_stop_ids,
        control_token_ids,
        spelled_stop_ids,
        text_stop_ids,
    )

    if not args.prompt and not args.prompt_file:
        print(
            "cookmind generate: error: give a prompt: --prompt TEXT or --prompt-file FILE ('-': standard input)",
            file=sys.stderr,
        )
        return 2
    if args.prompt_file.count("-") > 1:  # the second read found nothing: "--prompt 2 of 2 is empty"
        print("cookmind generate: error: --prompt-file - is given twice: standard input is read once", file=sys.stderr)
        return 2
    sources, typed = prompt_sources(args.prompt, args.prompt_file), len(args.prompt)
    args.prompt = [*args.prompt, *(read_prompt_file(f) for f in args.prompt_file)]
    if args.system is not None and not args.chat:  # it was dropped without a word: a raw prompt has no system turn
        print("cookmind generate: error: --system needs --chat (the prompt as a chat turn)", file=sys.stderr)
        return 2
    if args.keep_special_tokens and args.chat:  # it was accepted and did nothing
        print(
            "cookmind generate: error: --keep-special-tokens has nothing to show with --chat: a chat reply ends at "
            "its first control token and holds none; leave one of them out",
            file=sys.stderr,
        )
        return 2
    if warning := greedy_ignores(args):
        say("cookmind generate", "warning", warning)
    device = resolve_device(args.device)
    model, tok = load_for_inference(args.model, str(device), inference_dtype(args.dtype, device), args.tokenizer)
    stops = chat_stop_ids(tok) if args.chat else text_stop_ids(tok, getattr(model, "config", None))
    stops = tuple(sorted({*stops, *spelled_stop_ids(tok, args.stop)}))  # --stop "<|im_start|>" is that token
    skip = frozenset() if args.keep_special_tokens else control_token_ids(tok)
    cfg = sampling_params(args, stop_token_ids=stops)
    prompts = []
    for text in args.prompt:
        if args.chat:
            msgs = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": text}
            ]
            prompts.append(tok.render_prompt(msgs))
        else:
            prompts.append(prompt_ids(tok, text))  # Llama's <s> first, as the model's documents began
    context = model.config.max_position_embeddings
    for i, prompt in enumerate(prompts):
        # said before the context's warning, once; a chat's empty message too (its template makes tokens of it)
        if not prompt or not args.prompt[i]:
            raise ValueError(f"{sources[i]} is empty: give some text to continue")
        if len(prompt) >= context:  # named here, where its text is known (generate knows its row only)
            named = _prompt_named(args.prompt, sources, i, len(prompt), args.chat)
            raise ValueError(f"{named} fills the model's context of {context} tokens; shorten it")
    for i, prompt in enumerate(prompts):  # each prompt's own room: a long one does not cut the others' answers
        room = context - len(prompt)
        if room < args.max_new_tokens:  # the answer is cut where the context ends: say so before it is
            named = sources[i] if len(prompts) == 1 else _prompt_named(args.prompt, sources, i, len(prompt), args.chat)
            print(
                f"cookmind generate: warning: the model's context of {context} tokens leaves room for {room} new "
                f"tokens after {named}, fewer than --max-new-tokens {args.max_new_tokens}; its answer stops there",
                file=sys.stderr,
            )
    show = (lambda text: text) if args.raw else escape_controls
    n = args.num_samples
    if len(prompts) > 1 or n > 1:  # a batch: generate together, print each
        batch_cfg = cfg.replace(stop_strings=tuple(args.stop))  # rows end at a stop string
        if n == 1:
            outs = generate(model, prompts, batch_cfg, tok)
        else:  # a call per prompt: its sample k is row k, seeded SEED + k as the server's choice k of n
            outs = [out for prompt in prompts for out in generate(model, [prompt] * n, batch_cfg, tok)]
        for row, out in enumerate(outs):
            i, k = divmod(row, n)
            text = args.prompt[i]
            stopper = StopStringMatcher(args.stop)  # the text before it (a stop string is not printed)
            reply, hit = stopper.feed(decode_text(tok, out, skip))
            reply += stopper.flush()
            # the prompt too: its text may come from a file (--prompt "$(cat f)"), as /history shows a chat's escaped
            sample = f"sample {k + 1} of {n}: " if n > 1 else ""
            print(f"=== {sample}{show(text)}\n{show(ChatView().show(reply, end=True) if args.chat else reply)}")
            why = why_no_text(reply, len(out), hit, args.chat, args.raw)
            if why:
                which = f"--prompt {text!r}" if i < typed else sources[i]
                which += f" (sample {k + 1} of {n})" if n > 1 else ""
                print(f"cookmind generate: no text for {which}: {why}", file=sys.stderr)
        return 0
    detok, stopper = IncrementalDetokenizer(tok, skip_ids=skip), StopStringMatcher(args.stop)
    view = ChatView() if args.chat else None
    said, tokens, hit = "", 0, False
    try:
        for token in stream(model, prompts[0], cfg):
            tokens += 1
            piece, hit = stopper.feed(detok.add(token))
            said += piece
            sys.stdout.write(show(view.show(piece, end=hit) if view else piece))
            sys.stdout.flush()
            if hit:
                break
    except KeyboardInterrupt:  # the line ends before 'cookmind generate: interrupted', not after the last word
        sys.stdout.write("\n")
        sys.stdout.flush()
        raise
    if not hit:  # it ran to its end (no --stop string): the text held back follows
        rest, hit = stopper.feed(detok.flush())  # a stop string the held end of a character completes
        rest += stopper.flush()
        said += rest
        sys.stdout.write(show(view.show(rest, end=True) if view else rest))
    sys.stdout.write("\n")
    why = why_no_text(said, tokens, hit, args.chat, args.raw)
    if why:
        print(f"cookmind generate: no text: {why}", file=sys.stderr)
    return 0


def why_no_text(said: str, tokens: int, stopped: bool, chat: bool, raw: bool = False) -> str | None:
    """Why a reply printed no text, nothing but whitespace in its reasoning and answer alike, in the words generate
    (on stderr) and chat (in the conversation) both use; None when it printed text. An empty line alone leaves the
    user guessing: an undertrained model often ends at once (its first token is <|endoftext|> or <|im_end|>, never
    printed), or writes only markup a chat reply does not show (a stray </think>), or only blank lines.

    ``said``: the reply's text as generated, up to a --stop string (control tokens left out, think tags in);
    ``tokens``: how many the model generated (not the end token); ``stopped``: it ended at a --stop string; ``chat``:
    a chat reply, whose think tags are not shown; ``raw``: printed unescaped (an escaped control character shows)."""
    shown = "".join(split_reasoning(said)) if chat else said
    if (shown if raw else escape_controls(shown)).strip():
        return None
    if stopped:  # it said the tokens were control tokens, where the model wrote the stop string's text
        return "the output began with a --stop string, and a stop string and what follows are not printed"
    if tokens == 0:
        if chat:  # the words of the web page too
            return "the model ended its turn at once"
        return "the model ended the completion at once (its first token was an end token, which is not printed)"
    were = f"the model's {tokens} token was" if tokens == 1 else f"the model's {tokens} tokens were"
    if said.strip():  # in a chat reply: a </think> that closes no reasoning, an empty <think></think>
        return f"{were} only <think>/</think> markup, which is not printed: {_head(said.strip())}"
    if said:
        return f"{were} only whitespace: {_head(said)}"
    return f"{were} control tokens, which are not printed (--keep-special-tokens prints them)"


def _head(text: str, chars: int = 60) -> str:
    """The first ``chars`` characters of text, quoted and escaped as Python writes a string (… when there is more)."""
    return repr(text[:chars]) + ("…" if len(text) > chars else "")


def prompt_sources(prompts: list[str], files: list[str]) -> list[str]:
    """Each prompt of the batch as the user gave it (the --prompt ones first): "the prompt" (one --prompt alone),
    "--prompt 2 of 3", or "--prompt-file notes.txt" ("--prompt-file - (standard input)")."""
    n = len(prompts) + len(files)
    named = ["the prompt" if n == 1 else f"--prompt {i + 1} of {n}" for i in range(len(prompts))]
    return named + [f"--prompt-file {f}" + (" (standard input)" if f == "-" else "") for f in files]


def _prompt_named(texts: list[str], sources: list[str], i: int, tokens: int, chat: bool) -> str:
    """Prompt i with its size: "the prompt (N tokens)", "--prompt 2 of 3 ('its first words…', N tokens)" or
    "--prompt-file notes.txt (N tokens)" (its file names it)."""
    size = f"{tokens} tokens{' with the chat template' if chat else ''}"
    if not sources[i].startswith("--prompt "):
        return f"{sources[i]} ({size})"
    words = texts[i].split()
    head = " ".join(words[:6]) + ("…" if len(words) > 6 else "")
    return f"{sources[i]} ({head!r}, {size})"


class ChatView:
    """A chat reply's text as `cookmind chat` shows it: split by the reasoning splitter (the one rule of the server
    and the chat), reasoning after "[thinking] ", the answer on a line of its own after it."""

    def __init__(self):
        from cookmind.infer.reasoning import ReasoningSplitter

        self.splitter, self.kind = ReasoningSplitter(), None

    def show(self, piece: str, end: bool = False) -> str:
        """The text to print for the next piece of the reply; ``end``: it is the last."""
        reasoning, content = self.splitter.feed(piece)
        if end:
            r, c = self.splitter.flush()
            reasoning, content = reasoning + r, content + c
        out = ""
        if reasoning:
            out += ("" if self.kind == "reasoning" else "[thinking] ") + reasoning
            self.kind = "reasoning"
        if content:
            out += ("\n" if self.kind == "reasoning" else "") + content
            self.kind = "content"
        return out
