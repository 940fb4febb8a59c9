"""Does FP8 in every Linear of the blocks speed up a GPT-2-small training step? (A speed probe on a CUDA GPU.)

    python3 bench/probe_fp8_linears.py none|dx|all

The Trainer as bench/bench_train.py times it (B=12, T=1024, bf16 autocast, torch.compile, train.cuda_graph,
model.lm_head_fp8), with cookmind's Linear patched in this process only: "all" runs forward, grad-input and
grad-weight as torch._scaled_mm (e4m3 activations and weights, e5m2 gradients, one dynamic scale per tensor,
the amax and casts left to torch.compile to fuse), "dx" keeps the grad-weight GEMM in bf16, "none" patches
nothing. Prints tokens/s. Not a training recipe: nothing checks the numerics here.
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_train as BT  # noqa: E402

import cookmind.model.linear as L  # noqa: E402

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def quantize(x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in fp8, the scale that undoes it): one amax scale for the whole tensor."""
    fmax = torch.finfo(dtype).max
    amax = x.detach().abs().amax().float().clamp(min=1e-12)
    return (x.float() * (fmax / amax)).clamp(-fmax, fmax).to(dtype), amax / fmax


def col_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix stored column-major: _scaled_mm wants A row-major and B column-major."""
    return t.t().contiguous().t()


class FP8Linear(torch.autograd.Function):
    """y = x W^T with the forward and grad-input GEMMs in FP8; grad-weight in FP8 too when dw_fp8."""

    @staticmethod
    def forward(ctx, x, w, dw_fp8: bool):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        x8, sx = quantize(x2, E4)
        w8, sw = quantize(w, E4)
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        ctx.save_for_backward(x8 if dw_fp8 else x2.to(torch.bfloat16), sx, w8, sw)
        ctx.dw_fp8, ctx.shape = dw_fp8, shape
        return y.view(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, go):
        x_saved, sx, w8, sw = ctx.saved_tensors
        go2 = go.reshape(-1, go.shape[-1])
        g8, sg = quantize(go2, E5)
        dx = torch._scaled_mm(g8, col_major(w8), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
        if ctx.dw_fp8:
            dw = torch._scaled_mm(
                g8.t().contiguous(), col_major(x_saved), scale_a=sg, scale_b=sx, out_dtype=torch.float32
            )
        else:
            dw = (go2.to(torch.bfloat16).t() @ x_saved).float()
        return dx.view(ctx.shape), dw, None


def patch_linear(dw_fp8: bool) -> None:
    """cookmind's Linear (bias-free, dims multiples of 16, on CUDA) through FP8Linear, in this process."""
    readable = L.Linear.forward

    def forward(self, x):
        if x.is_cuda and self.bias is None and x.shape[-1] % 16 == 0 and self.out_features % 16 == 0:
            return FP8Linear.apply(x.to(torch.bfloat16), self.weight, dw_fp8)
        return readable(self, x)

    L.Linear.forward = forward


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "all"
    if mode not in ("none", "dx", "all"):
        raise SystemExit(f"probe_fp8_linears: mode must be none, dx or all, got {mode!r}")
    torch.backends.cuda.matmul.allow_tf32 = True
    if mode != "none":
        patch_linear(dw_fp8=mode == "all")
    shape = dict(BT.GPT2_SMALL, lm_head_fp8=True)
    r = BT.bench_cookmind(shape, 12, 1024, 30, 10, torch.device("cuda"), "bf16", True, "/tmp/f8run", cuda_graph=True)
    print(
        json.dumps(
            {
                "fp8_linears": mode,
                "tokens_per_s": round(r["tokens_per_s"]),
                "ms_per_step": round(12 * 1024 / r["tokens_per_s"] * 1e3, 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
