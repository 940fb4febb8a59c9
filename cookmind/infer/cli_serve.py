"""`cookmind serve MODEL` (or `--model MODEL`): the OpenAI-compatible server and web chat page."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cookmind.cli import add_model_argument

    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("COOKMIND_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1 (default: $COOKMIND_API_KEY, else none)")
    parser.add_argument("--model-name", default=None, help="the model id clients send (default: the directory name)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on CUDA)")
    parser.add_argument("--max-batch", type=int, default=None, help="concurrent sequences (default: from the KV budget)")
    parser.add_argument("--kv-cache-mb", type=int, default=1024, help="KV cache memory budget in MiB")
    parser.add_argument("--max-seq-len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument("--max-queue", type=int, default=256, help="waiting requests before answering 429")
    parser.add_argument("--kv-layout", choices=["paged", "slots"], default="paged",
                        help="paged: blocks from one pool, taken as sequences grow (default); slots: a whole context "
                             "per sequence")
    parser.add_argument("--block-size", type=int, default=16, help="positions per KV block (paged)")
    parser.add_argument("--prefix-cache", action="store_true",
                        help="share full KV blocks of common prompt prefixes between requests (paged; off by default)")
    parser.add_argument("--decode-attention", choices=["auto", "kernel", "gather"], default="auto",
                        help="kernel: the Triton paged decode-attention kernel (auto picks it on CUDA); gather: "
                             "copy each row's blocks and run SDPA")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on CUDA")
    parser.add_argument("--no-compile", action="store_true", help="do not torch.compile the forward on CUDA")


def build_app(args: argparse.Namespace):
    """Load the model and return (FastAPI app, engine)."""
    import torch

    from cookmind.infer.engine import Engine
    from cookmind.infer.loading import load_for_inference
    from cookmind.infer.server import create_app

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else None)
    model, tokenizer = load_for_inference(args.model, device, dtype, args.tokenizer)
    engine = Engine(model, num_slots=args.max_batch, max_seq_len=args.max_seq_len,
                    kv_budget_bytes=args.kv_cache_mb * 2**20, max_waiting=args.max_queue,
                    cuda_graphs=False if args.no_cuda_graphs else None, kv_cache=args.kv_layout,
                    block_size=args.block_size, compile=False if args.no_compile else None,
                    prefix_cache=args.prefix_cache, decode_attention=args.decode_attention)
    name = args.model_name or Path(args.model).resolve().name
    return create_app(engine, tokenizer, name, api_key=args.api_key), engine


def main(args: argparse.Namespace) -> int:
    import uvicorn

    app, engine = build_app(args)
    print(f"cookmind serve: {args.model} as '{app.state.model_name}' on http://{args.host}:{args.port}  "
          f"({engine.num_slots} sequences x {engine.max_seq_len} tokens, {args.kv_layout} KV cache "
          f"{engine.kv_blocks() or ''}{', prefix cache on' if args.prefix_cache else ''}; web chat at /)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
