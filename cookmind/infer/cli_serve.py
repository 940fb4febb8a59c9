"""`cookmind serve MODEL` (or `--model MODEL`): the OpenAI-compatible server and web chat page."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from cookmind.device import DEVICE_HELP
from cookmind.terminal import say_from_handler

API_KEY_ENV = "COOKMIND_API_KEY"
DEFAULT_SLOTS = 32  # concurrent sequences when --max-batch is not given
KV_CAP_BYTES = 1024 * 2**20  # the default KV pool never exceeds this; --kv-cache-mb overrides

ENDPOINTS = f"""endpoints (at the default --host and --port):
  web chat page: http://127.0.0.1:8000/      health: GET /health      Prometheus metrics: GET /metrics
  OpenAI API: POST /v1/chat/completions, POST /v1/completions, GET /v1/models
any OpenAI client: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY)   (KEY: {API_KEY_ENV} or --api-key;
  any text when the server has none). The model id a request names is --model-name, or a --lora NAME."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cookmind.cli import add_model_argument, float_in, int_in
    from cookmind.infer.cli_generate import TOKENIZER_HELP

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ENDPOINTS
    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int_in(1, 65535), default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on everything but the web page and /health; prefer "
        f"the environment variable {API_KEY_ENV} (argv is visible to other local users)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to serve besides the bind address, localhost and IP addresses (e.g. the "
        "machine's DNS name behind a proxy); repeatable; '*' serves any (no DNS-rebinding check)",
    )
    parser.add_argument(
        "--root-path",
        type=root_path_arg,
        default=None,
        metavar="PATH",
        help="the prefix a reverse proxy serves the server under (e.g. /llm, for https://host/llm/): the proxy may "
        "pass /llm/... on as it came or strip /llm, both are served (default: none)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float_in(0, above=True),
        default=4.0,
        help="larger request bodies are refused with 413 (default 4)",
    )
    parser.add_argument(
        "--model-name",
        default=None,
        help="the model id clients send (default: the directory's name; a run's checkpoints/ folder: the run's, a "
        "step in it RUN-STEP)",
    )
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="serve a LoRA adapter (a LoRA training run or checkpoint, cookmind's save_adapter output or a PEFT "
        "save_pretrained folder for this base) "
        "under the model id NAME; repeatable; requests for different adapters and the base share batches",
    )
    parser.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP)
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on CUDA)")
    parser.add_argument(
        "--max-batch",
        type=int_in(1),
        default=None,
        help=f"concurrent sequences (default {DEFAULT_SLOTS}; with --kv-layout slots and --kv-cache-mb, the whole "
        "contexts it holds); lowered, and said so at start-up, to what the KV cache can run at once",
    )
    parser.add_argument(
        "--kv-cache-mb",
        type=int_in(1),
        default=None,
        help=f"KV cache memory budget in MiB (default: room for every sequence's whole context, at "
        f"most {KV_CAP_BYTES // 2**20})",
    )
    parser.add_argument("--max-seq-len", type=int_in(2), default=None, help="context length (default: the model's)")
    parser.add_argument(
        "--max-queue", type=int_in(1), default=256, help="waiting requests before answering 429 (default 256)"
    )
    parser.add_argument(
        "--kv-layout",
        choices=["paged", "slots"],
        default="paged",
        help="paged: blocks from one pool, taken as sequences grow (default); slots: a whole context per sequence",
    )
    parser.add_argument("--block-size", type=int_in(1), default=None, help="positions per KV block (paged; default 16)")
    parser.add_argument(
        "--prefix-cache",
        action="store_true",
        help="share full KV blocks of common prompt prefixes between requests (paged; off by default)",
    )
    parser.add_argument(
        "--decode-attention",
        choices=["auto", "kernel", "gather"],
        default="auto",
        help="kernel: the Triton paged decode-attention kernel (auto picks it on CUDA); gather: "
        "copy each row's blocks and run SDPA",
    )
    parser.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        default=None,
        help="speculative decoding of greedy requests (temperature 0, no logprobs or penalties): ngram drafts "
        "by looking the output's last tokens up in the prompt and output (pays when answers copy their input: "
        "summaries, edits, code, extraction); draft proposes with --draft-model. Output is unchanged; it pays "
        "at small batches, where a decode step is bound by reading the weights",
    )
    parser.add_argument(
        "--num-speculative-tokens", type=int_in(1), default=None, help="tokens drafted per step (k; default 4)"
    )
    parser.add_argument(
        "--speculative-sampled",
        action="store_true",
        help="requests with temperature > 0 speculate too (speculative sampling: the same distribution, but a "
        "seed draws other tokens than without speculation)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="with --speculative draft: a small cookmind checkpoint trained with the model's tokenizer",
    )
    parser.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on CUDA")
    parser.add_argument("--no-compile", action="store_true", help="do not torch.compile the forward on CUDA")


