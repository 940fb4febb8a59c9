"""Data-parallel training step time: one GPU vs PyTorch DDP vs cookmind DDP, in one run.

GPT-2-small shape (CookMindLM: 12 layers, 768 wide, 12 heads, vocab 50304, tied embeddings,
SwiGLU 2048), batch 12 x 1024 per GPU, bf16 autocast, fused AdamW. Setups compile per block
(and the loss on its own), so gradients leave each block as its backward ends; "-whole"
setups compile the whole model (torch DDP then splits the graph at its buckets itself).
Launch on 2 GPUs:

    torchrun --standalone --nproc_per_node 2 bench/bench_ddp.py [--steps 20]

Prints one JSON line per setup: ms/step, tokens/s over all GPUs and scaling efficiency
(one-GPU step time / N-GPU step time at the same per-GPU batch), then a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--no-compile", action="store_true", help="eager (CPU smoke runs)")
    p.add_argument("--setups", default="1gpu,torch,torch-bf16,ours,ours-bf16,ours-bf16-zero1,1gpu-whole,torch-whole")
    return p.parse_args(argv)


from cookmind.model.cross_entropy import cross_entropy as _CROSS_ENTROPY  # noqa: E402


def build_model(args, device, whole: bool):
    from cookmind.model import CookMindConfig, CookMindLM

    cfg = CookMindConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=args.seq,
                         tie_word_embeddings=True, attn_backend="sdpa")
    torch.manual_seed(0)
    model = CookMindLM(cfg).to(device)
    if args.no_compile:
        return model
    import cookmind.model.lm as lm_module

    if not whole:  # per-block graphs: each block's gradients are final as soon as its backward ends
        for block in model.model.layers:
            block.compile()
        # the loss over 50k logits is the largest piece left outside the blocks: compile it on its own
        lm_module.cross_entropy = torch.compile(_CROSS_ENTROPY)
    else:
        lm_module.cross_entropy = _CROSS_ENTROPY
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_setup(name, args, device, rank, world):
    from cookmind.parallel import DDP, ShardedOptimizer

    whole = name.endswith("-whole")
    single = name.startswith("1gpu")
    if single and rank != 0:
        return None
    model = build_model(args, device, whole)
    kind = name.split("-")[0]
    bf16 = "bf16" in name
    if kind == "torch":
        if whole and not args.no_compile:
            model = torch.compile(model)
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids,
                                                          bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
        if bf16:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif kind == "ours":
        model = DDP(model, bucket_size_mb=args.bucket_mb, reduce_dtype=torch.bfloat16 if bf16 else None)
    elif whole and not args.no_compile:
        model = torch.compile(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if "zero1" in name:
        opt = ShardedOptimizer(params, torch.optim.AdamW, lr=6e-4, weight_decay=0.1,
                               fused=device.type == "cuda")
    else:
        opt = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, fused=device.type == "cuda")
    g = torch.Generator(device=device).manual_seed(1234 + rank)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), device=device, generator=g)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, labels=x, return_logits=False).loss
        loss.backward()
        if isinstance(model, DDP):
            model.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(args.warmup):
        loss = step()
    sync(device)
    compile_s = time.time() - t0
    t0 = time.time()
    for _ in range(args.steps):
        loss = step()
    sync(device)
    ms = (time.time() - t0) / args.steps * 1000
    n_gpus = 1 if single else world
    same = True
    if not single:  # every rank must hold the same weights after the steps
        w = next(iter(params)).detach().float().sum().reshape(1)
        lo, hi = w.clone(), w.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        same = bool((hi - lo).abs().item() <= 1e-6 * max(1.0, hi.abs().item()))
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"ms": ms, "gpus": n_gpus, "tokens_per_s": n_gpus * args.batch * args.seq / ms * 1000,
            "loss": round(loss.item(), 4), "warmup_s": round(compile_s, 1), "weights_equal_across_ranks": same}


def main(argv=None) -> int:
    args = parse_args(argv)
    from cookmind.parallel import init_distributed

    info = init_distributed()
    torch._dynamo.config.cache_size_limit = 64
    torch.backends.cuda.matmul.allow_tf32 = True
    rank, world, device = info.rank, info.world_size, info.device
    results = {}
    for name in args.setups.split(","):
        if world > 1:
            dist.barrier()
        try:
            r = run_setup(name, args, device, rank, world)
        except Exception as exc:  # report and go on to the next setup
            r = {"error": repr(exc)[:300]}
        if world > 1:
            dist.barrier()
        if rank == 0 and r is not None:
            base = results.get("1gpu-whole" if name.endswith("-whole") else "1gpu", {}).get("ms")
            if "ms" in r and base and r["gpus"] > 1:
                r["scaling_efficiency"] = round(base / r["ms"], 3)
            r = {"bench": "ddp", "setup": name, "batch_per_gpu": args.batch, "seq": args.seq,
                 "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__, **r}
            results[name] = r
            print(json.dumps(r), flush=True)
    if rank == 0:
        print(f"\n{'setup':>18} {'gpus':>4} {'ms/step':>8} {'tok/s':>10} {'eff':>6}")
        for name, r in results.items():
            if "ms" in r:
                print(f"{name:>18} {r['gpus']:>4} {r['ms']:>8.1f} {r['tokens_per_s']:>10.0f} "
                      f"{r.get('scaling_efficiency', float('nan')):>6.2f}")
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
