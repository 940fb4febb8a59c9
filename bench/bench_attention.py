"""Causal attention TFLOP/s: our Triton FlashAttention-2 vs PyTorch SDPA's flash and cuDNN backends.

Forward, backward and forward+backward, bf16, head dims 64 and 128, sequence 1k..16k at a fixed
16k tokens per batch (batch = 16384 / T) and model width 2048 (heads = 2048 / D). Prints one JSON
line per figure, then a table. Run on a CUDA GPU:

    PYTHONUNBUFFERED=1 python bench/bench_attention.py [--seqs 1024,2048] [--dims 64,128] [--autotune]

FLOPs (FlashAttention papers' convention): forward 4 * B * H * T^2 * D, halved when causal;
backward 2.5x forward (five matmuls instead of two).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    p.add_argument("--dims", default="64,128")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per batch (B * T)")
    p.add_argument("--width", type=int, default=2048, help="H * D")
    p.add_argument("--autotune", action="store_true", help="let Triton time each tile candidate")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.autotune:
        os.environ["COOKMIND_FLASH_AUTOTUNE"] = "1"  # read when the kernels module is first imported
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        print("bench_attention needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from cookmind.kernels import FlashAttentionTriton

    dev = torch.device("cuda")

    def sdpa(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    providers = {
        "cookmind-triton": lambda q, k, v, c: FlashAttentionTriton.apply(q, k, v, c),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    rows = []
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16", "causal": True}
    for d in (int(x) for x in args.dims.split(",")):
        for t in (int(x) for x in args.seqs.split(",")):
            b, h = max(1, args.tokens // t), args.width // d
            q, k, v = [torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
            do = torch.randn_like(q)
            fwd_flops = 4 * b * h * t * t * d / 2
            ref = None
            for name, fn in providers.items():
                try:
                    o = fn(q, k, v, True)
                    if name == "sdpa-flash":
                        ref = o.detach()
                    ms_f = do_bench(lambda: fn(q, k, v, True), rep=args.rep, return_mode="median")
                    o = fn(q, k, v, True)
                    ms_b = do_bench(
                        lambda: o.backward(do, retain_graph=True),
                        rep=args.rep,
                        return_mode="median",
                        grad_to_none=[q, k, v],
                    )
                    ms_fb = do_bench(
                        lambda: fn(q, k, v, True).backward(do),
                        rep=args.rep,
                        return_mode="median",
                        grad_to_none=[q, k, v],
                    )
                except Exception as exc:  # a backend missing on this build is a row, not a crash
                    print(json.dumps({"provider": name, "seq": t, "head_dim": d, "error": repr(exc)[:200]}))
                    continue
                for mode, ms, flops in (
                    ("fwd", ms_f, fwd_flops),
                    ("bwd", ms_b, 2.5 * fwd_flops),
                    ("fwd+bwd", ms_fb, 3.5 * fwd_flops),
                ):
                    row = {
                        "bench": "attention",
                        "provider": name,
                        "mode": mode,
                        "seq": t,
                        "batch": b,
                        "heads": h,
                        "head_dim": d,
                        "ms": round(ms, 4),
                        "tflops": round(flops / ms / 1e9, 1),
                        **meta,
                    }
                    print(json.dumps(row))
                    rows.append(row)
            ours = providers["cookmind-triton"](q, k, v, True)
            if ref is not None:
                err = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
                print(json.dumps({"check": "cookmind-triton vs sdpa-flash", "seq": t, "head_dim": d, "rel_err": err}))
            q = k = v = do = o = ours = None  # free this shape's tensors before the next allocates
            torch.cuda.empty_cache()
    if args.autotune:
        from cookmind.kernels import flash_attention_triton_kernels as kern

        for name in ("flash_fwd", "flash_bwd_dkdv", "flash_bwd_dq"):
            print(json.dumps({"autotune": name, "chosen": getattr(kern, name).chosen()}))
    print_table(rows)
    return 0


def print_table(rows):
    """TFLOP/s per (head dim, mode, seq) with one column per provider and our ratio to sdpa-flash."""
    provs = ["cookmind-triton", "sdpa-flash", "sdpa-cudnn"]
    seqs = sorted({r["seq"] for r in rows})
    print(f"\n{'hd':>3} {'mode':>8} {'seq':>6} " + " ".join(f"{p:>16}" for p in provs) + f" {'ours/flash':>10}")
    for d in sorted({r["head_dim"] for r in rows}):
        for mode in ("fwd", "bwd", "fwd+bwd"):
            for t in seqs:
                got = {
                    r["provider"]: r["tflops"]
                    for r in rows
                    if r["head_dim"] == d and r["mode"] == mode and r["seq"] == t
                }
                ratio = got.get("cookmind-triton", 0) / got["sdpa-flash"] if got.get("sdpa-flash") else float("nan")
                print(
                    f"{d:>3} {mode:>8} {t:>6} "
                    + " ".join(f"{got.get(p, float('nan')):>16.1f}" for p in provs)
                    + f" {ratio:>10.2f}"
                )


if __name__ == "__main__":
    raise SystemExit(main())
