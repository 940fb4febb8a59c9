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

def q(x, dt):
    fmax = torch.finfo(dt).max
    amax = x.detach().abs().amax().float().clamp(min=1e-12)
    return (x.float() * (fmax / amax)).clamp(-fmax, fmax).to(dt), amax / fmax

def colmaj(t):
    return t.t().contiguous().t()

class F8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, dw_fp8):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        x8, sx = q(x2, E4)
        w8, sw = q(w, E4)
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        ctx.save_for_backward(x8 if dw_fp8 else x2.to(torch.bfloat16), sx, w8, sw)
        ctx.dw_fp8, ctx.shape = dw_fp8, shape
        return y.view(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, go):
        xs, sx, w8, sw = ctx.saved_tensors
        go2 = go.reshape(-1, go.shape[-1])
        g8, sg = q(go2, E5)
        dx = torch._scaled_mm(g8, colmaj(w8), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
        if ctx.dw_fp8:
            dw = torch._scaled_mm(g8.t().contiguous(), colmaj(xs), scale_a=sg, scale_b=sx, out_dtype=torch.float32)
        else:
            dw = (go2.to(torch.bfloat16).t() @ xs).float()
        return dx.view(ctx.shape), dw, None

def patch(dw_fp8):
    orig = L.Linear.forward
    def fwd(self, x):
        if x.is_cuda and self.bias is None and x.shape[-1] % 16 == 0 and self.out_features % 16 == 0:
            return F8.apply(x.to(torch.bfloat16), self.weight, dw_fp8)
        return orig(self, x)
    L.Linear.forward = fwd

if __name__ == "__main__":
    mode = sys.argv[1]
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    if mode != "none":
        patch(mode == "all")
    shape = dict(BT.GPT2_SMALL, lm_head_fp8=True)
    r = BT.bench_cookmind(shape, 12, 1024, 30, 10, dev, "bf16", True, "/tmp/f8run", cuda_graph=True)
    print(json.dumps({"fp8_linears": mode, "tokens_per_s": round(r["tokens_per_s"]), "ms_per_step": round(12 * 1024 / r["tokens_per_s"] * 1e3, 3)}), flush=True)
