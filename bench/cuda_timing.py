"""CUDA-event timing shared by the GPU micro-benchmarks (bench_adamw, probe_fp8_gemms, probe_fused_proj)."""

from __future__ import annotations

import torch


def cuda_ms(fn, iters: int = 30, warmup: int = 3) -> float:
    """Mean milliseconds per call of ``fn`` over ``iters`` calls, after ``warmup`` calls, by CUDA events."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
