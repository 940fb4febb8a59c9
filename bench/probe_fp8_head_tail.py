"""Why the FP8 LM head trains worse at a large vocabulary: its loss gradient's small entries, on a CPU.

    python3 bench/probe_fp8_head_tail.py [--vocab 151936] [--used 8192] [--steps 150]

The FP8 head (cookmind/kernels/linear_ce_fp8.py) stores the loss gradient G = softmax(z) - onehot(y) in e4m3 at a
fixed scale of 256 (|G| <= 1). e4m3's smallest subnormal is 2^-9, so every entry below 2^-10 / 256 = 3.8e-6 rounds
to zero. With a 151,936-entry vocabulary of which a run's text uses 8,192 (bench_fp8_loss's tokenizer; any corpus
leaves most of Qwen's vocabulary rare), the probability left on the unused entries is spread below that: their
gradient is all zero, so the head never pushes them down, and the loss keeps the mass they hold. bf16 keeps
those entries (its smallest subnormal is ~1e-40); so does e5m2 at a scale of 2^15 (smallest 2^-16 / 2^15 = 4.7e-10).

On one CPU thread, a bigram model (an embedding, a norm, a tied or untied head) trains on random token pairs drawn
from the ``--used`` ids, with the head's loss computed four ways from the same start: fp32; e4m3 h and W with G in
e4m3 x 256 (the head as shipped); the same with G in e5m2 x 2^15; and fp32 with G alone in e4m3 x 256. The GEMMs
of the FP8 ways are fp32 products of the rounded operands (the fp32 emulation the GPU tests check the op
against). One JSON line per way: the final loss (mean of the last 10 steps), the probability mass left on the
unused ids, and the share of the unused ids' gradient entries that are zero in the last step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.kernels.linear_ce_fp8 import quantize as head_quantize  # noqa: E402 (run as a script too)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x rounded as the FP8 head rounds h and W (e4m3, one scale per tensor), back in fp32."""
    x8, scale = head_quantize(x)
    return x8.float() * scale


class EmulatedHead(torch.autograd.Function):
    """Mean next-token NLL of ``h @ w.T`` with the FP8 head's roundings: h and W (when ``operands``) to e4m3 per
    tensor, G to ``grad_dtype`` at ``grad_scale`` (None: G kept in fp32). Saves the zero share of G's entries on
    the columns ``tail`` for the caller."""

    last_zero_share = 0.0

    @staticmethod
    def forward(ctx, h, w, y, operands: bool, grad_dtype, grad_scale, tail):
        h8 = quantize(h) if operands else h
        w8 = quantize(w) if operands else w
        z = h8 @ w8.t()
        nll = torch.logsumexp(z, -1) - z.gather(1, y[:, None])[:, 0]
        g = torch.softmax(z, -1)
        g[torch.arange(len(y)), y] -= 1.0
        if grad_dtype is not None:
            g = (g * grad_scale).to(grad_dtype).float() / grad_scale
        EmulatedHead.last_zero_share = (g[:, tail] == 0).float().mean().item()
        ctx.save_for_backward(h8, w8, g)
        return nll.mean()

    @staticmethod
    def backward(ctx, upstream):
        h8, w8, g = ctx.saved_tensors
        g = g * (upstream / g.shape[0])
        return g @ w8, g.t() @ h8, None, None, None, None, None


WAYS = {  # name: (h and W in e4m3, G's dtype, G's scale, what it is)
    "fp32": (False, None, None, "fp32"),
    "fp8": (True, E4M3, 256.0, "fp8 head as shipped: h, W e4m3, G e4m3 x256"),
    "fp8-g-e5m2": (True, E5M2, 32768.0, "fp8 head with G in e5m2 x2^15"),
    "g-e4m3": (False, E4M3, 256.0, "fp32 but G in e4m3 x256"),
}


def train(way, vocab: int, used: int, steps: int, width: int, batch: int, lr: float, tied: bool) -> dict:
    operands, grad_dtype, grad_scale, what = WAYS[way]
    torch.manual_seed(0)
    emb = torch.nn.Embedding(vocab, width)
    torch.nn.init.normal_(emb.weight, std=0.02)
    head = emb.weight if tied else torch.nn.Parameter(torch.randn(vocab, width) * 0.02)
    mix = torch.nn.Linear(width, width)
    norm = torch.nn.RMSNorm(width)
    params = [*emb.parameters(), *mix.parameters(), *norm.parameters()] + ([] if tied else [head])
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    table = torch.randint(0, used, (used, 4), generator=g)  # each used id is followed by one of 4 others
    tail = torch.arange(used, vocab)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, used, (batch,), generator=g)
        y = table[x, torch.randint(0, 4, (batch,), generator=g)]
        h = norm(emb(x) + torch.tanh(mix(emb(x))))
        loss = EmulatedHead.apply(h, head, y, operands, grad_dtype, grad_scale, tail)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        x = torch.arange(used)
        h = norm(emb(x) + torch.tanh(mix(emb(x))))
        tail_mass = torch.softmax(h @ head.t(), -1)[:, used:].sum(-1).mean().item()
    return {
        "figure": "fp8 head tail",
        "way": way,
        "what": what,
        "vocab": vocab,
        "used": used,
        "tied": tied,
        "steps": steps,
        "final_loss": round(sum(losses[-10:]) / 10, 4),
        "first_loss": round(losses[0], 4),
        "unused_mass": round(tail_mass, 4),
        "unused_grad_zero_share": round(EmulatedHead.last_zero_share, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936, help="the head's rows (default Qwen3's 151936)")
    ap.add_argument("--used", type=int, default=8192, help="ids the data uses (default bench_fp8_loss's 8192)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--untied", action="store_true", help="a head of its own (Qwen3-0.6B ties it to the embedding)")
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of: " + ", ".join(WAYS))
    args = ap.parse_args(argv)
    if not 0 < args.used < args.vocab:
        ap.error("--used must lie between 0 and --vocab: the ids beyond it are the unused tail")
    torch.set_num_threads(1)
    for way in [w for w in args.ways.split(",") if w]:
        if way not in WAYS:
            ap.error(f"--ways: unknown {way!r}; choose from {', '.join(WAYS)}")
        r = train(way, args.vocab, args.used, args.steps, args.width, args.batch, args.lr, not args.untied)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
