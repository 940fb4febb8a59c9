"""LM head + cross-entropy, forward and forward+backward: the fused linear_cross_entropy against the current
path and against PyTorch's own, at the GPT-2-small training shape on a CUDA GPU.

    PYTHONUNBUFFERED=1 python bench/bench_linear_ce.py [--rows 12288 --hidden 768 --vocab 50304] [--no-sweep]

Providers, each under torch.compile with bf16 autocast and fp32 weights (as the Trainer runs the model):
  fused        cookmind.kernels.linear_ce.linear_cross_entropy (GEMM + one Triton pass; backward = 2 GEMMs)
  current      h @ W^T then cookmind.model.cross_entropy (what CookMindLM computed before the fused path)
  torch        F.linear then F.cross_entropy
  fused-eager  linear_cross_entropy without torch.compile
  fused-fp8    linear_cross_entropy(fp8=True): the three GEMMs in FP8 (cookmind/kernels/linear_ce_fp8.py)
and two floors: "gemms" (the three bf16 GEMMs every provider runs) and "copy" (one read + one write of the
bf16 (N, V) logits, about what the kernel's one pass should cost). One JSON line per figure; ratio is
against "current". Then the Triton pass alone over a grid of tile/grid settings (--no-sweep skips it), with
the effective bandwidth of one read + one write of the logits, to choose linear_ce's defaults.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=12 * 1024, help="N = batch * sequence")
    p.add_argument("--hidden", type=int, default=768, help="C")
    p.add_argument("--vocab", type=int, default=50304, help="V")
    p.add_argument("--rep", type=int, default=200, help="do_bench repetition time, ms")
    p.add_argument("--no-sweep", action="store_true", help="skip the kernel's settings sweep")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("bench_linear_ce needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from cookmind.kernels.linear_ce import cross_entropy_rows_triton, linear_cross_entropy
    from cookmind.model.cross_entropy import cross_entropy

    dev = torch.device("cuda")
    n, c, v = args.rows, args.hidden, args.vocab
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": n,
        "hidden": c,
        "vocab": v,
        "dtype": "bf16 autocast, fp32 weights",
    }
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(n, c, device=dev, generator=g).requires_grad_()
    w = (torch.randn(v, c, device=dev, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, v, (n,), device=dev, generator=g)
    y[::100] = -100  # a few ignored positions, as document ends give

    providers = {
        "fused": torch.compile(lambda h, w, y: linear_cross_entropy(h, w, y)),
        "current": torch.compile(lambda h, w, y: cross_entropy(h @ w.t(), y)),
        "torch": torch.compile(lambda h, w, y: F.cross_entropy(F.linear(h, w), y, ignore_index=-100)),
        "fused-eager": lambda h, w, y: linear_cross_entropy(h, w, y),
        "fused-fp8": torch.compile(lambda h, w, y: linear_cross_entropy(h, w, y, fp8=True)),
    }

    def fwd(fn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fn(h, w, y)

    def fwd_bwd(fn):
        fwd(fn).backward()

    figures, grads = {}, {}
    for name, fn in providers.items():
        try:
            h.grad = w.grad = None  # the last provider's timing loop leaves its gradients behind
            fwd_bwd(fn)  # compile outside the timing
            grads[name] = (fwd(fn).detach(), h.grad.clone(), w.grad.clone())
            h.grad = w.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fwd_bwd(fn)
            peak_gb = (torch.cuda.max_memory_allocated() - base) / 1e9
            ms_f = do_bench(lambda: fwd(fn), rep=args.rep, return_mode="median")
            ms_fb = do_bench(lambda: fwd_bwd(fn), rep=args.rep, return_mode="median", grad_to_none=[h, w])
        except Exception as exc:  # a provider that fails on this build is a row, not a crash
            print(json.dumps({"bench": "linear_ce", "provider": name, "error": repr(exc)[:300]}), flush=True)
            continue
        figures[name] = {"fwd": ms_f, "fwd+bwd": ms_fb, "peak_gb": peak_gb}

    # floors: the GEMMs all providers share, and one read + write of the logits
    hb, wb = h.detach().bfloat16(), w.detach().bfloat16()
    z = hb @ wb.t()
    gemms = do_bench(lambda: (hb @ wb.t(), z @ wb, z.t() @ hb), rep=args.rep, return_mode="median")
    copy = do_bench(lambda: z.clone(), rep=args.rep, return_mode="median")
    figures["gemms"] = {"fwd+bwd": gemms}
    figures["copy"] = {"fwd+bwd": copy}

    current = figures.get("current", {})
    for name, fig in figures.items():
        for mode in ("fwd", "fwd+bwd"):
            if mode not in fig:
                continue
            ratio = fig[mode] / current[mode] if mode in current else None
            row = {
                "bench": "linear_ce",
                "provider": name,
                "mode": mode,
                "ms": round(fig[mode], 4),
                "ratio_vs_current": None if ratio is None else round(ratio, 3),
                **meta,
            }
            if mode == "fwd+bwd" and "peak_gb" in fig:
                row["peak_extra_gb"] = round(fig["peak_gb"], 3)
            print(json.dumps(row), flush=True)

    # every provider's error against the same loss in fp32 throughout (no autocast)
    h.grad = w.grad = None
    exact = torch.nn.functional.cross_entropy(h @ w.t(), y, ignore_index=-100)
    exact.backward()
    exact = (exact.detach(), h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    for name, got in grads.items():
        errs = {
            label: round(((a.float() - b.float()).norm() / b.float().norm()).item(), 6)
            for label, a, b in zip(("loss", "grad_h", "grad_w"), got, exact)
        }
        print(json.dumps({"bench": "linear_ce", "check": f"{name} vs fp32", "rel_err": errs}), flush=True)

    if "fused" in grads and "current" in grads:
        for ref in ("current", "torch"):
            if ref not in grads:
                continue
            errs = {}
            for label, a, b in zip(("loss", "grad_h", "grad_w"), grads["fused"], grads[ref]):
                errs[label] = ((a.float() - b.float()).norm() / b.float().norm()).item()
            print(json.dumps({"bench": "linear_ce", "check": f"fused vs {ref}", "rel_err": errs}), flush=True)

    if not args.no_sweep:
        sweep(cross_entropy_rows_triton, z, y, args.rep, do_bench, meta)
        sweep_fp8_tiles(z, y, args.rep, do_bench, meta)
    return 0


def sweep(rows_fn, z, y, rep, do_bench, meta):
    """The Triton pass alone over bf16 logits, per setting; GB/s counts one read and one write of the logits.
    (The pass overwrites its input with G; timing does not depend on the values, so it runs on its output.)"""
    gb = 2 * z.numel() * z.element_size() / 1e9
    grid = itertools.product((1, 2), (2048, 4096, 8192, 16384), (4, 8, 16), (1, 2, 4, None))
    for block_m, block_v, warps, per_sm in grid:
        if block_m * block_v // (warps * 32) > 128:  # fp32 values per thread: more would spill registers
            continue
        try:
            ms = do_bench(
                lambda: rows_fn(z, y, block_m=block_m, block_v=block_v, num_warps=warps, programs_per_sm=per_sm),
                rep=rep // 4,
                return_mode="median",
            )
        except Exception as exc:
            print(
                json.dumps(
                    {
                        "bench": "linear_ce_kernel",
                        "block_m": block_m,
                        "block_v": block_v,
                        "num_warps": warps,
                        "programs_per_sm": per_sm,
                        "error": repr(exc)[:200],
                    }
                ),
                flush=True,
            )
            continue
        print(
            json.dumps(
                {
                    "bench": "linear_ce_kernel",
                    "block_m": block_m,
                    "block_v": block_v,
                    "num_warps": warps,
                    "programs_per_sm": per_sm,
                    "ms": round(ms, 4),
                    "gb_per_s": round(gb / ms * 1e3, 1),
                    "rows": meta["rows"],
                    "vocab": meta["vocab"],
                    "gpu": meta["gpu"],
                }
            ),
            flush=True,
        )


def sweep_fp8_tiles(z, y, rep, do_bench, meta):
    """The FP8 head's gradient pass (linear_ce_kernels.cross_entropy_grad_tiles) per tile shape and warps;
    TB/s counts a read of the bf16 logits and two fp8 writes (G and its transpose)."""
    import torch
    import triton

    from cookmind.kernels import linear_ce_kernels as kernels
    from cookmind.kernels.linear_ce_fp8 import GRAD_DTYPE, GRAD_SCALE, fp8_supported

    if not fp8_supported(z.device):
        return
    n, v = z.shape
    lse = torch.logsumexp(z.float(), -1)
    grad = torch.empty(n, v, dtype=GRAD_DTYPE, device=z.device)
    grad_t = torch.empty(v, n, dtype=GRAD_DTYPE, device=z.device)
    for bm, bv, warps in [
        (64, 128, 4),
        (64, 128, 8),
        (64, 256, 8),
        (128, 128, 8),
        (128, 64, 4),
        (32, 256, 4),
        (128, 256, 8),
        (64, 64, 4),
    ]:

        def run():
            kernels.cross_entropy_grad_tiles[(triton.cdiv(n, bm), triton.cdiv(v, bv))](
                z, lse, y, grad, grad_t, n, v, z.stride(0), -100, GRAD_SCALE, BLOCK_M=bm, BLOCK_V=bv, num_warps=warps
            )

        ms = do_bench(run, rep=rep // 4, return_mode="median")
        print(
            json.dumps(
                {
                    "bench": "linear_ce_fp8_grad_pass",
                    "block_m": bm,
                    "block_v": bv,
                    "num_warps": warps,
                    "ms": round(ms, 4),
                    "tb_per_s": round(n * v * 4 / ms / 1e9, 2),
                    "rows": n,
                    "vocab": v,
                    "gpu": meta["gpu"],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
