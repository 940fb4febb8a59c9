"""Decode benchmark: cookmind's engine vs Hugging Face transformers `generate`, same weights.

cookmind: the continuous-batching engine (paged KV cache, CUDA graphs of a torch.compile'd decode
          step around the Triton paged decode-attention kernel). --variants adds others in the same run:
          paged (the default engine), kernel-nosplit (the kernel with one program per row and head),
          gather (gather the rows' blocks, SDPA under a length mask, graphs per length bucket),
          paged-fused (gather with attention compiled too), slots (slot cache), graphs-eager (CUDA
          graphs of the uncompiled step, slot cache).
peer:     transformers `generate` with a static cache, which auto-compiles decoding with
          torch.compile (mode "reduce-overhead") on CUDA, on the same random weights exported
          with cookmind's HF export (`cookmind export --hf`).

Workload: B prompts of P random tokens, N new tokens each, greedy, no early stop.
Figures (one JSON line each): decode tokens/s = B*N / (wall time of the whole generation,
prefill included) at each batch size; time to first token at batch 1; greedy agreement.

    python bench/bench_decode.py                       # GPT-2-small-sized Llama shape, CUDA, bf16
    python bench/bench_decode.py --variants paged,gather,kernel-nosplit   # the A/B below
    python bench/bench_decode.py --tiny --device cpu   # a seconds-long smoke run on CPU

Measured on one H200 (torch 2.11), prompt 128, 256 new tokens; device ms per decode step (graph replay,
attention length 129 / 385) and tokens/s:
  2026-11-29, before the kernel:
  graphs-eager (slots, nothing compiled)         b1 1.30 / 1.31 ms   744 tok/s;  b64 1.63 / 1.74 ms  36.5k
  paged-fused  (whole layers compiled, SDPA in)  b1 0.77 / 0.79 ms  1202 tok/s;  b64 1.82 / 2.34 ms  29.3k
  slots, whole layers compiled                   b1 0.77 / 0.78 ms  1191 tok/s;  b64 3.35 / 3.47 ms  18.4k
  2026-11-30:
  gather (halves compiled around eager SDPA)     b1 0.79 / 0.80 ms  1127 tok/s;  b64 1.26 / 1.58 ms  40.7k
  paged (the kernel, split over programs)        b1 0.46 / 0.46 ms  1879 tok/s;  b64 0.56 / 0.81 ms  72.6k
  kernel-nosplit                                 b1 0.47 / 0.62 ms  1669 tok/s;  b64 0.56 / 0.81 ms  82.7k
  (the last two rows from different runs; tokens/s moves by ~10% between runs of the same engine)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.device import cuda_missing  # noqa: E402
from cookmind.infer.engine import Engine, TokenEvent  # noqa: E402
from cookmind.infer.sampling import SamplingParams  # noqa: E402
from cookmind.model import CookMindConfig, CookMindLM, load_model, save_model  # noqa: E402
from cookmind.model.hf import export_hf  # noqa: E402


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_weights(args, tmp: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    cfg = CookMindConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_pos,
        tie_word_embeddings=True,
    )
    model = CookMindLM(cfg)
    n_params = model.num_parameters()
    ckpt = save_model(tmp / "ckpt", model)
    hf_dir = export_hf(ckpt, tmp / "hf", dtype=args.torch_dtype)
    emit(
        figure="model",
        params=n_params,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab=args.vocab,
        dtype=args.dtype,
        device=args.device,
    )
    return ckpt, hf_dir


def run_cookmind(engine: Engine, prompts: list[list[int]], n_new: int):
    """Submit every prompt, step until idle; (seconds, mean TTFT seconds, outputs)."""
    sync(str(engine.device))
    t0 = time.perf_counter()
    reqs = [engine.submit(p, SamplingParams(temperature=0.0), n_new) for p in prompts]
    engine.run_until_idle()
    sync(str(engine.device))
    wall = time.perf_counter() - t0
    outs = [[ev.token_id for ev in r.events(timeout=0) if isinstance(ev, TokenEvent)] for r in reqs]
    assert all(len(o) == n_new for o in outs), "a request ended early"
    ttft = statistics.mean(r.first_token_at - r.submitted_at for r in reqs)
    return wall, ttft, outs


VARIANTS = {  # name -> Engine options (cuda_graphs is on for CUDA in all); "env" sets variables while it runs
    "paged": dict(kv_cache="paged"),  # the default: the paged decode kernel on CUDA
    "kernel-nosplit": dict(kv_cache="paged", decode_attention="kernel", env={"COOKMIND_DECODE_SPLITS": "1"}),
    "gather": dict(kv_cache="paged", decode_attention="gather"),
    "paged-fused": dict(kv_cache="paged", decode_attention="gather", compile_attention=True),
    "slots": dict(kv_cache="slots"),
    "graphs-eager": dict(kv_cache="slots", compile=False),
}


def replay_ms(engine: Engine, b: int, length: int, reps: int = 50) -> float | None:
    """Device time of one replayed decode step (all rows idle: same kernels, no state change), ms."""
    graphs = engine.graphs
    if graphs is None or not graphs.capture:
        return None
    bucket, n = graphs.bucket_for(b), graphs.length_for(length)
    graph = graphs.graphs[(bucket, n)]
    cache = engine.runner.cache
    paged = hasattr(cache, "set_row")
    if paged:  # every row gets its own real blocks, so the decode kernel reads `length` distinct positions
        per_row = -(-length // cache.block_size)
        for row in range(bucket):
            cache.set_row(row, list(range(1 + row * per_row, 1 + (row + 1) * per_row)))
        cache.sync_tables()
    # idle rows at the given length: nothing advances and writes go to the scratch column
    graphs.load([length - 1] * bucket, [0] * bucket)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    if paged:
        for row in range(bucket):
            cache.set_row(row, [])
        cache.sync_tables()
    engine._graph_key = None  # the engine reloads its rows at its next step
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def prefill_ms(engine: Engine, prompt: list[int], reps: int = 10) -> float:
    """Median wall time of the runner's forward over one prompt (what TTFT spends on the model), ms.
    Every write goes to the scratch column: the cache is unchanged."""
    runner, dev = engine.runner, engine.device
    t = len(prompt)
    tokens = torch.tensor([prompt], device=dev)
    positions = torch.arange(t, device=dev)[None]
    cols = torch.full((1, t), runner.scratch_col, dtype=torch.long, device=dev)
    times = []
    for _ in range(reps):
        sync(str(dev))
        t0 = time.perf_counter()
        runner.forward(tokens, positions, 0, t, write_cols=cols)
        sync(str(dev))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_cookmind(args, ckpt: Path, prompts_by_b: dict[int, list[list[int]]], variant: str = "paged"):
    model = load_model(ckpt, device=args.device, dtype=args.torch_dtype).eval()
    options = dict(VARIANTS[variant])
    env = options.pop("env", {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _bench_engine(args, model, prompts_by_b, variant, options)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bench_engine(args, model, prompts_by_b, variant, options):
    t0 = time.perf_counter()
    max_b = max(prompts_by_b)
    kw = dict(
        num_slots=max_b,
        max_seq_len=args.prompt_len + args.new_tokens + 1,
        prefill_chunk=max_b * args.prompt_len,
        **options,
    )
    try:
        engine = Engine(model, cuda_graphs=args.device.startswith("cuda"), **kw)
    except Exception as exc:  # report, then measure the eager path rather than nothing
        emit(figure="cuda_graphs_failed", variant=variant, error=f"{type(exc).__name__}: {exc}"[:500])
        engine = Engine(model, cuda_graphs=False, **kw)
    emit(
        figure="cookmind_setup_s",
        variant=variant,
        seconds=round(time.perf_counter() - t0, 2),
        cuda_graph_buckets=engine.graphs.buckets if engine.graphs else None,
        length_buckets=engine.graphs.length_buckets if engine.graphs else None,
        compiled=engine.runner.compiled,
        compile_error=engine.runner.compile_error,
        decode_attention=engine.runner.decode_attention,
    )
    results, first_out = {}, None
    for b, prompts in prompts_by_b.items():
        run_cookmind(engine, prompts, args.new_tokens)  # warm-up
        walls, ttfts = [], []
        for _ in range(args.repeats):
            wall, ttft, outs = run_cookmind(engine, prompts, args.new_tokens)
            walls.append(wall)
            ttfts.append(ttft)
        results[b] = (min(walls), min(ttfts))
        if b == min(prompts_by_b):
            first_out = outs[0]
    ttft_b1 = []
    for _ in range(3):  # batch 1, full length, like the peer's measurement
        _, ttft, _ = run_cookmind(engine, prompts_by_b[min(prompts_by_b)][:1], args.new_tokens)
        ttft_b1.append(ttft)
    emit(
        figure="prefill_forward_ms",
        variant=variant,
        batch=1,
        prompt_len=args.prompt_len,
        ms=round(prefill_ms(engine, prompts_by_b[min(prompts_by_b)][0]), 3),
    )
    if args.profile_ttft:  # where the first step of a lone request spends its time (host view)
        import cProfile
        import pstats

        req = engine.submit(prompts_by_b[min(prompts_by_b)][0], SamplingParams(temperature=0.0), args.new_tokens)
        prof = cProfile.Profile()
        prof.enable()
        engine.step()
        sync(str(engine.device))
        prof.disable()
        engine.run_until_idle()
        emit(figure="profiled_ttft_ms", variant=variant, ms=round((req.first_token_at - req.submitted_at) * 1e3, 2))
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    for b in prompts_by_b:
        for length in sorted({args.prompt_len + 1, args.prompt_len + args.new_tokens}):
            ms = replay_ms(engine, b, length)
            if ms is not None:
                kernel = engine.runner.decode_attention == "kernel"  # reads each row's length, not a bucket's
                emit(
                    figure="decode_step_device_ms",
                    variant=variant,
                    batch=b,
                    attn_len=length if kernel else engine.graphs.length_for(length),
                    ms=round(ms, 4),
                    compiled=engine.runner.compiled,
                )
    del engine, model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results, statistics.median(ttft_b1), first_out


def bench_hf(args, hf_dir: Path, prompts_by_b: dict[int, list[list[int]]]):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=args.torch_dtype).to(args.device).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.bos_token_id = None, 0, None
    gc.cache_implementation = "static"  # compileable cache: generate compiles decoding on CUDA
    gc.do_sample = False
    if args.no_compile:
        gc.disable_compile = True

    def run(prompts, n_new):
        ids = torch.tensor(prompts, device=args.device)
        sync(args.device)
        t0 = time.perf_counter()
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False
        )  # generate runs under no_grad itself
        sync(args.device)
        return time.perf_counter() - t0, out[:, ids.shape[1] :].tolist()

    results, first_out = {}, None
    for b, prompts in prompts_by_b.items():
        t0 = time.perf_counter()
        for _ in range(2):  # compile and record its graphs for this shape
            run(prompts, args.new_tokens)
        emit(figure="hf_warmup_s", batch=b, seconds=round(time.perf_counter() - t0, 2))
        walls = []
        for _ in range(args.repeats):
            wall, outs = run(prompts, args.new_tokens)
            walls.append(wall)
        results[b] = min(walls)
        emit(figure="peer_only", batch=b, tokens_per_s=round(b * args.new_tokens / results[b], 1))
        if b == min(prompts_by_b):
            first_out = outs[0]
    # time to first token inside a normal call (same cache shape: nothing recompiles): a streamer
    # notes when generate hands out its first new token (its first put() is the prompt)
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):
        def __init__(self):
            self.calls, self.at = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2 and self.at is None:
                self.at = time.perf_counter()

        def end(self):
            pass

    ttfts = []
    ids = torch.tensor(prompts_by_b[min(prompts_by_b)][:1], device=args.device)
    for _ in range(3):
        streamer = FirstToken()
        sync(args.device)
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            streamer=streamer,
        )
        ttfts.append(streamer.at - t0)
    return results, statistics.median(ttfts), first_out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--max-pos", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", default="1,64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="peer without torch.compile (eager)")
    p.add_argument(
        "--variants",
        default="paged",
        help=f"cookmind engines to time, comma-separated, the first is compared: {', '.join(VARIANTS)}",
    )
    p.add_argument("--profile-ttft", action="store_true", help="print a cProfile of a lone request's first step")
    p.add_argument("--tiny", action="store_true", help="a tiny model and workload: a CPU smoke run")
    args = p.parse_args(argv)
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        p.error(why)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate, args.vocab = 2, 64, 4, 2, 128, 512
        args.prompt_len, args.new_tokens, args.batch_sizes, args.repeats = 8, 8, "1,4", 1
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    gen = torch.Generator().manual_seed(1)
    prompts_by_b = {b: torch.randint(0, args.vocab, (b, args.prompt_len), generator=gen).tolist() for b in batch_sizes}
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        ckpt, hf_dir = build_weights(args, Path(tmp))
        variants = args.variants.split(",")
        for v in variants:
            if v not in VARIANTS:
                p.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
        for i, v in enumerate(variants):
            res, ttft, first = bench_cookmind(args, ckpt, prompts_by_b, v)
            if i == 0:
                ours, ours_ttft, ours_first = res, ttft, first
            for b in batch_sizes:  # printed now too, so they survive a peer that fails or runs out of time
                emit(
                    figure="cookmind_only",
                    variant=v,
                    batch=b,
                    tokens_per_s=round(b * args.new_tokens / res[b][0], 1),
                    ttft_ms_b1=round(ttft * 1e3, 2),
                    same_tokens_as_first_variant=first == ours_first,
                )
        peer, peer_ttft, peer_first = None, None, None
        if not args.skip_hf:
            try:
                peer, peer_ttft, peer_first = bench_hf(args, hf_dir, prompts_by_b)
            except Exception as exc:
                emit(figure="peer_failed", error=f"{type(exc).__name__}: {exc}"[:500])
    peer_name = "hf_generate_static_eager" if args.no_compile else "hf_generate_static_compile"
    for b in batch_sizes:
        tps = b * args.new_tokens / ours[b][0]
        row = dict(
            figure="decode_tokens_per_s",
            batch=b,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            variant=variants[0],
            cookmind=round(tps, 1),
        )
        if peer:
            peer_tps = b * args.new_tokens / peer[b]
            row.update({peer_name: round(peer_tps, 1), "speedup": round(tps / peer_tps, 2)})
        emit(**row)
    row = dict(figure="ttft_ms", batch=1, prompt_len=args.prompt_len, cookmind=round(ours_ttft * 1e3, 2))
    if peer:
        row.update({peer_name: round(peer_ttft * 1e3, 2), "speedup": round(peer_ttft / ours_ttft, 2)})
    emit(**row)
    if peer:
        agree = next((i for i, (a, c) in enumerate(zip(ours_first, peer_first)) if a != c), len(ours_first))
        emit(
            figure="greedy_agreement",
            batch=1,
            same_prefix_tokens=agree,
            of=len(ours_first),
            note="bf16 rounding can make near-tied argmaxes diverge" if args.dtype != "float32" else "",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
