"""Where a training step's time goes on the GPU: top kernels and idle time, ours vs the same-run peer.

    python bench/profile_train.py                 # GPT-2-small shape, B=12, T=1024, bf16, compiled (CUDA)
    python bench/profile_train.py --shape minimind --seq 340 --host-top 20   # MiniMind-3 shape, B=32; host ops
    python bench/profile_train.py --shape qwen3-0.6b --cuda-graph   # B=8, T=2048; peer transformers' Qwen3
    python bench/profile_train.py --shape llama-1.3b --cuda-graph   # B=4, T=2048; peer transformers' Llama
    python bench/profile_train.py --shape llama-1.3b --which ours --accum 8 --batch 8   # a recipe's step
    python bench/profile_train.py --shape llama-1.3b --which ours --batch 8 --master-weights --cuda-graph \
        --gaps --defer   # fit()'s loop (step N read after N+1 is queued); the GPU's idle time between kernels
    python bench/profile_train.py --shape qwen3-0.6b --tiny --device cpu   # the same code on a CPU (aten ops)

Prints JSON lines: per implementation, the wall time per step, the GPU-busy time per step (the union of
kernel intervals: what is left is host-side stall) and the 40 kernels that take the most time, and the time by kernel
category (gemm, attention, norm, loss, optimizer, grad-norm, ...). The peer is the nanoGPT-style GPT for
gpt2-small/minimind and transformers' model of the same config for the presets (as in bench/bench_train.py).
A tool to decide what to optimise; the figures to report come from bench/bench_train.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import GPT2_SMALL, MINIMIND, PRESET_RUNS, RandomTokens, RefGPT, hf_step, preset_run  # noqa: E402


def busy_union(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (µs): the time at least one kernel ran."""
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


GAP_BUCKETS_US = (2.0, 10.0, 100.0, 1000.0)  # gaps up to 2 µs, 2-10, 10-100, 100 µs-1 ms, over 1 ms


def idle_gaps(kernels: list[tuple[float, float, str]], top: int = 5) -> dict:
    """Where the GPU sits idle between kernels: the idle time (µs) in each size bucket of ``GAP_BUCKETS_US`` and the
    ``top`` longest gaps with the kernels on either side. Many short gaps say the kernels' own launch latency (more
    kernels, more idle, even inside a CUDA graph); a few long ones say the host (a sync, data, Python) held it."""
    names = [f"<= {b:g} us" for b in GAP_BUCKETS_US] + [f"> {GAP_BUCKETS_US[-1]:g} us"]
    total = dict.fromkeys(names, 0.0)
    count = dict.fromkeys(names, 0)
    longest: list[tuple[float, str, str]] = []
    end, before = None, ""
    for s, e, name in sorted(kernels):
        if end is not None and s > end:
            gap = s - end
            bucket = next((n for n, b in zip(names, GAP_BUCKETS_US) if gap <= b), names[-1])
            total[bucket] += gap
            count[bucket] += 1
            longest.append((gap, before, name))
        if end is None or e > end:
            end, before = e, name
    longest = sorted(longest, reverse=True)[:top]
    return {
        "idle_us": total,
        "gaps": count,
        "longest": [{"us": round(g, 1), "after": a[:60], "before": b[:60]} for g, a, b in longest],
    }


def kernel_category(name: str) -> str:
    """A coarse bucket for a CUDA kernel's name: where a step's GPU time goes at a glance."""
    n = name.lower()
    if "flash" in n or "fmha" in n or "sdpa" in n or "attention" in n or "cudnn" in n:
        return "attention"
    if "gemm" in n or "nvjet" in n or "xmma" in n or "cutlass" in n or "sm90" in n or "ampere" in n:
        return "gemm"
    if n.startswith("aten::") and n[6:] in ("mm", "addmm", "bmm", "matmul", "linear"):  # a CPU profile's ops
        return "gemm"
    if "adam" in n:
        return "optimizer"
    if "norm" in n and "multi_tensor" in n:
        return "grad-norm"
    if "cross_entropy" in n or "log_softmax" in n or "nll_loss" in n:
        return "loss"
    if "rsqrt" in n or "rms_norm" in n or "layer_norm" in n:  # compiled RMSNorm kernels carry rsqrt in their name
        return "norm"
    if "multi_tensor" in n or "foreach" in n:
        return "multi-tensor"
    if n.startswith("triton_"):
        return "triton-reduction" if ("_red_" in n or "_per_" in n) else "triton-pointwise"
    if "memcpy" in n or "memset" in n or "fill" in n or "copy" in n:
        return "copy/fill"
    if "embedding" in n or "index" in n or "scatter" in n or "gather" in n:
        return "embedding/index"
    return "other"


