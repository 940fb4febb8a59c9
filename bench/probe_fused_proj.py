"""Would training gain from one QKV GEMM and one gate/up GEMM at the preset shapes? (#18)

    python bench/probe_fused_proj.py                        # CUDA; llama-1.3b and qwen3-0.6b, M = 8 x 2048 rows
    python bench/probe_fused_proj.py --shape llama-1.3b --rows 8192

For one decoder layer's input projections, forward and backward (y = x W^T, dx, dW) with bf16 weights (as under
train.master_weights), same process, CUDA events:
- ``separate``: q, k, v (gate, up) as their own GEMMs, dx summed: what the Trainer runs today;
- ``stacked``: one GEMM over weights already stored as one tensor (the upper bound: no copy);
- ``cat``: the weights concatenated each step, the stacked gradient split back (what a training path that keeps
  the parameters separate would pay).
Prints one JSON line per group and mode: ms, TFLOP/s and the ratio to ``separate``.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from cuda_timing import cuda_ms  # bench/ is the script's folder

SHAPES = {  # hidden, q rows, kv rows each, ffn
    "llama-1.3b": (2048, 2048, 1024, 5632),
    "qwen3-0.6b": (1024, 2048, 1024, 3072),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-1.3b,qwen3-0.6b")
    ap.add_argument("--rows", type=int, default=16384, help="tokens in a micro-batch (B x T)")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    for shape in args.shape.split(","):
        hidden, nq, nkv, ffn = SHAPES[shape]
        for group, outs in (("qkv", [nq, nkv, nkv]), ("gate_up", [ffn, ffn])):
            x = torch.randn(args.rows, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
            ws = [torch.randn(n, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True) for n in outs]
            stacked = torch.cat([w.detach() for w in ws]).requires_grad_(True)
            dy = torch.randn(args.rows, sum(outs), device=dev, dtype=torch.bfloat16)
            dys = list(dy.split(outs, dim=1))

            def separate():
                ys = [F.linear(x, w) for w in ws]
                torch.autograd.backward(ys, dys)

            def one():
                F.linear(x, stacked).backward(dy)

            def cat():
                F.linear(x, torch.cat(ws)).backward(dy)

            flops = 6 * args.rows * hidden * sum(outs)
            base = None
            for mode, fn in (("separate", separate), ("stacked", one), ("cat", cat)):
                ms = cuda_ms(fn, args.iters)
                base = base or ms
                print(
                    json.dumps(
                        {
                            "figure": "projection fwd+bwd",
                            "shape": shape,
                            "group": group,
                            "rows": args.rows,
                            "mode": mode,
                            "ms": round(ms, 3),
                            "tflops": round(flops / ms / 1e9, 1),
                            "vs_separate": round(base / ms, 3),
                            "device": torch.cuda.get_device_name(),
                            "torch": torch.__version__,
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
