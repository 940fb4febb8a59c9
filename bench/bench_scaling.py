"""Training across GPUs through cookmind's Trainer: tokens/s, MFU and peak memory per GPU, one GPU against N.

    python3 bench/bench_scaling.py --shape llama-1.3b --gpus 2                  # 1 GPU plain, then FSDP2 on 2
    python3 bench/bench_scaling.py --shape llama-1.3b --gpus 1 2 --methods fsdp ddp zero1
    python3 bench/bench_scaling.py --device cpu --shape llama-1.3b --tiny --gpus 2 --steps 2 --warmup 1  # CPU check

The script runs itself as a fresh torchrun job (``--standalone``, one process per GPU; gloo processes on a CPU)
for each figure: first the one-GPU baseline, the plain Trainer as a user runs it on one GPU (no FSDP, no DDP),
then each method (``parallel.fsdp``, ``parallel.ddp=torch``, ``parallel.ddp=torch`` + ``parallel.zero1``) with
each of ``--variants`` (more parallel-section settings, e.g. ``reduce_dtype=bf16``) on each GPU count of
``--gpus``. Every job trains the same shape (``--shape``, a preset; ``--tiny`` shrinks it for a CPU) at the same
micro-batch per GPU (the preset's, or ``--batch`` x ``--seq``) on random tokens, bf16 autocast and torch.compile
on CUDA (``--no-compile`` for eager), our AdamW, no CUDA graph (a graph needs one process), through
``bench_train.bench_cookmind``: ``--warmup`` steps, then ``--steps`` timed ones.

Prints one JSON line per job on rank 0: tokens/s over all GPUs, MFU per GPU (989e12 peak, ``--peak-flops``, the
FLOPs per token of bench_train.py), and ``peak_gib``: the largest ``torch.cuda.max_memory_allocated`` of any rank
over the job (CUDA only). Then one line per (method, N): ``scaling_efficiency`` = tokens/s on N GPUs / (N x the
baseline's tokens/s), and ``memory_ratio`` = peak per GPU on N / the baseline's peak.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.train import Callback  # noqa: E402

METHODS = {  # the parallel section of each method's TrainConfig
    "plain": {},
    "fsdp": {"fsdp": True},
    "ddp": {"ddp": "torch"},
    "zero1": {"ddp": "torch", "zero1": True},
}
GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="llama-1.3b", choices=["qwen3-0.6b", "llama-1.3b"])
    p.add_argument("--tiny", action="store_true", help="the preset's architecture shrunk (a CPU check of the code)")
    p.add_argument("--gpus", type=int, nargs="+", default=[2], help="GPU counts (processes) to run each method on")
    p.add_argument("--methods", nargs="+", default=["fsdp"], choices=[m for m in METHODS if m != "plain"])
    p.add_argument(
        "--variants",
        nargs="+",
        default=[""],
        metavar="KEY=VALUE,...",
        help="parallel-section settings, one job per variant and method, e.g. reduce_dtype=bf16,fsdp_unit_blocks=2"
        " ('' = the defaults)",
    )
    p.add_argument("--batch", type=int, default=None, help="micro-batch per GPU (default: the preset's)")
    p.add_argument("--seq", type=int, default=None, help="tokens per row (default: the preset's 2048)")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps before timing (compilation happens here)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--peak-flops", type=float, default=989e12, help="per GPU, for MFU (the H200's dense bf16)")
    p.add_argument(
        "--profile", action="store_true", help="CUDA: trace 3 more steps on rank 0; GPU busy/idle and NCCL ms a step"
    )
    p.add_argument("--job-timeout-s", type=float, default=900.0, help="a job still running then is stopped")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # the method a torchrun job runs
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)  # and its settings
    args = p.parse_args(argv)
    for v in args.variants:
        parse_variant(v, p.error)
    import torch

    from cookmind.device import cuda_missing

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if why := cuda_missing(args.device):
        p.error(why)
    if args.device == "cpu" and not args.tiny and not args.worker:
        p.error(f"--shape {args.shape} on the CPU (no CUDA here) would take days; pass --tiny for a CPU check")
    have = torch.cuda.device_count()
    if args.device == "cuda" and not args.worker and max(args.gpus) > have:
        p.error(f"--gpus {max(args.gpus)}: this machine has {have} CUDA device(s); ask for at most {have}")
    return args


def parse_variant(text: str, error=None) -> dict:
    """``reduce_dtype=bf16,reshard_after_forward=false`` -> the parallel-section fields it sets."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            message = f"--variants {text!r}: expected KEY=VALUE[,KEY=VALUE...], got {item!r}"
            if error:
                error(message)  # argparse's: prints usage and exits
            raise SystemExit(message)
        out[key] = _value(value)
    return out


