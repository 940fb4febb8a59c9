"""Data-parallel training step time: one GPU vs PyTorch DDP vs cookmind DDP, in one run.

GPT-2-small shape (CookMindLM: 12 layers, 768 wide, 12 heads, vocab 50304, tied embeddings,
SwiGLU 2048), batch 12 x 1024 per GPU, bf16 autocast, fused AdamW. Setups compile per block
(and the loss on its own), so gradients leave each block as its backward ends; all per-block
setups share one compiled model (same kernels for everyone; weights reset between setups).
"-whole" setups compile the whole model (torch DDP then splits the graph at its buckets itself).
Launch on 2 GPUs:

    torchrun --standalone --nproc_per_node 2 bench/bench_ddp.py [--steps 20] \
        --setups 1gpu torch-bf16 ours-bf16 ours-bf16:bucket=50:first=1 ...

A setup is NAME[:key=value...]. NAME: 1gpu | torch | torch-bf16 | ours | ours-bf16 | ours-bf16-zero1,
optionally ending in -whole. Keys: bucket (MB), first (our first bucket, MB; 0 = none),
hp=1 (communicate on a high-priority CUDA stream: a new NCCL group), ctas=N (at most N CTAs per
NCCL kernel, same group), rebuild=0 (ours: keep the initial bucket order), gc=1 (gc.freeze() after
warm-up), prof=1 (trace 3 steps on rank 0 into --out). Prints one JSON line per setup: ms/step
(mean over all timed steps; also the median step by CUDA events, and the host time to issue a
step: near ms/step means the host, not the GPU, sets the pace), tokens/s over all GPUs and
scaling efficiency (one-GPU step time / N-GPU step time at the same per-GPU batch), then a table.
--bw first prints all_reduce bandwidth (bf16) at a few sizes.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DEFAULT_SETUPS = ["1gpu", "ours-bf16", "torch-bf16", "ours", "torch", "1gpu-whole", "torch-whole"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1, help="timed windows of --steps steps per round")
    p.add_argument("--rounds", type=int, default=3, help="passes over all setups; ms is the mean over rounds")
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--no-compile", action="store_true", help="eager (CPU smoke runs)")
    p.add_argument("--bw", action="store_true", help="measure all_reduce bandwidth first")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="where profiler traces go")
    p.add_argument("--setups", nargs="+", default=DEFAULT_SETUPS)
    return p.parse_args(argv)


from cookmind.model.cross_entropy import cross_entropy as _CROSS_ENTROPY  # noqa: E402


def parse_setup(text: str) -> tuple[str, dict]:
    name, *opts = text.split(":")
    known = {"bucket", "first", "hp", "ctas", "rebuild", "prof", "gc"}
    kv = {}
    for o in opts:
        k, _, v = o.partition("=")
        if k not in known:
            raise SystemExit(f"bench_ddp: unknown setup option {k!r} in {text!r}; known: {sorted(known)}")
        kv[k] = float(v)
    return name, kv


def build_model(args, device, whole: bool):
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.parallel import compile_blocks

    cfg = CookMindConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.seq,
        tie_word_embeddings=True,
        attn_backend="sdpa",
    )
    torch.manual_seed(0)
    model = CookMindLM(cfg).to(device)
    if not whole and not args.no_compile:  # per-block graphs: a block's gradients are final as its backward ends
        compile_blocks(model)
    return model


_COMPILED_LOSS = []


def use_loss(args, whole: bool) -> None:
    """Per-block setups compute the loss over 50k logits (the largest piece outside the blocks) compiled
    on its own; a whole-model graph holds it already and must see the very function it was traced with.

    Set before every setup: the loss is a module global of cookmind.model.lm, shared by all setups.
    """
    import cookmind.model.lm as lm_module

    if whole or args.no_compile:
        lm_module.cross_entropy = _CROSS_ENTROPY
        return
    if not _COMPILED_LOSS:
        _COMPILED_LOSS.append(torch.compile(_CROSS_ENTROPY))
    lm_module.cross_entropy = _COMPILED_LOSS[0]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def comm_group(opts, device):
    """A new NCCL group with a high-priority stream and/or a CTA cap, or None (the default group)."""
    if not (opts.get("hp") or opts.get("ctas")) or device.type != "cuda":
        return None
    pg_opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=bool(opts.get("hp")))
    if opts.get("ctas"):
        pg_opts.config.max_ctas = int(opts["ctas"])
    return dist.new_group(backend="nccl", pg_options=pg_opts)


def summarize_trace(path: Path, steps: int) -> dict:
    """GPU kernel time per stream, NCCL time and how much of it overlapped compute, per step."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        return {}
    by_stream: dict = {}
    for e in kernels:
        by_stream.setdefault(e["args"].get("stream"), []).append(e)
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    compute = [e for e in kernels if "nccl" not in e["name"].lower()]
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)

    def union(evts):
        total, end = 0.0, -1e30
        for e in sorted(evts, key=lambda e: e["ts"]):
            s, t = e["ts"], e["ts"] + e["dur"]
            if t > end:
                total += t - max(s, end)
                end = t
        return total

    busy_compute = union(compute)
    busy_all = union(kernels)
    return {
        "span_ms_per_step": round(span / steps / 1e3, 2),
        "compute_busy_ms_per_step": round(busy_compute / steps / 1e3, 2),
        "nccl_ms_per_step": round(sum(e["dur"] for e in nccl) / steps / 1e3, 2),
        "nccl_alone_ms_per_step": round((busy_all - busy_compute) / steps / 1e3, 2),
        "kernels_per_step": len(compute) // steps,
        "streams": {str(k): round(sum(e["dur"] for e in v) / steps / 1e3, 2) for k, v in by_stream.items()},
    }


