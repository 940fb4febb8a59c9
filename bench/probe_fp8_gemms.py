"""FP8 against bf16 for each GEMM of a GPT-2-small training step (M = 12 x 1024 tokens), on a CUDA GPU.

    python3 bench/probe_fp8_gemms.py

Per GEMM (qkv, attention out, gate|up, down, LM head): the forward, grad-input and grad-weight products in
bf16 (torch.mm) and in FP8 (torch._scaled_mm, e4m3 operands, e5m2 gradient, one scale per tensor), and what
the casts that feed FP8 cost when run eagerly. The last line sums a step's worth (12 layers, one head).
The GEMMs alone: what FP8 could save at most; bench/probe_fp8_linears.py measures what it saves in a step.
"""
import json

import torch

torch.manual_seed(0)
dev = "cuda"
M = 12288
# (K, N, count per step)
shapes = {"qkv": (768, 2304, 12), "proj": (768, 768, 12), "gateup": (768, 4096, 12), "down": (2048, 768, 12),
          "head": (768, 50304, 1)}
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2

def timeit(fn, n=30):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n

def to8(t, dt):
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dt).max / amax
    return (t.float() * scale).to(dt), scale.reciprocal()

tot = {"bf16": 0.0, "fp8": 0.0, "cast": 0.0}
for name, (K, N, cnt) in shapes.items():
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
    go = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    # bf16: fwd x@w.T, bwd dx = go@w, dw = go.T@x
    b_f = timeit(lambda: x @ w.t()); b_dx = timeit(lambda: go @ w); b_dw = timeit(lambda: go.t() @ x)
    x8, sx = to8(x, E4); w8, sw = to8(w, E4); g8, sg = to8(go, E5)
    # _scaled_mm wants A row-major, B column-major
    wT = w8.t()                              # [K,N] column-major view of row-major w8
    f_f = timeit(lambda: torch._scaled_mm(x8, wT, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16))
    w8t = w8.t().contiguous().t()            # [N,K]... need B=[N,K] col-major for go@w: w [N,K] col-major = w.t().contiguous().t()
    f_dx = timeit(lambda: torch._scaled_mm(g8, w8t, scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16))
    g8t = g8.t().contiguous()                # [N,M] row-major
    x8c = x8.t().contiguous().t()            # [M,K] col-major
    f_dw = timeit(lambda: torch._scaled_mm(g8t, x8c, scale_a=sg, scale_b=sx, out_dtype=torch.bfloat16))
    c = timeit(lambda: to8(x, E4)) + timeit(lambda: to8(go, E5)) + timeit(lambda: g8.t().contiguous()) + timeit(lambda: x8.t().contiguous())
    row = {"gemm": name, "K": K, "N": N, "bf16_ms": round(b_f + b_dx + b_dw, 4), "fp8_ms": round(f_f + f_dx + f_dw, 4),
           "fwd": [round(b_f, 4), round(f_f, 4)], "dx": [round(b_dx, 4), round(f_dx, 4)], "dw": [round(b_dw, 4), round(f_dw, 4)],
           "eager_cast_ms": round(c, 4)}
    print(json.dumps(row), flush=True)
    tot["bf16"] += cnt * (b_f + b_dx + b_dw); tot["fp8"] += cnt * (f_f + f_dx + f_dw); tot["cast"] += cnt * c
print(json.dumps({k: round(v, 3) for k, v in tot.items()}))