def _value(text: str):
    """A setting's value as the config takes it: true/false, an integer, a number, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def launch(args, method: str, gpus: int, variant: str = "") -> dict:
    """One torchrun job of ``method`` (with ``variant``'s settings) on ``gpus`` processes; rank 0's JSON line."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
    cmd += [str(Path(__file__).resolve()), "--worker", method, "--variant", variant] + passthrough(args)
    try:
        # one run directory for the job's ranks (a job whose ranks name different ones is refused); nothing is saved
        with tempfile.TemporaryDirectory(prefix="cookmind-scaling-") as tmp:
            env = dict(os.environ, PYTHONUNBUFFERED="1", COOKMIND_BENCH_RUN_DIR=tmp)
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.job_timeout_s)
    except subprocess.TimeoutExpired:
        return {"method": method, "gpus": gpus, "error": f"timed out after {args.job_timeout_s:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"method": method, "gpus": gpus, "error": f"exit {out.returncode}: {job_error(out.stderr)}"}
    return json.loads(lines[-1])


# What a process prints as it aborts (SIGABRT): C++'s std::terminate ("terminate called after throwing an instance
# of 'gloo::EnforceNotMet'", then "  what():  ..."), CPython's fatal errors, glibc's heap checks.
ABORT_MARKS = ("terminate called", "what():", "Fatal Python error", "free(): ", "double free", "corrupted ")


def job_error(stderr: str) -> str:
    """The reason a torchrun job failed, from its stderr: the ranks' last exception line, else the root cause
    torchrun names (a rank's exit code or signal), after what the rank printed as it aborted, if it did; not
    torchrun's own ChildFailedError or its log lines."""
    lines = stderr.strip().splitlines() or ["no output"]
    own = (" ", "E1", "W1", "I1", "torch.distributed.elastic")
    errors = [ln for ln in lines if "Error" in ln and not ln.startswith(own)]
    if errors:
        return errors[-1]
    aborted = [" ".join(ln.split()) for ln in lines if any(mark in ln for mark in ABORT_MARKS)]
    cause = [ln.strip() for ln in lines if ln.strip().startswith(("rank ", "exitcode", "traceback"))]
    return " | ".join(aborted[-2:] + [" ".join(c.split()) for c in cause[-3:]]) or lines[-1]


def passthrough(args) -> list[str]:
    """The options a worker needs, as given to the driver."""
    out = ["--shape", args.shape, "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device]
    out += ["--peak-flops", str(args.peak_flops)]
    out += ["--tiny"] * args.tiny + ["--no-compile"] * args.no_compile + ["--profile"] * args.profile
    out += ["--batch", str(args.batch)] * (args.batch is not None) + ["--seq", str(args.seq)] * (args.seq is not None)
    return out


class TraceSteps(Callback):
    """A Trainer callback: torch.profiler over ``count`` steps after step ``after`` (rank 0), summarised per step
    by bench_ddp.summarize_trace (GPU span, compute-busy, NCCL and NCCL-alone ms), the GPU's idle ms and the host
    ms in FSDP's ranges and the optimizer's step (``host_ranges``)."""

    def __init__(self, after: int, count: int):
        self.after, self.count, self.prof = after, count, None

    def needs_state_at(self, trainer, step):  # the trace starts and ends on a step boundary
        return step in (self.after, self.after + self.count)

    def on_step_end(self, trainer, step, metrics):
        import torch

        if int(os.environ.get("RANK", "0")) != 0:
            return
        if step == self.after:
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()
        elif self.prof is not None and step == self.after + self.count:
            torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)

    def summary(self, folder: Path) -> dict | None:
        from bench_ddp import summarize_trace

        if self.prof is None:
            return None
        trace = folder / "trace.json"
        try:
            self.prof.export_chrome_trace(str(trace))
            out = summarize_trace(trace, self.count)
        except (OSError, ValueError, KeyError) as exc:  # the figures stand without it
            return {"error": f"{type(exc).__name__}: {exc}"}
        out["idle_ms_per_step"] = round(
            out["span_ms_per_step"] - out["compute_busy_ms_per_step"] - out["nccl_alone_ms_per_step"], 2
        )
        out["host_ms_per_step"] = host_ranges(trace, self.count)
        return out


def host_ranges(trace: Path, steps: int) -> dict:
    """Host time per step in FSDP's annotated ranges (its hooks, gathers and reductions; nested ranges are counted
    in each), the optimizer's step and the whole step's CPU ops on the busiest thread, from a chrome trace."""
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    sums: dict[str, float] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") in ("user_annotation", "cpu_op") and (name.startswith("FSDP::") or "Optimizer.step" in name):
            sums[name] = sums.get(name, 0.0) + e["dur"]
    top = dict(sorted(sums.items(), key=lambda kv: -kv[1])[:12])
    return {k: round(v / steps / 1e3, 2) for k, v in top.items()}


def worker(args) -> None:
    """Inside torchrun: train the shape under ``args.worker``'s parallel section and print rank 0's figures."""
    import torch
    import torch.distributed as dist
    from bench_train import bench_cookmind, preset_run

    shape, batch, seq = preset_run(args.shape, args.tiny, args.seq)
    batch = args.batch or batch
    cuda = args.device == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    profiler = TraceSteps(args.warmup + args.steps, 3) if args.profile and cuda else None
    with tempfile.TemporaryDirectory(prefix="cookmind-scaling-") as own:
        tmp = os.environ.get("COOKMIND_BENCH_RUN_DIR", own)  # the job's one folder (launch), else this rank's
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        fig = bench_cookmind(
            shape,
            batch,
            seq,
            args.steps,
            args.warmup,
            torch.device(args.device),
            "bf16" if cuda else "fp32",
            not args.no_compile,
            tmp,  # every rank's run directory, the same; nothing is saved there
            parallel={**METHODS[args.worker], **parse_variant(args.variant)},
            callbacks=[profiler] if profiler else [],
            extra_steps=3 if profiler else 0,
        )
        profile = profiler.summary(Path(tmp)) if profiler else None
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    if dist.is_initialized():  # the Trainer joined torchrun's group; the slowest rank and the fullest GPU count
        t = torch.tensor([peak, -fig["tokens_per_s"]], dtype=torch.float64, device="cuda" if cuda else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        peak, slowest = int(t[0].item()), -t[1].item()
    else:
        slowest = fig["tokens_per_s"]
    if int(os.environ.get("RANK", "0")) == 0:
        tps = slowest * world
        row = {
            "method": args.worker,
            "variant": args.variant,
            "gpus": world,
            "shape": args.shape + (" (tiny)" if args.tiny else ""),
            "micro_batch": batch,
            "seq": seq,
            "params": fig["params"],
            "tokens_per_s": round(tps, 1),
            "tokens_per_s_per_gpu": round(slowest, 1),
            "mfu": round(slowest * fig["flops_per_token"] / args.peak_flops, 4),
            "peak_gib": round(peak / GIB, 2) if cuda else None,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
        }
        if profile is not None:
            row["profile"] = profile
        print(json.dumps(row), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    base = launch(args, "plain", 1)
    print(json.dumps(base), flush=True)
    failed = "error" in base
    for method, variant, n in itertools.product(args.methods, args.variants, args.gpus):
        row = launch(args, method, n, variant)
        print(json.dumps(row), flush=True)
        if "error" in row or "error" in base:
            failed = True
            continue
        summary = {
            "figure": "scaling",
            "method": method,
            "variant": variant,
            "gpus": n,
            "scaling_efficiency": round(row["tokens_per_s"] / (n * base["tokens_per_s"]), 3),
            "memory_ratio": round(row["peak_gib"] / base["peak_gib"], 3) if base["peak_gib"] else None,
        }
        print(json.dumps(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    from cookmind.parallel.process_group import end_process

    end_process(main())  # a torchrun worker ends without Python's finalization (see end_process)