def run_setup(text, args, device, rank, world, shared):
    from cookmind.parallel import DDP, ShardedOptimizer

    name, opts = parse_setup(text)
    whole = name.endswith("-whole")
    single = name.startswith("1gpu")
    if single and rank != 0:
        return None
    kind = name.split("-")[0]
    bf16 = "bf16" in name
    bucket_mb = opts.get("bucket", args.bucket_mb)
    # per-block setups share one compiled model (wrapped afresh each time, so torch DDP must not
    # re-split those graphs: same kernels for everyone); whole-model setups keep their own, wrapped once
    torch._dynamo.config.optimize_ddp = whole
    use_loss(args, whole)
    cached = shared.get(text) if whole else None
    if cached is not None:
        bare, model, group, init = cached
    else:
        group = None if single else comm_group(opts, device)
        if whole or args.no_compile or shared.get("model") is None:
            bare = build_model(args, device, whole)
            init = {k: v.clone() for k, v in bare.state_dict().items()}
            if not whole:
                shared["model"], shared["init"] = bare, init
        else:
            bare, init = shared["model"], shared["init"]
        model = torch.compile(bare) if whole and not args.no_compile else bare
        if kind == "torch":
            ids = [device.index] if device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=ids, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True, process_group=group
            )
            if bf16:
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                model.register_comm_hook(group, default_hooks.bf16_compress_hook)
        elif kind == "ours":
            model = DDP(
                model,
                bucket_size_mb=bucket_mb,
                reduce_dtype=torch.bfloat16 if bf16 else None,
                process_group=group,
                first_bucket_mb=opts.get("first") or None,
                rebuild_buckets=bool(opts.get("rebuild", 1)),
            )
        if whole:
            shared[text] = (bare, model, group, init)
    bare.load_state_dict(init)  # every setup and round starts from the same weights
    for p in bare.parameters():
        p.grad = None
    params = [p for p in model.parameters() if p.requires_grad]
    if "zero1" in name:
        opt = ShardedOptimizer(params, torch.optim.AdamW, lr=6e-4, weight_decay=0.1, fused=device.type == "cuda")
    else:
        opt = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, fused=device.type == "cuda")
    g = torch.Generator(device=device).manual_seed(1234 + rank)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), device=device, generator=g)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, labels=x, return_logits=False).loss
        loss.backward()
        if isinstance(model, DDP):
            model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(args.warmup):
        loss = step()
    sync(device)
    warm_s = time.time() - t0
    if opts.get("gc"):
        gc.collect()
        gc.freeze()  # compiled graphs' many objects leave the collector's scans
    times, cpu_ms, step_ms = [], [], []
    for _ in range(args.repeats):
        if world > 1 and not single:
            dist.barrier(group=group)
        sync(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)] if device.type == "cuda" else []
        t0 = time.time()
        for k in range(args.steps):
            if events:
                events[k].record()
            c0 = time.perf_counter()
            loss = step()
            cpu_ms.append((time.perf_counter() - c0) * 1000)
        if events:
            events[-1].record()
        sync(device)
        times.append((time.time() - t0) / args.steps * 1000)
        step_ms += [a.elapsed_time(b) for a, b in zip(events[:-1], events[1:])]
    if opts.get("gc"):
        gc.unfreeze()
    ms = sum(times) / len(times)
    r = {
        "ms": ms,
        "ms_windows": [round(t, 2) for t in times],
        "step_ms_median": round(statistics.median(step_ms), 2) if step_ms else None,
        "step_ms_p90": round(statistics.quantiles(step_ms, n=10)[-1], 2) if len(step_ms) > 1 else None,
        "cpu_issue_ms_median": round(statistics.median(cpu_ms), 2),
    }
    if opts.get("prof") and rank == 0 and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        trace = Path(args.out) / f"trace_{text.replace(':', '_').replace('=', '')}.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                loss = step()
            sync(device)
        prof.export_chrome_trace(str(trace))
        r["profile"] = summarize_trace(trace, 3)
        with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
    elif opts.get("prof") and world > 1 and not single:
        for _ in range(3):  # the peer runs the same steps while rank 0 traces
            loss = step()
        sync(device)
    n_gpus = 1 if single else world
    same = True
    if not single:  # every rank must hold the same weights after the steps
        w = torch.stack([p.detach().float().sum() for p in params]).reshape(-1)
        lo, hi = w.clone(), w.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        same = bool(((hi - lo).abs() <= 1e-6 * hi.abs().clamp(min=1.0)).all().item())
    if not whole:  # the shared model goes on to the next setup bare
        if isinstance(model, DDP):
            model.remove_hooks()
        model = opt = None  # noqa: F841 - drop the wrapper (and torch DDP's hooks) before the next setup
        gc.collect()  # torch DDP's reducer removes its autograd hooks when collected
        if group is not None:
            dist.destroy_process_group(group)
    for p in bare.parameters():
        p.grad = None
    return {
        **r,
        "gpus": n_gpus,
        "tokens_per_s": n_gpus * args.batch * args.seq / ms * 1000,
        "loss": round(loss.item(), 4),
        "warmup_s": round(warm_s, 1),
        "weights_equal_across_ranks": same,
    }


