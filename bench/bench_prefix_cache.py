"""Prefix caching in the serving engine: the same requests with the cache off and on, in one run.

    python bench/bench_prefix_cache.py                 # CPU, one thread: 16 requests sharing a 496-token prefix
    python bench/bench_prefix_cache.py --device cuda   # the same workload on a GPU

Each request is a shared "system prompt" plus its own 16-token tail; greedy, 16 new tokens each. Prints one
JSON line per setting (wall seconds, prompt tokens, prompt tokens served from the cache) and whether the
outputs are equal (they must be: sharing blocks changes no arithmetic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.infer.engine import Engine, TokenEvent  # noqa: E402
from cookmind.infer.sampling import SamplingParams  # noqa: E402
from cookmind.model import CookMindConfig, CookMindLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=496)
    ap.add_argument("--tail-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = CookMindConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    model = CookMindLM(cfg).eval().to(args.device)
    g = torch.Generator().manual_seed(1)
    system = torch.randint(0, 1024, (args.prefix_len,), generator=g).tolist()
    prompts = [system + torch.randint(0, 1024, (args.tail_len,), generator=g).tolist() for _ in range(args.requests)]
    outs = {}
    for prefix in (False, True):
        eng = Engine(model, num_slots=4, max_seq_len=1024, prefill_chunk=512, block_size=16, prefix_cache=prefix)
        t0 = time.perf_counter()
        reqs = [eng.submit(p, SamplingParams(temperature=0), args.new_tokens) for p in prompts]
        eng.run_until_idle()
        dt = time.perf_counter() - t0
        outs[prefix] = [[e.token_id for e in r.events(timeout=0) if isinstance(e, TokenEvent)] for r in reqs]
        m = eng.metrics()
        print(
            json.dumps(
                {
                    "figure": "prefix cache",
                    "device": args.device,
                    "requests": args.requests,
                    "prefix_len": args.prefix_len,
                    "prefix_cache": prefix,
                    "seconds": round(dt, 3),
                    "prompt_tokens": m["prompt_tokens_total"],
                    "cached_tokens": m.get("prefix_cache_hit_tokens", 0),
                }
            ),
            flush=True,
        )
    print(json.dumps({"figure": "prefix cache outputs equal", "equal": outs[True] == outs[False]}), flush=True)


if __name__ == "__main__":
    main()
