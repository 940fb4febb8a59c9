"""Which FP8 format for the FP8 LM head's loss gradient G: errors against fp32, on a CUDA GPU.

    python3 bench/probe_fp8_grad_format.py

linear_cross_entropy(fp8=True) at N=4096, C=768, V=50304 with G in e4m3 (scale 256 or 448) or e5m2 (scale 2^15),
and the bf16 path, against the same loss in fp32: relative error of the loss and of both gradients, for
near-uniform logits (an untrained head) and peaked ones. Sets linear_ce_fp8's module constants in this process.
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cookmind.kernels.linear_ce_fp8 as F8  # noqa: E402
from cookmind.kernels.linear_ce import linear_cross_entropy  # noqa: E402

torch.manual_seed(0)
n, c, v = 4096, 768, 50304
for regime, hs, ws in (("init (near-uniform softmax)", 1.0, 0.02), ("trained-like (peaked)", 1.0, 0.15)):
    h = (torch.randn(n, c, device="cuda") * hs).requires_grad_()
    w = (torch.randn(v, c, device="cuda") * ws).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda")
    ref = torch.nn.functional.cross_entropy(h @ w.t(), y); ref.backward()
    rh, rw = h.grad.clone(), w.grad.clone()
    for name, dt, sc, fp8 in (("bf16", None, None, False), ("e4m3/256", torch.float8_e4m3fn, 256.0, True),
                              ("e4m3/448", torch.float8_e4m3fn, 448.0, True), ("e5m2/2^15", torch.float8_e5m2, 32768.0, True)):
        if fp8:
            F8.GRAD_DTYPE, F8.GRAD_SCALE = dt, sc
        h.grad = w.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = linear_cross_entropy(h, w, y, fp8=fp8)
        loss.backward()
        rel = lambda a, b: ((a - b).norm() / b.norm()).item()
        cos = lambda a, b: torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0).item()
        print(json.dumps({"regime": regime, "grad": name, "loss_ref": round(ref.item(), 4), "loss_err": abs(loss.item() - ref.item()),
                          "gh_rel": round(rel(h.grad, rh), 5), "gw_rel": round(rel(w.grad, rw), 5),
                          "gw_norm_ratio": round((w.grad.norm() / rw.norm()).item(), 5), "gw_cos": round(cos(w.grad, rw), 6)}), flush=True)
