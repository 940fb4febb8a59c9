"""FP8 against bf16 for each GEMM of a GPT-2-small training step (M = 12 x 1024 tokens), on a CUDA GPU.

    python3 bench/probe_fp8_gemms.py

Per GEMM (qkv, attention out, gate|up, down, LM head): the forward, grad-input and grad-weight products in
bf16 (torch.mm) and in FP8 (torch._scaled_mm, e4m3 operands, e5m2 gradient, one scale per tensor), and what
the casts that feed FP8 cost when run eagerly. The last line sums a step's worth (12 layers, one head).
The GEMMs alone: what FP8 could save at most; bench/probe_fp8_linears.py measures what it saves in a step.
"""

import json

import torch
from cuda_timing import cuda_ms as timeit  # bench/ is the script's folder

M = 12 * 1024  # tokens per step
# name: (K in, N out, how many per step)
GEMMS = {
    "qkv": (768, 2304, 12),
    "proj": (768, 768, 12),
    "gateup": (768, 4096, 12),
    "down": (2048, 768, 12),
    "head": (768, 50304, 1),
}
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def to8(t: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in fp8, the scale that undoes it): one amax scale for the whole tensor."""
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).to(dtype), scale.reciprocal()


def col_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix stored column-major: _scaled_mm wants A row-major and B column-major."""
    return t.t().contiguous().t()


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    total = {"bf16": 0.0, "fp8": 0.0, "cast": 0.0}
    for name, (k, n, count) in GEMMS.items():
        x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        go = torch.randn(M, n, device=dev, dtype=torch.bfloat16)
        # bf16: forward x W^T, grad-input go W, grad-weight go^T x
        bf16 = [timeit(lambda: x @ w.t()), timeit(lambda: go @ w), timeit(lambda: go.t() @ x)]
        x8, sx = to8(x, E4)
        w8, sw = to8(w, E4)
        g8, sg = to8(go, E5)
        w8_cm, g8_t, x8_cm = col_major(w8), g8.t().contiguous(), col_major(x8)
        fp8 = [
            timeit(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)),
            timeit(lambda: torch._scaled_mm(g8, w8_cm, scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)),
            timeit(lambda: torch._scaled_mm(g8_t, x8_cm, scale_a=sg, scale_b=sx, out_dtype=torch.bfloat16)),
        ]
        # what feeds them, run eagerly: quantise x and go, and the transposed copies grad-weight needs
        cast = (
            timeit(lambda: to8(x, E4))
            + timeit(lambda: to8(go, E5))
            + timeit(lambda: g8.t().contiguous())
            + timeit(lambda: x8.t().contiguous())
        )
        print(
            json.dumps(
                {
                    "gemm": name,
                    "K": k,
                    "N": n,
                    "bf16_ms": round(sum(bf16), 4),
                    "fp8_ms": round(sum(fp8), 4),
                    **{part: [round(b, 4), round(f, 4)] for part, b, f in zip(("fwd", "dx", "dw"), bf16, fp8)},
                    "eager_cast_ms": round(cast, 4),
                }
            ),
            flush=True,
        )
        total["bf16"] += count * sum(bf16)
        total["fp8"] += count * sum(fp8)
        total["cast"] += count * cast
    print(json.dumps({"per_step_ms": {key: round(v, 3) for key, v in total.items()}}), flush=True)


if __name__ == "__main__":
    main()
