"""Per-request LoRA serving cost: the engine decoding a batch whose rows use different adapters, against the same
engine serving the base alone (its peer, in the same process): the figure is a ratio.

Workload: B prompts of P random tokens, N new tokens each, greedy, no early stop. With adapters, the rows cycle
through the base and each of A adapters (rank R on every projection: q, k, v, o, gate, up, down). Figures (one JSON
line each): decode tokens/s = B*N / (wall time of the whole generation, prefill included) per engine and batch size,
and the adapters' tokens/s over the base's.

    python bench/bench_multi_lora.py                        # GPT-2-small-sized Llama shape, CUDA, bf16
    python bench/bench_multi_lora.py --tiny --device cpu    # a seconds-long smoke run on CPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from cookmind.infer.engine import Engine
from cookmind.infer.loading import load_adapters
from cookmind.infer.sampling import SamplingParams
from cookmind.model import CookMindConfig, CookMindLM
from cookmind.model.lora import DEFAULT_TARGETS, apply_lora, lora_modules, save_adapter


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def make_adapters(base: CookMindLM, n: int, r: int, directory: Path) -> dict[str, Path]:
    """n random rank-r adapters on every projection of base, saved as cookmind adapters."""
    out = {}
    for i in range(n):
        model = CookMindLM(base.config)
        model.load_state_dict(base.state_dict())
        apply_lora(model, r=r, alpha=2.0 * r, targets=DEFAULT_TARGETS)
        with torch.no_grad():
            for _, m in lora_modules(model):
                m.lora_B.weight.normal_(0, 0.02)
        out[f"a{i}"] = save_adapter(directory / f"a{i}", model)
    return out


def run(engine: Engine, prompts: list[list[int]], names: list[str | None], new: int) -> float:
    """Wall seconds to generate `new` tokens for every prompt, all submitted at once."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for p, name in zip(prompts, names):
        engine.submit(p, params, adapter=name)
    engine.run_until_idle()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="a tiny model and workload: a CPU smoke run")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.intermediate, args.vocab = 2, 64, 4, 128, 256
        args.prompt_len, args.new_tokens, args.batch_sizes, args.repeats = 16, 16, "1,4", 1
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    torch.manual_seed(0)
    cfg = CookMindConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.prompt_len + args.new_tokens + 1,
    )
    base = CookMindLM(cfg).eval()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        specs = make_adapters(base, args.adapters, args.rank, Path(tmp))
        adapters = load_adapters(base, specs)
    tps = {}
    for label, engine_adapters in [("base", None), ("adapters", adapters)]:
        model = CookMindLM(cfg)
        model.load_state_dict(base.state_dict())
        model = model.to(args.device, dtype).eval()
        t0 = time.perf_counter()
        engine = Engine(
            model,
            num_slots=max(batches),
            max_seq_len=cfg.max_position_embeddings,
            prefill_chunk=max(batches) * args.prompt_len,
            adapters=engine_adapters,
        )
        emit(figure="setup_s", engine=label, seconds=round(time.perf_counter() - t0, 2))
        cycle = [None, *engine.adapter_names]
        for b in batches:
            prompts = torch.randint(0, cfg.vocab_size, (b, args.prompt_len)).tolist()
            names = [cycle[i % len(cycle)] for i in range(b)] if label == "adapters" else [None] * b
            run(engine, prompts, names, args.new_tokens)  # warm-up
            wall = min(run(engine, prompts, names, args.new_tokens) for _ in range(args.repeats))
            tps[label, b] = b * args.new_tokens / wall
            emit(figure="decode_tokens_per_s", engine=label, batch=b, tokens_per_s=round(tps[label, b], 1))
        emit(figure="compile", engine=label, compiled=engine.runner.compiled, error=engine.runner.compile_error)
    for b in batches:
        emit(
            figure="adapters_over_base",
            batch=b,
            adapters=args.adapters,
            rank=args.rank,
            ratio=round(tps["adapters", b] / tps["base", b], 3),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