def warm_shared_model(args, device, shared) -> None:
    """Every rank compiles the shared per-block model before anything is timed (rank 1 runs no one-GPU setup)."""
    use_loss(args, whole=False)
    model = build_model(args, device, whole=False)
    shared["model"], shared["init"] = model, {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    for _ in range(2):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            model(x, labels=x, return_logits=False).loss.backward()
    for p in model.parameters():
        p.grad = None
    sync(device)


def all_reduce_bandwidth(device, rank) -> None:
    """Bus bandwidth of one all_reduce at a few sizes (bf16): bytes * 2 (n-1) / n / time."""
    world = dist.get_world_size()
    for mb in (1, 8, 32, 128, 512):
        t = torch.ones(mb * 2**20 // 2, dtype=torch.bfloat16, device=device)
        for _ in range(3):
            dist.all_reduce(t)
        sync(device)
        n = 10
        t0 = time.time()
        for _ in range(n):
            dist.all_reduce(t)
        sync(device)
        s = (time.time() - t0) / n
        if rank == 0:
            print(
                json.dumps(
                    {
                        "bench": "all_reduce",
                        "mb": mb,
                        "ms": round(s * 1e3, 3),
                        "busbw_GBps": round(mb * 2**20 * 2 * (world - 1) / world / s / 1e9, 1),
                    }
                ),
                flush=True,
            )


def report(rows: dict, args, device) -> None:
    """One JSON line per setup (means over rounds; efficiency against the one-GPU setup of its kind), then a table."""
    base = {}
    for text, rs in rows.items():
        name = text.split(":")[0]
        if name in ("1gpu", "1gpu-whole") and name not in base and all("ms" in r for r in rs):
            base[name] = [r["ms"] for r in rs]
    table = []
    for text, rs in rows.items():
        name = text.split(":")[0]
        ok = [r for r in rs if "ms" in r]
        out = {
            "bench": "ddp",
            "setup": text,
            "batch_per_gpu": args.batch,
            "seq": args.seq,
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
        }
        if not ok:
            print(json.dumps({**out, "error": rs[0].get("error")}), flush=True)
            continue
        ms = statistics.mean(r["ms"] for r in ok)
        out.update(
            ms=round(ms, 2),
            ms_rounds=[round(r["ms"], 2) for r in ok],
            gpus=ok[0]["gpus"],
            tokens_per_s=round(ok[0]["gpus"] * args.batch * args.seq / ms * 1000),
            step_ms_median=ok[-1]["step_ms_median"],
            cpu_issue_ms_median=ok[-1]["cpu_issue_ms_median"],
            loss=ok[-1]["loss"],
            warmup_s=ok[0]["warmup_s"],
            weights_equal_across_ranks=all(r["weights_equal_across_ranks"] for r in ok),
        )
        ref = base.get("1gpu-whole" if name.endswith("-whole") else "1gpu")
        if ref and out["gpus"] > 1 and len(ref) == len(ok):
            out["scaling_efficiency"] = round(statistics.mean(ref) / ms, 3)
            out["efficiency_rounds"] = [round(b / r["ms"], 3) for b, r in zip(ref, ok)]
        if "profile" in ok[0]:
            out["profile"] = ok[0]["profile"]
        print(json.dumps(out), flush=True)
        table.append(out)
    print(f"\n{'setup':>34} {'gpus':>4} {'ms/step':>8} {'tok/s':>10} {'eff':>6}")
    for r in table:
        print(
            f"{r['setup']:>34} {r['gpus']:>4} {r['ms']:>8.1f} {r['tokens_per_s']:>10.0f} "
            f"{r.get('scaling_efficiency', float('nan')):>6.2f}"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    from cookmind.parallel import init_distributed

    info = init_distributed()
    torch._dynamo.config.cache_size_limit = 64
    torch.backends.cuda.matmul.allow_tf32 = True
    rank, world, device = info.rank, info.world_size, info.device
    if args.bw and world > 1:
        all_reduce_bandwidth(device, rank)
    rows, shared = {}, {}
    if any(not t.split(":")[0].endswith("-whole") for t in args.setups):
        warm_shared_model(args, device, shared)
    for rnd in range(args.rounds):  # interleaved rounds: a slow spell of the host hits every setup alike
        for text in args.setups:
            if world > 1:
                dist.barrier()
            try:
                r = run_setup(text, args, device, rank, world, shared)
            except Exception as exc:  # report and go on to the next setup
                r = {"error": repr(exc)[:300]}
            if world > 1:
                dist.barrier()
            if rank == 0 and r is not None:
                rows.setdefault(text, []).append(r)
                brief = {k: r[k] for k in ("ms", "step_ms_median", "cpu_issue_ms_median", "error") if k in r}
                print(json.dumps({"bench": "ddp-round", "round": rnd, "setup": text, **brief}), flush=True)
    if rank == 0:
        report(rows, args, device)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