def root_path_arg(text: str) -> str:
    """An argparse type: --root-path as the app keeps it ('/llm/' -> '/llm'), else a usage error saying why."""
    from cookmind.infer.server.app import check_root_path

    try:
        return check_root_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def kv_sizing(model, args: argparse.Namespace) -> tuple[int, int, str]:
    """(num_slots, kv_budget_bytes, note) for the Engine; the note is the start-up line saying what the cache holds
    and what was changed. By default the cache holds the batch's whole contexts, capped at KV_CAP_BYTES (it then
    holds fewer); --kv-cache-mb sets it. The batch is --max-batch (default DEFAULT_SLOTS; with --kv-layout slots and
    --kv-cache-mb, the whole contexts it holds), lowered, and said so, to what the cache can run at once (a paged
    sequence holds a block at the least). ValueError when the cache cannot hold one sequence of the whole context."""
    cfg = model.config
    context = args.max_seq_len or cfg.max_position_embeddings
    elem = next(model.parameters()).element_size()
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.resolved_head_dim * elem  # K and V
    paged, mb = args.kv_layout == "paged", args.kv_cache_mb
    # the cache's unit: a block (paged; the pool has one more, its scratch block) or a whole context (slots; the
    # runner adds a scratch column to each)
    unit_tokens = block_size(args) if paged else context
    unit_bytes = per_token * (unit_tokens if paged else context + 1)
    per_seq, scratch = -(-context // unit_tokens), int(paged)  # units one whole-context sequence fills
    asked = None if not paged and mb is not None and args.max_batch is None else args.max_batch or DEFAULT_SLOTS
    if mb is not None:
        units, source = mb * 2**20 // unit_bytes - scratch, f"--kv-cache-mb {mb}"
        if units < per_seq:
            need = -(-(per_seq + scratch) * unit_bytes // 2**20)
            raise ValueError(
                f"--kv-cache-mb {mb} holds {max(units, 0) * unit_tokens:,} tokens of KV cache, less than one "
                f"sequence of the {context:,}-token context; give --kv-cache-mb {need} or more, or a lower "
                "--max-seq-len"
            )
    else:
        units, source = asked * per_seq, "default: the batch's whole contexts"
        if (units + scratch) * unit_bytes > KV_CAP_BYTES:
            units = KV_CAP_BYTES // unit_bytes - scratch
            source = f"default, capped at {KV_CAP_BYTES // 2**20} MiB; --kv-cache-mb sets it"
            if units < per_seq:  # one whole context outgrows the cap (an imported long-context model): it holds one
                units = per_seq
                source = (
                    f"default: one whole {context:,}-token context, past the {KV_CAP_BYTES // 2**20} MiB the default "
                    "otherwise keeps to; --kv-cache-mb or a lower --max-seq-len sets it"
                )
    slots = min(asked or 256, units)  # 256: the engine's most slots from a budget
    if not paged:
        units = slots  # the slots allocated, whatever the budget held beyond them
    if asked is None:
        batch = f"batch {slots}, the whole contexts it holds"
    elif slots < asked:
        why = "a running sequence holds a block at the least" if paged else "each sequence holds a whole context"
        given = f"--max-batch {asked}" if args.max_batch else f"the default batch of {asked}"
        batch = f"{given} lowered to {slots} ({why}); raise --kv-cache-mb to run more"
    else:
        shorter = f" (all at once when each fills {units // slots * unit_tokens:,} tokens or fewer)"
        shorter = shorter if paged and slots > units // per_seq else ""
        batch = f"batch {slots}{shorter}"
    note = (
        f"KV cache {(units + scratch) * unit_bytes / 2**20:.1f} MiB ({source}): {units:,} "
        f"{f'blocks of {unit_tokens}' if paged else 'slots'} = {units * unit_tokens:,} tokens, "
        f"{units // per_seq:,} sequence(s) of the whole {context:,}-token context; {batch}"
    )
    return slots, (units + scratch) * unit_bytes, note


def speculative_config(args: argparse.Namespace, tokenizer, device: str, dtype):
    """The Engine's SpeculativeConfig from --speculative / --num-speculative-tokens / --draft-model (None: off)."""
    from cookmind.infer.speculative import SpeculativeConfig, load_draft_model

    method = getattr(args, "speculative", None)
    draft_path = getattr(args, "draft_model", None)
    if method == "draft" and draft_path is None:
        raise ValueError("--speculative draft needs --draft-model PATH (a small checkpoint with the model's tokenizer)")
    if method != "draft" and draft_path is not None:
        raise ValueError("--draft-model is used only with --speculative draft; add that or drop --draft-model")
    if method is None:
        return None
    draft = load_draft_model(draft_path, tokenizer, device, dtype, progress=True) if draft_path is not None else None
    return SpeculativeConfig(
        method,
        num_tokens=speculative_tokens(args),
        draft_model=draft,
        sampled=getattr(args, "speculative_sampled", False),
    )


def default_model_id(path) -> str:
    """The model id a server without --model-name serves: its folder's name, but a run's ``checkpoints/`` folder is
    the run ("checkpoints" named no model) and a step folder in it RUN-STEP (no slash: /v1/models/ID holds one)."""
    p = Path(path).resolve()
    if p.name == "checkpoints":
        return p.parent.name
    if p.parent.name == "checkpoints":
        return f"{p.parent.parent.name}-{p.name}"
    return p.name


def lora_note(path) -> str | None:
    """The start-up line for a LoRA checkpoint (or run) served as the model: it holds the weights with the adapter
    merged in (served) beside the adapter itself, which --lora serves on its base instead; None for any other model."""
    from cookmind.model import resolve_model_dir
    from cookmind.model.lora import ADAPTER_CONFIG, adapter_base

    checkpoint = resolve_model_dir(path)
    if not (checkpoint / ADAPTER_CONFIG).is_file():
        return None
    base = adapter_base(checkpoint)[0] or "BASE"
    return (
        f"cookmind serve: {checkpoint} is a LoRA checkpoint: served with its adapter merged into its base's weights; "
        f"to serve the adapter beside the base instead: cookmind serve {base} --lora NAME={path}"
    )


def build_app(args: argparse.Namespace):
    """Load the model and return (FastAPI app, engine)."""
    from cookmind.device import inference_dtype, resolve_device
    from cookmind.infer.engine import Engine
    from cookmind.infer.loading import load_adapters, load_for_inference, parse_lora_specs
    from cookmind.infer.server import create_app

    path = args.model  # --model or the positional, merged by cookmind.cli.finish_model_argument
    device = resolve_device(args.device)
    dtype = inference_dtype(args.dtype, device)
    device = str(device)
    name = args.model_name or default_model_id(path)
    specs = parse_lora_specs(args.lora, name)  # a malformed --lora fails before the model loads
    model, tokenizer = load_for_inference(path, device, dtype, args.tokenizer)
    context = model.config.max_position_embeddings
    if args.max_seq_len is not None and args.max_seq_len > context:  # positions it never saw: garbage, and KV memory
        raise ValueError(
            f"--max-seq-len {args.max_seq_len} exceeds the model's context of {context} tokens; use {context} or less"
        )
    adapters = load_adapters(model, specs, base_name=path, progress=True) if specs else None
    speculative = speculative_config(args, tokenizer, device, dtype)
    num_slots, kv_bytes, kv_note = kv_sizing(model, args)
    engine = Engine(
        model,
        num_slots=num_slots,
        max_seq_len=args.max_seq_len,
        kv_budget_bytes=kv_bytes,
        max_waiting=args.max_queue,
        cuda_graphs=False if args.no_cuda_graphs else None,
        kv_cache=args.kv_layout,
        block_size=block_size(args),
        compile=False if args.no_compile else None,
        prefix_cache=args.prefix_cache,
        decode_attention=args.decode_attention,
        adapters=adapters,
        speculative=speculative,
    )
    api_key = api_key_of(args)
    app = create_app(
        engine,
        tokenizer,
        name,
        api_key=api_key,
        allowed_hosts=[args.host, *args.allowed_host],
        max_body_bytes=int(args.max_body_mb * 2**20),
        root_path=args.root_path or "",
    )
    app.state.kv_note = kv_note  # main prints it beside the address
    return app, engine


def api_key_of(args: argparse.Namespace) -> str | None:
    """The key clients must send: --api-key, else the environment's COOKMIND_API_KEY, else None (no key).
    ValueError for an empty one (it served without a key, or took " " as one) or one with whitespace around it
    (a client's 'Authorization: Bearer KEY' cannot carry it: every request got 401)."""
    for name, key, fix in (
        ("--api-key", args.api_key, "give a key of visible characters, or leave --api-key out to serve without one"),
        (API_KEY_ENV, os.environ.get(API_KEY_ENV), f"set it to a key of visible characters, or unset {API_KEY_ENV}"),
    ):
        if key is None:
            continue
        if not key.strip():
            raise ValueError(f"{name} is empty{' (only whitespace)' if key else ''}; {fix}")
        if key != key.strip():
            raise ValueError(f"{name} starts or ends with whitespace, which no client can send; give it without")
        if odd := next((c for c in key if not (c.isascii() and c.isprintable())), None):
            raise ValueError(
                f"{name} holds {odd!r}, which an HTTP header cannot carry (no client could send the key); "
                "give a key of visible ASCII characters"
            )
        return key
    return None


def block_size(args: argparse.Namespace) -> int:
    """--block-size, 16 when not given (None: given or not is what refuse_unused_flags reads)."""
    return 16 if getattr(args, "block_size", None) is None else args.block_size


def speculative_tokens(args: argparse.Namespace) -> int:
    """--num-speculative-tokens, 4 when not given."""
    return 4 if getattr(args, "num_speculative_tokens", None) is None else args.num_speculative_tokens


def refuse_unused_flags(args: argparse.Namespace) -> None:
    """Refuse a flag the server would not use (it started as if the flag were not given), before the model loads;
    the ones left unset (None) read their defaults where they are used (``block_size``, ``speculative_tokens``)."""
    if not getattr(args, "speculative", None):
        for flag, given in (
            ("--speculative-sampled", getattr(args, "speculative_sampled", False)),
            ("--num-speculative-tokens", getattr(args, "num_speculative_tokens", None) is not None),
        ):
            if given:
                raise ValueError(f"{flag} is used only with --speculative (ngram or draft); add that or drop {flag}")
    if args.kv_layout == "slots":
        for flag, given, why in (
            ("--block-size", args.block_size is not None, "a slots cache holds a whole context per sequence"),
            ("--prefix-cache", getattr(args, "prefix_cache", False), "requests share the paged cache's blocks"),
            (
                "--decode-attention kernel",
                getattr(args, "decode_attention", None) == "kernel",
                "the kernel reads the paged cache's blocks",
            ),
        ):
            if given:
                raise ValueError(f"{flag} is for --kv-layout paged ({why}); drop it, or use --kv-layout paged")
    if args.model_name is not None and not args.model_name.strip():
        raise ValueError("--model-name is empty; give the id clients send, or leave it out for the directory's name")


def check_port_free(host: str, port: int) -> None:
    """Refuse an address already in use before the model loads (minutes on a GPU with compile and graphs): the
    server would otherwise announce itself and then fail to bind."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise OSError(
            f"--host {host}: cannot be resolved ({exc.strerror}); give an address or a name of this machine "
            "(default 127.0.0.1; 0.0.0.0 listens on all of them)"
        ) from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: only a live listener clashes
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise OSError(
                    f"--host {host}: not an address of this machine ({exc.strerror}); give one of its addresses "
                    "(default 127.0.0.1; 0.0.0.0 listens on all of them)"
                ) from None
            raise OSError(
                f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or stop what uses it"
            ) from None


def server_url(host: str, port: int) -> str:
    """The address a browser or client opens: an IPv6 address in brackets (http://[::1]:8000; "::1:8000" is none)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server listens beyond this machine with no API key: anyone who reaches the port may use
    it (the Host check stops DNS rebinding, not a caller that uses the IP address)."""
    import ipaddress

    if api_key or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve to any interface
        pass
    return (
        f"cookmind serve: warning: listening on {host} without an API key: anyone who can reach this port can use "
        f"the model; set {API_KEY_ENV}=KEY (clients send 'Authorization: Bearer KEY') or bind --host 127.0.0.1"
    )


def make_server(config, engine):
    """uvicorn's Server, stopping in three steps. The first stop signal (Ctrl-C, SIGTERM) waits for the requests in
    flight to finish, as uvicorn does, and says how many (its own note is hidden at log level warning: a long answer
    made a stopping server look hung). The second cuts their generations in the engine, each client told so
    (``shutdown``: a 503, or a stream's finish_reason "error" and its error event; a request its handler hands over
    afterwards is a 503 too), and the server then stops as after the first; it was
    uvicorn's force exit, a traceback per request on the console and a plain-text 500. A third Ctrl-C is that force
    exit, quietly."""
    import logging

    import uvicorn

    class Server(uvicorn.Server):
        signals = 0

        def in_flight(self) -> int:
            """Requests running: the engine's, or the HTTP requests uvicorn handles (one accepted whose handler has
            not handed it to the engine yet counts too: a fresh server, a long prompt to tokenize)."""
            engine_busy = sum(r is not None for r in engine.slots) + len(engine.waiting)
            state = getattr(self, "server_state", None)
            return max(engine_busy, len(getattr(state, "tasks", ())))

        def handle_exit(self, sig, frame) -> None:
            self.signals += 1
            busy = self.in_flight()
            if self.signals == 2 and busy:
                engine.close_to_new("shutdown")  # a request handed over from now on is a 503, not a generation
                captured = getattr(self, "_captured_signals", None)  # uvicorn's private record, absent from older
                if captured is not None:  # ones: a Ctrl-C still exits 130 ('interrupted') where it is kept
                    captured.append(sig)
                cut = engine.cancel_all("shutdown")
                say_from_handler(
                    f"cookmind serve: stopping now: cutting {cut} request(s), each client told so; Ctrl-C again "
                    "quits at once"
                )
                return
            if self.signals > 1 and sig == signal.SIGINT:  # uvicorn's force exit: its tracebacks of every
                logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL + 1)  # request cut are no news
            super().handle_exit(sig, frame)
            if self.signals == 1 and busy:
                say_from_handler(
                    f"cookmind serve: stopping: waiting for {busy} request(s) to finish; Ctrl-C again stops at once "
                    "(cutting them)"
                )

    return Server(config)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    api_key = api_key_of(args)  # before the port and the model: a bad key fails at once
    refuse_unused_flags(args)
    check_port_free(args.host, args.port)
    warning = exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    app, engine = build_app(args)
    root = f"{args.root_path}/" if args.root_path else ""
    print(
        f"cookmind serve: {args.model} as '{app.state.model_name}' on {server_url(args.host, args.port)}{root}  "
        f"({args.kv_layout} KV cache"
        f"{', prefix cache on' if args.prefix_cache else ''}"
        f"{f', speculative {args.speculative} k={speculative_tokens(args)}' if args.speculative else ''}"
        f"; web chat at {root or '/'})"
        + f"\ncookmind serve: {app.state.kv_note}"
        + (f"\n{note}" if (note := lora_note(args.model)) else "")
        + (f"\n  LoRA adapters (model ids): {', '.join(engine.adapter_names)}" if engine.adapter_names else ""),
        flush=True,
    )
    server = make_server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"), engine)
    server.run()
    # uvicorn re-raises a SIGINT it shut down on, but asyncio.run's own SIGINT handler swallows that: Ctrl-C is
    # 'cookmind serve: interrupted', 130 (the record is uvicorn's, private: an older one without it exits 0)
    if signal.SIGINT in getattr(server, "_captured_signals", ()):
        raise KeyboardInterrupt
    return 0 if server.started else 3  # uvicorn.run's STARTUP_FAILURE
