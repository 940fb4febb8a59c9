"""How fast are a training step's GEMMs at the preset shapes, and does the BLAS library pick matter? (#18)

    python bench/probe_blas.py                              # CUDA; llama-1.3b and qwen3-0.6b, M = 8 x 2048 rows
    CUBLASLT_WORKSPACE_SIZE=65536 python bench/probe_blas.py --libs cublaslt   # a larger cuBLASLt workspace (KiB)

The profiles put the 1.3B step's GEMMs at ~70% of the bf16 peak: the largest lever left at that shape. Every
matmul a decoder layer and the LM head run in one training step (y = x W^T, dx = dy W, dW = dy^T x, in the layouts
F.linear and autograd use), bf16, timed by CUDA events in one process under each of
``torch.backends.cuda.preferred_blas_library`` (cuBLAS, cuBLASLt). Prints one JSON line per GEMM kind and library
(ms, TFLOP/s), and one per shape and library: the step's GEMM time (layers x per-layer + head) and its TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from cuda_timing import cuda_ms  # bench/ is the script's folder

SHAPES = {  # hidden, q out, kv out each, ffn, vocab, layers
    "llama-1.3b": (2048, 2048, 1024, 5632, 32768, 24),
    "qwen3-0.6b": (1024, 2048, 1024, 3072, 151936, 28),
}


def gemms(hidden: int, nq: int, nkv: int, ffn: int, vocab: int) -> list[tuple[str, int, int, int]]:
    """(name, count per layer or 0 for the head, in features, out features) of every projection."""
    return [
        ("q", 1, hidden, nq),
        ("kv", 2, hidden, nkv),
        ("o", 1, nq, hidden),
        ("gate_up", 2, hidden, ffn),
        ("down", 1, ffn, hidden),
        ("head", 0, hidden, vocab),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-1.3b,qwen3-0.6b")
    ap.add_argument("--rows", type=int, default=16384, help="tokens in a micro-batch (B x T)")
    ap.add_argument("--libs", default="cublas,cublaslt")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    peak = 989e12 if "H100" in torch.cuda.get_device_name() or "H200" in torch.cuda.get_device_name() else None
    env = {k: os.environ[k] for k in ("CUBLASLT_WORKSPACE_SIZE", "CUBLAS_WORKSPACE_CONFIG") if k in os.environ}
    for shape in args.shape.split(","):
        hidden, nq, nkv, ffn, vocab, layers = SHAPES[shape]
        m = args.rows
        for lib in args.libs.split(","):
            torch.backends.cuda.preferred_blas_library(lib)
            step_ms = step_flops = 0.0
            for name, count, k, n in gemms(hidden, nq, nkv, ffn, vocab):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
                dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
                kinds = (
                    ("fwd", lambda: torch.mm(x, w.t())),  # F.linear's forward
                    ("dgrad", lambda: torch.mm(dy, w)),  # autograd's grad input
                    ("wgrad", lambda: torch.mm(dy.t(), x)),  # autograd's grad weight
                )
                times = []
                for kind, fn in kinds:
                    ms = cuda_ms(fn, args.iters)
                    times.append(ms)
                    tflops = 2 * m * k * n / ms / 1e9
                    print(
                        json.dumps(
                            {
                                "probe": "blas gemm",
                                "shape": shape,
                                "lib": lib,
                                "gemm": f"{name}.{kind}",
                                "m_n_k": [m, n, k] if kind == "fwd" else [m, k, n] if kind == "dgrad" else [n, k, m],
                                "ms": round(ms, 4),
                                "tflops": round(tflops, 1),
                                **({"of_peak": round(tflops * 1e12 / peak, 3)} if peak else {}),
                            }
                        ),
                        flush=True,
                    )
                times_ms = sum(times)
                reps = layers * count if count else 1
                step_ms += reps * times_ms
                step_flops += reps * 3 * 2 * m * k * n
            line = {
                "probe": "blas step",
                "shape": shape,
                "lib": lib,
                "rows": m,
                "gemm_ms_per_step": round(step_ms, 2),
                "tflops": round(step_flops / step_ms / 1e9, 1),
                **({"of_peak": round(step_flops / step_ms / 1e-3 / peak, 3)} if peak else {}),
                "env": env,
                "torch": torch.__version__,
            }
            print(json.dumps(line), flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")


if __name__ == "__main__":
    main()
