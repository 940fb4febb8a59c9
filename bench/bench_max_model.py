"""The largest model DDP, ZeRO-1 and FSDP2 can train, per GPU count, at a fixed width and per-GPU batch.

    torchrun --standalone --nproc_per_node 1 bench/bench_max_model.py --methods ddp zero1 fsdp
    torchrun --standalone --nproc_per_node 2 bench/bench_max_model.py --methods ddp zero1 fsdp
    torchrun --standalone --nproc_per_node 2 bench/bench_max_model.py --cap-gib 24 --start-layers 16  # a 24 GB card
    torchrun --standalone --nproc_per_node 2 bench/bench_max_model.py --device cpu --cap-gib 0.00027 --batch 2 \\
        --seq 16 --model hidden_size=32 intermediate_size=64 vocab_size=64 num_attention_heads=4 \\
        num_key_value_heads=2 head_dim=8 tie_word_embeddings=true                      # the CPU check

For each method the same process grows the depth of one shape (``--shape``, a preset, default llama-1.3b: 2048
wide; ``--model KEY=VALUE`` overrides its fields) at a fixed micro-batch per GPU (``--batch`` x ``--seq``,
default the preset's 4 x 2048): from ``--start-layers`` (default 1) it doubles the depth until a probe does not
fit (or halves it until one does), then bisects between the deepest that fit and the shallowest that did not.
A probe is two optimizer steps through cookmind's Trainer (``parallel.ddp=torch``, ``parallel.zero1``,
``parallel.fsdp``; bf16 autocast on CUDA, our AdamW), the model built on the GPU (FSDP: on the host), on random
tokens. Prints one JSON line per method on rank 0: the largest layers and parameters, its peak GiB
per GPU, the limit, and every probe.

Out of memory means: on CUDA, a probe raised CUDA's out-of-memory error on any rank (the limit is the GPU's
memory, or ``--cap-gib`` through ``torch.cuda.set_per_process_memory_fraction``); on the CPU, the simulated cap:
the model state a rank holds (its parameters, their gradients and its optimizer state, as bytes of the local
shards; step counters aside) is above ``--cap-gib``. The CPU measure has no activations, so it only checks the
search and the sharding; ``state_gib`` is reported on CUDA too, beside ``peak_gib``
(``torch.cuda.max_memory_allocated`` over the probe, the model's construction included: DDP and ZeRO-1 build
the whole model on each GPU; under FSDP the Trainer builds it on the host and sharding moves each rank's shards,
a block at a time).

The ranks agree on every probe (an all-reduce of fit and peaks). One rank running out of memory in the middle of
a collective while another waits in it cannot be caught: the waiting rank fails after ``--timeout-s`` and
torchrun ends the job; the probes printed to stderr so far stand.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from cookmind.device import cuda_missing  # noqa: E402

METHODS = {  # the parallel section of each method's TrainConfig
    "ddp": {"ddp": "torch"},
    "zero1": {"ddp": "torch", "zero1": True},
    "fsdp": {"fsdp": True},
}
GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--shape", default="llama-1.3b", help="a preset whose model section is the shape")
    p.add_argument("--model", nargs="*", default=[], metavar="KEY=VALUE", help="model fields over the preset's")
    p.add_argument("--batch", type=int, default=None, help="micro-batch per GPU (default: the preset's)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the preset's window)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="train.compile (per-block under FSDP)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--cap-gib", type=float, default=None, help="the memory limit per GPU (required on the CPU)")
    p.add_argument("--max-layers", type=int, default=1024, help="stop growing here")
    p.add_argument("--start-layers", type=int, default=1, help="the first probe's depth (halved while it does not fit)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout of the process group")
    args = p.parse_args(argv)
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        p.error(why)
    if args.device == "cpu" and args.cap_gib is None:
        p.error("--device cpu needs --cap-gib: the CPU has no memory limit to run into")
    return args


def model_shape(args) -> tuple[dict, int, int]:
    """(model fields without the layer count, micro-batch, sequence length) from the preset and overrides."""
    from cookmind.train.config import TrainConfig

    preset = TrainConfig.load(args.shape)
    shape = dict(preset.model)
    for item in args.model:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--model {item!r}: expected KEY=VALUE")
        shape[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    seq = args.seq or preset.data.window_size
    shape["max_position_embeddings"] = max(int(shape.get("max_position_embeddings", seq)), seq)
    shape.pop("num_hidden_layers", None)
    return shape, args.batch or preset.train.micro_batch_size, seq


class RandomTokens(torch.utils.data.Dataset):
    """Seq-dataset items over fixed random tokens (nothing read from disk)."""

    def __init__(self, vocab: int, seq: int, n: int):
        self.data = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """What this rank holds of the model state: its parameters' local shards, a gradient of each trainable one,
    and its optimizer state (the ZeRO-1 wrapper's local optimizer; 0-dim step counters left out)."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    total = 0
    for p in model.parameters():
        n = local(p).numel() * p.element_size()
        total += 2 * n if p.requires_grad else n
    opt = getattr(optimizer, "local_optimizer", optimizer)
    for state in opt.state.values():
        total += sum(local(v).numel() * v.element_size() for v in state.values() if torch.is_tensor(v) and v.dim())
    return total


def is_oom(exc: BaseException) -> bool:
    """CUDA's out-of-memory error, as torch raises it or as a library (cuBLAS, NCCL) reports it."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc) or "ALLOC_FAILED" in str(exc)


def probe(method: str, layers: int, shape: dict, batch: int, seq: int, args, device) -> dict:
    """Two training steps of a ``layers``-deep model under ``method`` on every rank; whether it fit, agreed."""
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.train import TrainConfig

    world = dist.get_world_size()
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = TrainConfig.from_dict(
        {
            "model": {**shape, "num_hidden_layers": layers},
            "data": {"window_size": seq},
            "train": {
                "max_steps": 2,
                "micro_batch_size": batch,
                "precision": precision,
                "compile": args.compile,
                "activation_checkpointing": args.activation_checkpointing,
                "device": str(device),
                "threads": 1 if device.type == "cpu" else 0,  # CPU ranks share the cores
            },
            "optim": {"lr": 1e-4, "warmup_steps": 0},
            "parallel": METHODS[method],
            "checkpoint": {"every": 0, "overwrite": True},
            "eval": {"every": 0},
            "logging": {"run_dir": args.run_dir, "progress": False, "report": False, "log_every": 1000},
        }
    )
    data = RandomTokens(int(shape["vocab_size"]), seq, batch * world * 2)
    with torch.device("meta"):  # counted without memory, so a probe that fails still has its size
        params = CookMindLM(CookMindConfig.from_dict(cfg.model)).num_parameters()
    state, fit = 0, True
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        state = two_steps(cfg, data, device)
    except (torch.OutOfMemoryError, RuntimeError) as exc:  # leaving the block drops its frames and their tensors
        if not is_oom(exc):
            raise
        fit = False
    gc.collect()
    peak = 0
    if device.type == "cuda":
        torch._dynamo.reset()  # compiled graphs hold on to memory too
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.empty_cache()
    elif state > args.cap_gib * GIB:
        fit = False  # the simulated cap
    agreed = torch.tensor([0.0 if fit else 1.0, float(state), float(peak)], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return {
        "layers": layers,
        "fit": agreed[0].item() == 0,
        "params": params,
        "state_gib": round(agreed[1].item() / GIB, 6),
        "peak_gib": round(agreed[2].item() / GIB, 3) if device.type == "cuda" else None,
    }


def two_steps(cfg, data, device) -> int:
    """Build the model on ``device`` (FSDP: on the host, as the Trainer does) and train it two steps through the
    Trainer; this rank's ``state_bytes``."""
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.train import Trainer

    # DDP / ZeRO-1 build on the GPU (faster than a CPU copy of a large model); FSDP on the host, where sharding
    # moves each rank's shards to its GPU a block at a time: the whole model never sits on one GPU
    with torch.device("cpu" if cfg.parallel.fsdp else device):
        model = CookMindLM(CookMindConfig.from_dict(cfg.model))
    trainer = Trainer(cfg, model=model, train_dataset=data)
    trainer.save_checkpoint = lambda **_: None  # the steps are measured, not the final checkpoint
    trainer.fit()
    return state_bytes(trainer.bare_model, trainer.optimizer)


def largest(method: str, shape: dict, batch: int, seq: int, args, device) -> dict:
    """From ``--start-layers``, double the depth until a probe does not fit (or halve it until one does), then
    bisect; the probes and the largest that fit."""
    probes: dict[int, dict] = {}

    def run(layers: int) -> bool:
        probes[layers] = probe(method, layers, shape, batch, seq, args, device)
        if dist.get_rank() == 0:
            print(f"bench_max_model: {method} x{dist.get_world_size()} {json.dumps(probes[layers])}", file=sys.stderr)
        return probes[layers]["fit"]

    good, bad = 0, None
    layers = max(1, min(args.start_layers, args.max_layers))
    while True:  # double while it fits (halve while it does not) until one fits and one does not
        if run(layers):
            good = layers
            if bad is not None or layers == args.max_layers:
                break
            layers = min(2 * layers, args.max_layers)
        else:
            bad = layers
            if good or layers == 1:
                break
            layers //= 2
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if run(mid):
            good = mid
        else:
            bad = mid
    best = probes.get(good, {"params": 0, "state_gib": None, "peak_gib": None})
    return {
        "method": method,
        "world_size": dist.get_world_size(),
        "layers": good,
        "params": best["params"],
        "peak_gib": best["peak_gib"],
        "state_gib": best["state_gib"],
        "first_too_large": bad,  # None: --max-layers fit
        "limit_gib": round(args.limit_gib, 6),
        "limit": args.limit_kind,
        "shape": {k: shape[k] for k in ("hidden_size", "intermediate_size", "vocab_size") if k in shape},
        "batch_per_gpu": batch,
        "seq": seq,
        "compile": args.compile,
        "activation_checkpointing": args.activation_checkpointing,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "probes": [probes[k] for k in sorted(probes)],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    from cookmind.parallel import init_distributed

    if not dist.is_initialized():  # a group of one without torchrun; our timeout, not the Trainer's 30 minutes
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device(args.device if args.device == "cpu" else f"cuda:{local}")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        extra = {"store": dist.HashStore()} if world == 1 else {}
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=int(os.environ.get("RANK", "0")),
            world_size=world,
            timeout=datetime.timedelta(seconds=args.timeout_s),
            **extra,
        )
    info = init_distributed(args.device)
    device = info.device
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if args.cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GIB / total), device)
        args.limit_gib = min(args.cap_gib, total / GIB) if args.cap_gib else total / GIB
        args.limit_kind = "cuda memory fraction (--cap-gib)" if args.cap_gib else "the GPU's memory"
    else:
        args.limit_gib, args.limit_kind = args.cap_gib, "simulated: model state per rank (--cap-gib)"
    shape, batch, seq = model_shape(args)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_max_model_") as tmp:
            # one run directory for every rank (ranks that name different ones are refused): rank 0's
            shared = [str(Path(tmp) / "run")]
            dist.broadcast_object_list(shared, src=0)
            args.run_dir = shared[0]
            for method in args.methods:
                row = largest(method, shape, batch, seq, args, device)
                if info.rank == 0:
                    print(json.dumps(row), flush=True)
            dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from cookmind.parallel.process_group import end_process

    end_process(main())  # a torchrun worker ends without Python's finalization (see end_process)
