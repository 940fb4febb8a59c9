"""Fast accumulation in FP8 GEMMs: each GEMM of a training step with ``use_fast_accum`` off and on (#18).

    python3 bench/probe_fp8_fast_accum.py --shape qwen3-0.6b --tokens 32768
    python3 bench/probe_fp8_fast_accum.py --shape llama-1.3b --tokens 16384

Hopper's FP8 tensor cores accumulate a product in fewer bits than fp32; with ``use_fast_accum=False`` cuBLAS
moves the partial sums into fp32 registers every few steps of the reduction, which costs time. torchao's
tensorwise recipe accumulates fast only in the forward GEMM (``gemm_config_output``) and keeps full precision in
the two backward ones (grad-input, grad-weight); cookmind's FP8 LM head uses full precision in all three.

Per projection of a decoder block and for the LM head: the forward (x W^T), grad-input (dY W) and grad-weight
(dY^T x) GEMMs through ``torch._scaled_mm`` (e4m3 inputs and weights, e5m2 gradients, one scale per tensor, as
torchao casts them), timed by CUDA events with fast accumulation off and on, and each one's relative error
against the fp32 product of the same float8 operands (the accumulation's error alone, not the casts'). The
last line sums a step's worth (every layer's projections and the head). One JSON line per GEMM.
"""

from __future__ import annotations

import argparse
import json

import torch
from cuda_timing import cuda_ms  # bench/ is the script's folder
from probe_fp8_gemms import E4, E5, col_major, to8  # the same casts: one amax scale a tensor

# (hidden, q width, kv width, ffn, layers, vocab): cookmind/configs/qwen3-0.6b.yaml and llama-1.3b.yaml
SHAPES = {
    "qwen3-0.6b": (1024, 2048, 1024, 3072, 28, 151936),
    "llama-1.3b": (2048, 2048, 1024, 5632, 24, 32768),
}


def projections(shape: str) -> dict[str, tuple[int, int, int]]:
    """name -> (K in, N out, how many per step)."""
    c, q, kv, f, layers, vocab = SHAPES[shape]
    return {
        "q_proj": (c, q, layers),
        "k_proj|v_proj": (c, kv, 2 * layers),
        "o_proj": (q, c, layers),
        "gate_proj|up_proj": (c, f, 2 * layers),
        "down_proj": (f, c, layers),
        "lm_head": (c, vocab, 1),
    }


def rel_err(out: torch.Tensor, a8, b8, sa, sb) -> float:
    """|out - ref| / |ref| (Frobenius), ref the fp32 product of the same float8 operands and scales."""
    ref = (a8.float() * sa) @ (b8.float() * sb)
    return ((out.float() - ref).norm() / ref.norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--tokens", type=int, default=32768, help="rows of a step's activations (batch x sequence)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_fp8_fast_accum.py: needs a CUDA GPU with FP8 tensor cores (Hopper or Ada)")
    torch.manual_seed(0)
    dev, m = "cuda", args.tokens
    total = {"full_ms": 0.0, "fast_ms": 0.0}
    for name, (k, n, count) in projections(args.shape).items():
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        go = torch.randn(m, n, device=dev, dtype=torch.bfloat16) * 1e-3
        x8, sx = to8(x, E4)
        w8, sw = to8(w, E4)
        g8, sg = to8(go, E5)
        w8_cm, g8_t, x8_cm = col_major(w8), g8.t().contiguous(), col_major(x8)
        gemms = {  # (A, B, scale A, scale B, the operands for the error check)
            "fwd": (x8, w8.t(), sx, sw),
            "dx": (g8, w8_cm, sg, sw),
            "dw": (g8_t, x8_cm, sg, sx),
        }
        line = {"shape": args.shape, "gemm": name, "K": k, "N": n, "M": m, "per_step": count}
        for part, (a, b, sa, sb) in gemms.items():
            times, errs = [], []
            for fast in (False, True):

                def run(a=a, b=b, sa=sa, sb=sb, fast=fast):
                    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

                times.append(cuda_ms(run, iters=args.iters))
                errs.append(rel_err(run(), a, b, sa, sb))
            line[part] = {
                "full_ms": round(times[0], 4),
                "fast_ms": round(times[1], 4),
                "speedup": round(times[0] / times[1], 3),
                "err_full": float(f"{errs[0]:.2e}"),
                "err_fast": float(f"{errs[1]:.2e}"),
            }
            total["full_ms"] += count * times[0]
            total["fast_ms"] += count * times[1]
        print(json.dumps(line), flush=True)
        del x, w, go, x8, w8, g8, w8_cm, g8_t, x8_cm
        torch.cuda.empty_cache()
    total = {key: round(v, 2) for key, v in total.items()}
    total["speedup"] = round(total["full_ms"] / total["fast_ms"], 3)
    print(json.dumps({"shape": args.shape, "M": m, "per_step_all_gemms": total}), flush=True)


if __name__ == "__main__":
    main()