def profile(
    step, steps: int, name: str, host_top: int = 0, top_n: int = 40, cuda: bool = True, gaps: bool = False
) -> None:
    """Profile ``steps`` calls of ``step`` and print the figures above; on a CPU the "kernels" are the top-level
    aten ops (a check that the script runs, not a figure)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with tprofile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for i in range(steps):
            step(i)
        sync()
    wall = (time.perf_counter() - t0) / steps
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        kernels = [e for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::")]
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy = busy_union(spans) / steps / 1e3  # ms per step
    per: dict[str, list[float]] = {}
    for e in kernels:
        per.setdefault(e.name[:90], []).append(e.time_range.elapsed_us())
    top = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:top_n]
    cats: dict[str, float] = {}
    for k, v in per.items():
        cats[kernel_category(k)] = cats.get(kernel_category(k), 0.0) + sum(v) / steps / 1e3
    print(
        json.dumps(
            {
                "figure": "profile",
                "impl": name,
                "wall_ms_per_step_profiled": round(wall * 1e3, 2),
                "gpu_busy_ms_per_step": round(busy, 2),
                "kernels_per_step": len(kernels) // steps,
                "ms_by_category": {c: round(t, 3) for c, t in sorted(cats.items(), key=lambda kv: -kv[1])},
            }
        ),
        flush=True,
    )
    if gaps:
        g = idle_gaps([(e.time_range.start, e.time_range.end, e.name) for e in kernels])
        per_step = {k: round(v / steps / 1e3, 3) for k, v in g["idle_us"].items()}
        counts = {k: v // steps for k, v in g["gaps"].items()}
        print(
            json.dumps({"impl": name, "idle_ms_per_step": per_step, "gaps_per_step": counts, "longest": g["longest"]}),
            flush=True,
        )
    for k, v in top:
        print(
            json.dumps(
                {
                    "impl": name,
                    "kernel": k,
                    "ms_per_step": round(sum(v) / steps / 1e3, 3),
                    "calls_per_step": len(v) // steps,
                }
            ),
            flush=True,
        )
    if host_top:  # where the host's time goes (the step is host-bound when wall >> GPU busy)
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:host_top]
        for e in rows:
            print(
                json.dumps(
                    {
                        "impl": name,
                        "host_op": e.key[:90],
                        "self_cpu_ms_per_step": round(e.self_cpu_time_total / steps / 1e3, 3),
                        "calls_per_step": e.count // steps,
                    }
                ),
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--which", default="ref,ours")
    ap.add_argument("--attn", default="sdpa", help="our model's attn_backend (sdpa, cudnn, flash-triton)")
    ap.add_argument("--compile-mode", default="default", help="our Trainer's train.compile_mode")
    ap.add_argument("--cuda-graph", action="store_true", help="our Trainer with train.cuda_graph=true")
    ap.add_argument("--fp8-head", action="store_true", help="our model with model.lm_head_fp8=true")
    ap.add_argument("--shape", default="gpt2-small", choices=["gpt2-small", "minimind", *PRESET_RUNS])
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default 1024; the presets 2048)")
    ap.add_argument("--tiny", action="store_true", help="with a preset --shape: its architecture shrunk")
    ap.add_argument("--device", default="cuda", help="cuda (the figures) or cpu (with --tiny: a check that it runs)")
    ap.add_argument("--host-top", type=int, default=0, help="also print the N host ops with the most self CPU time")
    ap.add_argument("--gaps", action="store_true", help="also print the GPU's idle time between kernels, by gap size")
    ap.add_argument(
        "--defer",
        action="store_true",
        help="our Trainer's loop as fit() runs it (train.defer_metrics): step N is read after N+1 is queued",
    )
    ap.add_argument("--batch", type=int, default=None, help="micro-batch rows (default: the shape's)")
    ap.add_argument(
        "--accum",
        type=int,
        default=1,
        help="our Trainer's micro-batches per optimizer step (train.grad_accum_steps); times are per optimizer step",
    )
    ap.add_argument("--fp8-blocks", action="store_true", help="our Trainer with train.fp8_blocks=true (torchao)")
    ap.add_argument(
        "--master-weights",
        action="store_true",
        help="our Trainer with train.master_weights=true (bf16 parameters, fp32 masters in AdamW)",
    )
    args = ap.parse_args()
    if args.accum < 1 or (args.batch is not None and args.batch < 1):
        ap.error("--accum and --batch must be at least 1")
    if args.tiny and args.shape not in PRESET_RUNS:
        ap.error(f"--tiny shrinks a preset shape: pass --shape {' or '.join(PRESET_RUNS)}")
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(args.device)
    gpu = dev.type == "cuda"
    precision = "bf16" if gpu or args.master_weights else "fp32"  # master weights need bf16 (autocast on a CPU)
    if args.shape in PRESET_RUNS:
        shape, batch, seq = preset_run(args.shape, args.tiny, args.seq)
    else:
        shape = MINIMIND if args.shape == "minimind" else GPT2_SMALL
        batch, seq = (32 if args.shape == "minimind" else 12), args.seq or 1024
    batch = args.batch or batch
    vocab = shape["vocab_size"]
    warm, timed = (8, 5) if gpu else (1, 2)
    if "ref" in args.which and args.shape in PRESET_RUNS:
        hf, model = hf_step(shape, batch, seq, dev, precision, compile_=gpu)

        def hf_read_step(i):
            loss, norm = hf(i)
            torch.stack([loss.detach().float(), norm.float()]).tolist()

        for i in range(warm):
            hf_read_step(i)
        profile(
            hf_read_step,
            timed,
            f"transformers {type(model).__name__}, fused torch AdamW",
            args.host_top,
            cuda=gpu,
            gaps=args.gaps,
        )
        del hf, model
        if gpu:
            torch.cuda.empty_cache()
    elif "ref" in args.which:
        torch.manual_seed(0)
        model = RefGPT(vocab, shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"], seq).to(
            dev
        )
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=gpu)
        fwd = torch.compile(model) if gpu else model
        data = torch.randint(0, vocab, (4 * batch, seq + 1), device=dev)

        def ref_step(i):
            rows = data[(i * batch) % (3 * batch) : (i * batch) % (3 * batch) + batch]
            x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=gpu):
                loss = fwd(x, y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.stack([loss.detach().float(), norm.float()]).tolist()

        for i in range(warm):
            ref_step(i)
        profile(ref_step, timed, "nanogpt-style reference", args.host_top, cuda=gpu, gaps=args.gaps)
        del model, opt, fwd
        if gpu:
            torch.cuda.empty_cache()
    if "ours" in args.which:
        from cookmind.train import TrainConfig, Trainer

        cfg = TrainConfig.from_dict(
            {
                "model": dict(shape, attn_backend=args.attn, lm_head_fp8=args.fp8_head),
                "data": {"window_size": seq},
                "train": {
                    "max_steps": 10**6,
                    "micro_batch_size": batch,
                    "precision": precision,
                    "compile": gpu,
                    "compile_mode": args.compile_mode,
                    "device": args.device,
                    "cuda_graph": args.cuda_graph,
                    "grad_accum_steps": args.accum,
                    "fp8_blocks": args.fp8_blocks,
                    "master_weights": args.master_weights,
                },
                "optim": {"lr": 6e-4, "warmup_steps": 10},
                "checkpoint": {"every": 0, "overwrite": True},  # a scratch run directory, reused
                "logging": {"run_dir": "/tmp/cookmind-profile", "progress": False, "report": False, "log_every": 1000},
            }
        )
        trainer = Trainer(cfg, train_dataset=RandomTokens(vocab, seq))

        behind = []

        def one_step(i=None):  # the loop body, each step read before the next is queued (no callbacks)
            queued = trainer._launch_step()
            if not args.defer:
                trainer._read_step(queued)
                return
            if behind:  # as fit() with train.defer_metrics: the previous step is read once this one is queued
                trainer._read_step(behind.pop())
            behind.append(queued)

        for _ in range(warm):
            one_step()
        profile(
            one_step,
            timed,
            f"cookmind Trainer ({args.attn}, {args.compile_mode}"
            f"{', cuda graph' if args.cuda_graph else ''}{', fp8 head' if args.fp8_head else ''}"
            f"{', fp8 blocks' if args.fp8_blocks else ''}{', master weights' if args.master_weights else ''}"
            f", B={batch}, accum {args.accum}{', deferred reads' if args.defer else ''})",
            args.host_top,
            cuda=gpu,
            gaps=args.gaps,
        )


if __name__ == "__main__":
    main()
