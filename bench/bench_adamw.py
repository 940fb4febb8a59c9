"""AdamW's step over a preset's parameters: PyTorch's fused kernel against ours (cookmind/kernels/adamw.py).

    python bench/bench_adamw.py --shape llama-1.3b          # CUDA; the 1.27B float32 parameters of the 1.3B shape
    python bench/bench_adamw.py --shape qwen3-0.6b --blocks 1024,2048,4096

Both run with what the Trainer passes (the lr, a skip flag and a gradient divisor read from device memory), on the
same parameters, same process. Prints one JSON line per figure: ms per step, the bandwidth it implies (28 bytes a
float32 element: read p, g, m, v, write p, m, v), a device-to-device copy's bandwidth as the roofline, and the
largest difference of the parameters from torch.optim.AdamW's after 3 steps from the same start.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuda_timing import cuda_ms as timed  # noqa: E402  (bench/ is the script's folder)

from cookmind.kernels.adamw import adamw_triton_  # noqa: E402


def preset_shapes(name: str) -> list[torch.Size]:
    """The parameter shapes of a preset's model (built on the meta device: no memory)."""
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.train.config import TrainConfig

    with torch.device("meta"):
        model = CookMindLM(CookMindConfig.from_dict(dict(TrainConfig.load(name).model)))
    return [p.shape for p in model.parameters()]


def copy_time(n: int, dev: torch.device) -> float:
    """Milliseconds to copy n float32 elements device to device (read 4 + write 4 bytes each)."""
    src, dst = torch.empty(n, device=dev), torch.empty(n, device=dev)
    return timed(lambda: dst.copy_(src), 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-1.3b", choices=["qwen3-0.6b", "llama-1.3b", "gpt2-small"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--blocks", default="2048", help="comma-separated elements per Triton program to try")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_adamw: needs CUDA (the kernels under test are GPU kernels)")
    dev = torch.device("cuda")
    shapes = preset_shapes(args.shape)
    n = sum(s.numel() for s in shapes)
    gen = torch.Generator(device=dev).manual_seed(0)
    params = [torch.randn(s, device=dev, generator=gen) * 0.02 for s in shapes]
    grads = [torch.randn(s, device=dev, generator=gen) * 1e-3 for s in shapes]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    steps = [torch.zeros((), device=dev) for _ in params]
    lr = torch.tensor(3e-4, device=dev)
    found_inf = torch.zeros((), device=dev)
    divisor = torch.tensor(1.0, device=dev)
    hyper = dict(beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8)
    common = {"shape": args.shape, "params": n, "tensors": len(shapes), "device": torch.cuda.get_device_name(dev)}

    copy_ms = copy_time(n, dev)
    print(json.dumps({"figure": "copy roofline", **common, "tb_per_s": round(8 * n / copy_ms / 1e9, 2)}), flush=True)

    def torch_fused():
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(
            params, grads, ms, vs, [], steps, amsgrad=False, lr=lr, maximize=False,
            grad_scale=divisor, found_inf=found_inf, **hyper,
        )  # fmt: skip

    figures = {"torch._fused_adamw_": timed(torch_fused, args.iters)}
    for block in [int(b) for b in args.blocks.split(",") if b]:

        def ours(block=block):
            torch._foreach_add_(steps, 1)
            adamw_triton_(
                params, grads, ms, vs, steps, lr=lr, grad_scale=divisor, found_inf=found_inf, block=block, **hyper
            )

        figures[f"triton, {block} a program"] = timed(ours, args.iters)
    base = figures["torch._fused_adamw_"]
    for name, t in figures.items():
        line = {"figure": "adamw ms per step", "impl": name, **common, "ms": round(t, 3)}
        line["tb_per_s"] = round(28 * n / t / 1e9, 2)
        line["speedup_vs_torch_fused"] = round(base / t, 3)
        print(json.dumps(line), flush=True)

    # correctness: 3 steps from the same start against torch.optim.AdamW (its default, non-fused path)
    sub = slice(0, 8)
    ref = [p[sub].clone().requires_grad_(True) for p in params]
    mine = [p[sub].clone() for p in params]
    opt = torch.optim.AdamW(ref, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, foreach=False)
    m2, v2 = [torch.zeros_like(p) for p in mine], [torch.zeros_like(p) for p in mine]
    s2 = [lr.new_zeros(()) for _ in mine]
    for _ in range(3):
        gs = [torch.randn(p.shape, device=dev, generator=gen) * 1e-3 for p in mine]
        for r, g in zip(ref, gs, strict=True):
            r.grad = g.clone()
        opt.step()
        torch._foreach_add_(s2, 1)
        adamw_triton_(mine, gs, m2, v2, s2, lr=lr, **hyper)
    diff = max((a - b.detach()).abs().max().item() for a, b in zip(mine, ref, strict=True))
    print(json.dumps({"figure": "adamw vs torch.optim.AdamW after 3 steps", **common, "max_abs_diff": diff}))


if __name__ == "__main__":
    main()
