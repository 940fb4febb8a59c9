"""Per-request LoRA serving cost: the engine decoding a batch whose rows use different adapters, against the same
engine serving the base alone and against a model with one adapter merged into its weights (what serving one
adapter costs without per-request adapters), all in the same process: the figures are ratios.

Workload: --requests prompts of --prompt-len random tokens, --steps new tokens each, greedy, no early stop, all in
one batch. With adapters, the rows cycle through the base and each of --adapters adapters (rank --rank on every
projection: q, k, v, o, gate, up, down). Each JSON line is printed (flushed) as soon as it is measured: the engine's
setup (compile, graph capture), tokens/s = requests * steps / (wall time of the whole generation, prefill included)
per engine, and the ratios as soon as both sides exist. --engines picks the engines, in order: base, adapters
(the mixed batch, --lora-update), merged, and variants of adapters: adapters_gathered (every projection gathering
each row's pair, the path for many adapters), adapters_select (masked, compiled with multi_lora.COMPILED_UPDATE
"select": every adapter's B read per row, the default before "own"), adapters_masked_gemm (masked, the
up-projection a GEMM even compiled, not a fused reduction), adapters_unfolded (masked, no adapter's A joining a
projection's GEMM), adapters_kernel (lora_update "kernel": the Triton kernels of kernels/lora_bgmv.py, each row
reading its own adapter; the expand reads x A^T where the fold put it beside the output, a shrink elsewhere) and
adapters_kernel_unfolded (the kernels with no fold: a shrink and an expand on every projection; CUDA, or CPU under
TRITON_INTERPRET=1). The defaults finish
in about a minute and a half on an H200, setup of the four engines included. --count-ops (uncompiled: CPU) also
prints each engine's aten ops (views left out) per model forward, the launches a decode step costs before CUDA
graphs and compilation fuse them. --profile prints, per engine, where one decode step of the full mixed batch goes
(``profile_decode``): torch.profiler over a few steps, the top-15 CUDA kernels by total time, kernels and
cudaGraphLaunch calls per step, the host's time per step and the first step's (the prefill).

    python bench/bench_multi_lora.py                        # GPT-2-small-sized Llama shape, CUDA, bf16
    python bench/bench_multi_lora.py --profile              # ... and where each engine's decode step goes
    python bench/bench_multi_lora.py --tiny --device cpu    # a seconds-long smoke run on CPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from cookmind.device import cuda_missing
from cookmind.infer import multi_lora
from cookmind.infer.engine import Engine
from cookmind.infer.loading import load_adapters
from cookmind.infer.runner import DECODE_ATTENTION
from cookmind.infer.sampling import SamplingParams
from cookmind.model import CookMindConfig, CookMindLM
from cookmind.model.lora import DEFAULT_TARGETS, apply_lora, lora_modules, merged_copy, save_adapter

ENGINES = (
    "base",
    "adapters",
    "merged",
    "adapters_gathered",
    "adapters_select",
    "adapters_masked_gemm",
    "adapters_unfolded",
    "adapters_kernel",
    "adapters_kernel_unfolded",
)

# the multi_lora settings each adapters variant changes
VARIANTS = {
    "adapters_select": {"COMPILED_UPDATE": "select"},
    "adapters_masked_gemm": {"COMPILED_EXPAND_MAX_ELEMENTS": 0},
    "adapters_unfolded": {"FOLD_MAX_SHARE": 0},
    "adapters_kernel_unfolded": {"FOLD_MAX_SHARE": 0},
}
# the adapters variants that set Engine.lora_update themselves (the others take --lora-update)
LORA_UPDATES = {"adapters_gathered": "gathered", "adapters_kernel": "kernel", "adapters_kernel_unfolded": "kernel"}


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def make_adapters(base: CookMindLM, n: int, r: int, directory: Path) -> tuple[dict[str, Path], CookMindLM]:
    """n random rank-r adapters on every projection of base, saved as cookmind adapters; and the first one merged
    into a copy of base."""
    out, merged = {}, None
    for i in range(n):
        model = CookMindLM(base.config)
        model.load_state_dict(base.state_dict())
        apply_lora(model, r=r, alpha=2.0 * r, targets=DEFAULT_TARGETS)
        with torch.no_grad():
            for _, m in lora_modules(model):
                m.lora_B.weight.normal_(0, 0.02)
        out[f"a{i}"] = save_adapter(directory / f"a{i}", model)
        merged = merged if merged is not None else merged_copy(model).eval()
    return out, merged


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run under it that compute something (views, which launch nothing, are left out, and so
    are _unsafe_view, a view by another name, and a Python number's scalar_tensor)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view and func.__name__ not in ("_unsafe_view.default", "scalar_tensor.default")
        return func(*args, **(kwargs or {}))


def count_forward_ops(engine: Engine) -> dict:
    """Wraps the engine's model forward so that each call counts its ops; returns the running totals."""
    totals, forward = {"ops": 0, "forwards": 0}, engine.runner.forward

    def counted(*args, **kwargs):
        with OpCounter() as counter:
            out = forward(*args, **kwargs)
        totals["ops"] += counter.ops
        totals["forwards"] += 1
        return out

    engine.runner.forward = counted
    return totals


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


def sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def profile_decode(engine: Engine, prompts: list[list[int]], names: list[str | None], steps: int) -> dict:
    """Where a decode step of the whole batch goes: the prompts are prefilled (one ``engine.step``, timed: it
    prefills and decodes once), two steps load the graph state, then ``steps`` steps run under torch.profiler,
    each started on an idle device so that its wall time is the host's alone (with overlap, the default on CUDA,
    a step launches its decode and reads back the one before, done by then); last, ``steps`` steps back to back
    give the wall time of a step. Returns per step: host and wall ms, device ms (the sum of kernel times),
    kernels (copies and memsets apart) and cudaGraphLaunch calls, and the top-15 CUDA kernels by total time (on
    CPU: the top-15 ops by self CPU time); on CUDA also ``graph_replay_ms``, the decode graph of the batch replayed
    alone (CUDA events, every row idle: the step's device time but for attention reading one key a row), which
    needs no profiler."""
    params = SamplingParams(temperature=0.0, max_new_tokens=2 * steps + 4)
    for p, name in zip(prompts, names):
        engine.submit(p, params, adapter=name)
    sync(engine)
    t0 = time.perf_counter()
    engine.step()
    sync(engine)
    first = time.perf_counter() - t0
    if any(r is not None and r.state != "decode" for r in engine.slots):
        raise SystemExit("--profile: one engine step did not prefill every prompt (is prefill_chunk too small?)")
    for _ in range(2):
        engine.step()
    cuda = engine.device.type == "cuda"
    host = 0.0
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            sync(engine)
            t0 = time.perf_counter()
            engine.step()
            host += time.perf_counter() - t0
        sync(engine)
    sync(engine)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(engine)
    wall = time.perf_counter() - t0
    replay = None
    if cuda and engine.graphs is not None and engine.graphs.capture:
        b = len(prompts)
        engine.graphs.load([0] * b, [0] * b)  # idle rows: they write the scratch column and stay where they are
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            engine.graphs.decode(b)
        end.record()
        end.synchronize()
        replay = start.elapsed_time(end) / steps
        engine._graph_key = None  # the engine loads its rows again before its next step
    engine.run_until_idle()
    events = prof.events()
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
    totals: dict[str, list[float]] = {}
    if cuda:
        for e in device:
            entry = totals.setdefault(e.name, [0.0, 0])
            entry[0] += e.time_range.elapsed_us()
            entry[1] += 1
    else:  # no kernels: the ops the host runs
        for e in prof.key_averages():
            totals[e.key] = [e.self_cpu_time_total, e.count]
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:15]
    return {
        "steps": steps,
        "overlap": engine.overlap,
        "first_step_ms": round(first * 1e3, 3),
        "host_ms_per_step": round(host / steps * 1e3, 3),
        "wall_ms_per_step": round(wall / steps * 1e3, 3),
        "device_ms_per_step": round(sum(e.time_range.elapsed_us() for e in device) / steps / 1e3, 3) if cuda else None,
        "graph_replay_ms": None if replay is None else round(replay, 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "copies_per_step": round((len(device) - len(kernels)) / steps, 1),
        "graph_launches_per_step": round(sum(e.name.startswith("cudaGraphLaunch") for e in events) / steps, 1),
        "top": [
            {"name": name[:120], "us_per_step": round(us / steps, 2), "calls_per_step": round(n / steps, 2)}
            for name, (us, n) in top
        ],
    }


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
    p.add_argument("--steps", type=int, default=64, help="new tokens per request")
    p.add_argument("--requests", type=int, default=32, help="requests in the batch (the engine's slots)")
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="timed generations per engine (the best counts)")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the layers (default: on CUDA, as the server does); --no-compile skips its setup time",
    )
    p.add_argument(
        "--engines",
        default="base,adapters,merged,adapters_gathered",
        help=f"comma-separated, in order, from {','.join(ENGINES)} (see above)",
    )
    p.add_argument(
        "--lora-update", default="auto", choices=multi_lora.UPDATES, help="the adapters engine's (Engine.lora_update)"
    )
    p.add_argument(
        "--decode-attention",
        default="auto",
        choices=DECODE_ATTENTION,
        help="kernel on CPU runs the CUDA default's decode path (fused projections, the kernel's PyTorch twin)",
    )
    p.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=8,
        default=0,
        metavar="STEPS",
        help="also profile this many decode steps of each engine (default 8; see profile_decode)",
    )
    p.add_argument("--count-ops", action="store_true", help="aten ops per model forward (needs --no-compile)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and workload: a CPU smoke run")
    args = p.parse_args(argv)
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        p.error(why)
    if args.tiny:
        args.layers, args.hidden, args.heads, args.intermediate, args.vocab = 2, 64, 4, 128, 256
        args.prompt_len, args.steps, args.requests, args.repeats = 16, 16, 4, 1
    labels = args.engines.split(",")
    if unknown := [x for x in labels if x not in ENGINES]:
        p.error(f"--engines: unknown {unknown}; choose from {','.join(ENGINES)}")
    began = time.perf_counter()
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    emit(figure="config", **{**{k: v for k, v in vars(args).items() if k != "tiny"}, "dtype": str(dtype)})
    torch.manual_seed(0)
    cfg = CookMindConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        # a profile's requests generate 2 * STEPS + 4 tokens (profile_decode)
        max_position_embeddings=args.prompt_len + max(args.steps, 2 * args.profile + 4) + 1,
    )
    base = CookMindLM(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        specs, merged = make_adapters(base, args.adapters, args.rank, Path(tmp))
        adapters = load_adapters(base, specs)
    prompts = torch.randint(0, cfg.vocab_size, (args.requests, args.prompt_len)).tolist()
    tps = {}
    defaults = {name: getattr(multi_lora, name) for v in VARIANTS.values() for name in v}
    for label in labels:
        weights = merged if label == "merged" else base
        engine_adapters = adapters if label.startswith("adapters") else None
        for name, value in {**defaults, **VARIANTS.get(label, {})}.items():  # kept while the engine serves
            setattr(multi_lora, name, value)
        model = CookMindLM(cfg)
        model.load_state_dict(weights.state_dict())
        model = model.to(args.device, dtype).eval()
        t0 = time.perf_counter()
        engine = Engine(
            model,
            num_slots=args.requests,
            max_seq_len=cfg.max_position_embeddings,
            prefill_chunk=args.requests * args.prompt_len,
            adapters=engine_adapters,
            # adapters_gathered: every projection gathers each row's pair, as with many adapters
            lora_update=LORA_UPDATES.get(label, args.lora_update),
            compile=args.compile,
            decode_attention=args.decode_attention,
        )
        fused = engine.runner.fused is not None and all(f.qkv is not None for f in engine.runner.fused)
        emit(figure="setup_s", engine=label, seconds=round(time.perf_counter() - t0, 2), fused_qkv=fused)
        cycle = [None, *engine.adapter_names]
        names = [cycle[i % len(cycle)] for i in range(args.requests)]
        emit(figure="warmup_s", engine=label, seconds=round(run(engine, prompts, names, args.steps), 2))
        wall = min(run(engine, prompts, names, args.steps) for _ in range(args.repeats))
        if args.count_ops:
            if engine.runner.compiled or engine.graphs is not None:
                raise SystemExit("--count-ops counts eager ops: run it with --no-compile on CPU")
            totals = count_forward_ops(engine)
            run(engine, prompts, names, args.steps)
            ops = totals["ops"] / totals["forwards"]
            emit(figure="aten_ops_per_forward", engine=label, ops=round(ops, 1), layers=args.layers)
        tps[label] = args.requests * args.steps / wall
        emit(
            figure="tokens_per_s",
            engine=label,
            requests=args.requests,
            tokens_per_s=round(tps[label], 1),
            compiled=engine.runner.compiled,
            compile_error=engine.runner.compile_error,
        )
        # mixed adapters (and each variant) against the base alone, the same engine and batch
        if label.startswith("adapters") and "base" in tps:
            emit(figure=f"{label}_over_base", ratio=round(tps[label] / tps["base"], 3), rank=args.rank)
        if label == "merged" and "adapters" in tps:  # against serving one adapter merged into the weights
            emit(figure="adapters_over_merged", ratio=round(tps["adapters"] / tps["merged"], 3), rank=args.rank)
        if args.profile:
            emit(figure="profile", engine=label, **profile_decode(engine, prompts, names, args.profile))
        del engine, model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    for name, value in defaults.items():
        setattr(multi_lora, name, value)
    emit(figure="total_s", seconds=round(time.perf_counter() - began, 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
