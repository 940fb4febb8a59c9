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

# (label, G's dtype, its scale, fp8 at all)
FORMATS = (
    ("bf16", None, None, False),
    ("e4m3/256", torch.float8_e4m3fn, 256.0, True),
    ("e4m3/448", torch.float8_e4m3fn, 448.0, True),
    ("e5m2/2^15", torch.float8_e5m2, 32768.0, True),
)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main() -> None:
    torch.manual_seed(0)
    n, c, v = 4096, 768, 50304
    for regime, w_std in (("init (near-uniform softmax)", 0.02), ("trained-like (peaked)", 0.15)):
        h = torch.randn(n, c, device="cuda").requires_grad_()
        w = (torch.randn(v, c, device="cuda") * w_std).requires_grad_()
        y = torch.randint(0, v, (n,), device="cuda")
        ref = torch.nn.functional.cross_entropy(h @ w.t(), y)  # fp32 throughout
        ref.backward()
        ref_gh, ref_gw = h.grad.clone(), w.grad.clone()
        for label, dtype, scale, fp8 in FORMATS:
            if fp8:
                F8.GRAD_DTYPE, F8.GRAD_SCALE = dtype, scale
            h.grad = w.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = linear_cross_entropy(h, w, y, fp8=fp8)
            loss.backward()
            cos = torch.nn.functional.cosine_similarity(w.grad.flatten(), ref_gw.flatten(), 0).item()
            print(
                json.dumps(
                    {
                        "regime": regime,
                        "grad": label,
                        "loss_ref": round(ref.item(), 4),
                        "loss_err": abs(loss.item() - ref.item()),
                        "gh_rel": round(rel(h.grad, ref_gh), 5),
                        "gw_rel": round(rel(w.grad, ref_gw), 5),
                        "gw_norm_ratio": round((w.grad.norm() / ref_gw.norm()).item(), 5),
                        "gw_cos": round(cos, 6),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
