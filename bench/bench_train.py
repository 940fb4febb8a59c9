"""Training throughput: cookmind's Trainer vs a peer in the same run (tokens/s, MFU, peak memory, ratio).

    python bench/bench_train.py --device cpu                 # tiny-cpu preset shape, fp32
    python bench/bench_train.py --device cuda                # GPT-2-small shape, B=12, T=1024, bf16, compiled
    python bench/bench_train.py --device cuda --shape minimind --seq 340   # the MiniMind-3 shape, B=32
    python bench/bench_train.py --device cuda --shape qwen3-0.6b --variants cuda-graph   # B=8, T=2048
    python bench/bench_train.py --device cuda --shape llama-1.3b --variants cuda-graph   # B=4, T=2048
    python bench/bench_train.py --device cpu --shape qwen3-0.6b --tiny --peak-flops 989e12  # the same code, shrunk
    python bench/bench_train.py --device cpu --shape qwen3-0.6b --tiny --variants fp8-blocks  # float8 emulated
    python bench/bench_train.py --device cuda --shape llama-1.3b --variants master-weights,master-weights-graph
    python bench/bench_train.py --device cuda --shape llama-1.3b --batch 8 --peer-fp8 --variants master-weights-fp8

Each figure is one JSON line. For gpt2-small and minimind the peer is a nanoGPT-style GPT (LayerNorm, GELU MLP
4x, learned positions, tied embeddings, F.scaled_dot_product_attention, torch.optim.AdamW fused) written below.
For the presets qwen3-0.6b and llama-1.3b (shapes read from cookmind/configs/) the peer is what a user would
otherwise pick: transformers' Qwen3ForCausalLM / LlamaForCausalLM of the same config (SDPA attention, its own
cross-entropy over full logits) in a bare loop with torch.compile and torch's fused AdamW. Both train on the same
random tokens with the same batch, precision and compile setting. With --peer-fp8 the peer runs again with its
decoder layers' linears as torchao float8 linears (tensorwise), the peer of the FP8-blocks variants.
MFU = tokens/s x FLOPs/token / peak (989e12, the H200's dense bf16), FLOPs/token = 6 N_matmul + 12 L H D T for
every model: N_matmul counts every weight used in a matmul (q/k/v/o, the MLP, the LM head even when tied to the
embedding), not the embedding gather or the norms; 12 L H D T counts the attention scores and values (H query
heads of width D, T tokens, not halved for the causal mask), as in the PaLM appendix and nanoGPT.
peak_mem_gib: torch.cuda.max_memory_allocated over that figure's run (CUDA only).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.device import cuda_missing  # noqa: E402

# -- the peer: a nanoGPT-style GPT, written here ------------------------------------------------


class RefAttention(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class RefBlock(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.attn = RefAttention(d, h)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class RefGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(RefBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.cfg = (vocab, d, layers, heads, ctx)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def flops_per_token(self, t: int) -> float:
        vocab, d, layers, heads, _ = self.cfg
        n = layers * (3 * d * d + d * d + 8 * d * d) + vocab * d
        return 6 * n + 12 * layers * heads * (d // heads) * t


def bench_reference(
    shape: dict, batch: int, seq: int, steps: int, warmup: int, device, precision: str, compile_: bool
) -> dict:
    """tokens/s of the nanoGPT-style loop: forward, backward, clip, fused AdamW."""
    torch.manual_seed(0)
    model = RefGPT(
        shape["vocab_size"], shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"], seq
    ).to(device)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    fwd = torch.compile(model) if compile_ else model
    data = torch.randint(0, shape["vocab_size"], (64, seq + 1), device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else _null()

    def step(i):
        rows = torch.arange(i * batch, (i + 1) * batch, device=device) % data.shape[0]
        x, y = data[rows, :-1], data[rows, 1:]
        with ctx:
            loss = fwd(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    dt, warm_s = _time_loop(step, steps, warmup, device)
    return {
        "tokens_per_s": steps * batch * seq / dt,
        "flops_per_token": model.flops_per_token(seq),
        "warmup_s": round(warm_s, 1),
        "params": sum(p.numel() for p in model.parameters()),
    }


def hf_peer(shape: dict) -> nn.Module:
    """transformers' model of ``shape`` (a CookMindConfig dict): Qwen3ForCausalLM with QK-norm, else
    LlamaForCausalLM, fp32 weights, SDPA attention; built through the export path's config mapping."""
    import transformers

    from cookmind.model import CookMindConfig
    from cookmind.model.hf import to_hf_config

    config = to_hf_config(CookMindConfig.from_dict(dict(shape)))
    config.use_cache = False
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def hf_flops_per_token(model: nn.Module, t: int) -> float:
    """6 N_matmul + 12 L H D T counted on the transformers model itself: every nn.Linear weight (lm_head too)."""
    c = model.config
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return float(6 * n + 12 * c.num_hidden_layers * c.num_attention_heads * head_dim * t)


def convert_hf_peer_to_float8(model: nn.Module, emulate: bool = False, fast_accum: str = "output") -> int:
    """The transformers peer's decoder-layer linears (q/k/v/o, gate/up/down) as torchao float8 training linears,
    tensorwise, the LM head left as it is: what a user of transformers would write for FP8 (torchao's
    ``convert_to_float8_training``, which accelerate's torchao FP8 backend calls too), beside our
    ``train.fp8_blocks``. fast_accum: ``output`` keeps torchao's recipe (only the forward GEMM accumulates fast),
    ``all`` makes every GEMM accumulate fast, the peer of ``train.fp8_fast_accum=all``. Returns how many linears
    converted; emulate: CPU runs (the code path only)."""
    import dataclasses

    from cookmind.model.float8_blocks import import_torchao_float8

    if fast_accum not in PEER_FP8_FAST_ACCUM:
        raise ValueError(f"fast_accum must be one of {', '.join(PEER_FP8_FAST_ACCUM)}, got {fast_accum!r}")
    float8 = import_torchao_float8()
    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name("tensorwise"), emulate=emulate)
    if fast_accum == "all":
        fast = float8.Float8GemmConfig(use_fast_accum=True)
        config = dataclasses.replace(
            config, gemm_config_output=fast, gemm_config_grad_input=fast, gemm_config_grad_weight=fast
        )
    float8.convert_to_float8_training(
        model,
        module_filter_fn=lambda m, fqn: (
            ".layers." in f".{fqn}" and m.in_features % 16 == 0 and m.out_features % 16 == 0
        ),
        config=config,
    )
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


PEER_FP8_FAST_ACCUM = ("output", "all")


def hf_step(
    shape: dict,
    batch: int,
    seq: int,
    device,
    precision: str,
    compile_: bool,
    accum: int = 1,
    fp8: bool = False,
    fp8_fast_accum: str = "output",
):
    """(step(i) -> (loss, grad norm), model): one step of transformers' model in a bare loop: forward with
    labels (its shifted cross-entropy) and backward for each of ``accum`` micro-batches, clip, torch's fused
    AdamW. fp8: its decoder layers' linears as torchao float8 linears (``convert_hf_peer_to_float8``, with
    fp8_fast_accum)."""
    torch.manual_seed(0)
    model = hf_peer(shape).to(device).train()
    if fp8:
        convert_hf_peer_to_float8(model, emulate=device.type == "cpu", fast_accum=fp8_fast_accum)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    fwd = torch.compile(model) if compile_ else model
    data = torch.randint(0, shape["vocab_size"], (64, seq), device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else _null()

    def step(i):
        for j in range(accum):
            start = (i * accum + j) * batch
            x = data[torch.arange(start, start + batch, device=device) % data.shape[0]]
            with ctx:
                loss = fwd(input_ids=x, labels=x).loss
            (loss / accum).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    return step, model


def bench_hf(
    shape: dict,
    batch: int,
    seq: int,
    steps: int,
    warmup: int,
    device,
    precision: str,
    compile_: bool,
    accum: int = 1,
    **peer,
):
    """tokens/s of transformers' model of the same config in a bare loop (``hf_step``; ``peer``: its fp8 and
    fp8_fast_accum, float8 decoder layers)."""
    step, model = hf_step(shape, batch, seq, device, precision, compile_, accum, **peer)
    dt, warm_s = _time_loop(step, steps, warmup, device)
    return {
        "tokens_per_s": steps * accum * batch * seq / dt,
        "flops_per_token": hf_flops_per_token(model, seq),
        "warmup_s": round(warm_s, 1),
        "params": sum(p.numel() for p in model.parameters()),
    }


def _time_loop(step, steps: int, warmup: int, device) -> tuple[float, float]:
    """(seconds for ``steps`` timed steps, seconds of warm-up) of a bare loop; step(i) -> (loss, grad norm)."""
    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    _sync(device)
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(steps):
        loss, norm = step(i)
        # one host sync per step: nanoGPT logs every step (log_interval=1); our loop checks finiteness
        torch.stack([loss.detach().float(), norm.float()]).tolist()
    _sync(device)
    return time.perf_counter() - t0, warm_s


def bench_raw_cookmind(
    shape: dict, batch: int, seq: int, steps: int, warmup: int, device, precision: str, compile_: bool
) -> dict:
    """CookMindLM + our AdamW + our clipping in a bare loop (no Trainer): separates model cost from loop cost."""
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.optim import AdamW, clip_grad_norm, param_groups

    torch.manual_seed(0)
    model = CookMindLM(CookMindConfig.from_dict(dict(shape))).to(device)
    opt = AdamW(param_groups(model, 0.1), lr=6e-4, betas=(0.9, 0.95), fused=device.type == "cuda")  # as the Trainer
    fwd = torch.compile(model) if compile_ else model
    data = torch.randint(0, shape["vocab_size"], (64, seq), device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else _null()

    def step(i):
        rows = torch.arange(i * batch, (i + 1) * batch, device=device) % data.shape[0]
        x = data[rows]
        with ctx:
            loss = fwd(x, labels=x).loss
        loss.backward()
        norm = clip_grad_norm(list(model.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    dt, warm_s = _time_loop(step, steps, warmup, device)
    return {
        "tokens_per_s": steps * batch * seq / dt,
        "flops_per_token": model.flops_per_token(seq),
        "warmup_s": round(warm_s, 1),
        "params": model.num_parameters(),
    }


# -- ours: the real Trainer on an in-memory dataset --------------------------------------------


class RandomTokens(torch.utils.data.Dataset):
    """Seq-dataset items over fixed random tokens (no disk, so the loop itself is measured)."""

    def __init__(self, vocab: int, seq: int, n: int = 4096):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        ids = self.data[i]
        return {"input_ids": ids, "labels": ids}


def bench_cookmind(
    shape,
    batch,
    seq,
    steps,
    warmup,
    device,
    precision,
    compile_,
    run_dir,
    optim_impl="cookmind",
    compile_mode="default",
    compile_scope="model",
    defer_metrics=True,
    cuda_graph=False,
    fp8_blocks=False,
    fp8_projections="all",
    fp8_fast_accum="output",
    fp8_scaling="tensorwise",
    master_weights=False,
    accum=1,
    parallel=None,
    callbacks=(),
    extra_steps=0,
):
    """tokens/s of cookmind's Trainer (CookMindLM, our AdamW, clipping, metrics) over the same shape, ``accum``
    micro-batches per optimizer step (train.grad_accum_steps); ``parallel`` is the config's parallel section (under
    torchrun: tokens/s of this rank); ``callbacks`` join the timer, and ``extra_steps`` run after the timed ones (for
    a profiler callback, outside the measured window).

    defer_metrics=False reads every step's loss before queuing the next (train.defer_metrics); fp8_blocks=True
    runs the blocks' projections as torchao float8 linears (train.fp8_blocks; MFU still against the bf16 peak;
    on a CPU emulated, ``emulated_float8_on_cpu``: the code path checked, the speed meaningless);
    master_weights=True keeps the parameters in bf16 with fp32 masters in AdamW (train.master_weights; it needs
    bf16, so a CPU run of it takes bf16 autocast: the code path checked, the figure beside fp32 meaningless).
    """
    from cookmind.train import Callback, TrainConfig, Trainer

    warmup = timed_warmup(warmup, cuda_graph)

    class Timer(Callback):
        def __init__(self):
            self.marks = {}

        def needs_state_at(self, trainer, step):  # its marks sync; the steps between may be deferred
            return step == warmup

        def on_step_end(self, trainer, step, metrics):
            if step in (warmup, warmup + steps):
                _sync(device)
                self.marks[step] = time.perf_counter()

    cfg = TrainConfig.from_dict(
        {
            "model": dict(shape),
            "data": {"window_size": seq},
            "train": {
                "max_steps": warmup + steps + extra_steps,
                "micro_batch_size": batch,
                "grad_accum_steps": accum,
                "precision": "bf16" if master_weights else precision,
                "compile": compile_,
                "compile_mode": compile_mode,
                "compile_scope": compile_scope,
                "device": str(device),
                "defer_metrics": defer_metrics,
                "cuda_graph": cuda_graph,
                "fp8_blocks": fp8_blocks,
                "fp8_projections": fp8_projections,
                "fp8_fast_accum": fp8_fast_accum,
                "fp8_scaling": fp8_scaling,
                "master_weights": master_weights,
                "threads": 0,
            },  # torch's default thread count, as the baselines it is compared with use
            "optim": {"lr": 6e-4, "warmup_steps": 10, "impl": optim_impl},
            "parallel": dict(parallel or {}),
            "checkpoint": {"every": 0, "overwrite": True},  # one scratch run directory for every measurement
            "logging": {"run_dir": run_dir, "progress": False, "report": False, "log_every": 1000},
        }
    )
    timer = Timer()
    t0 = time.perf_counter()
    emulated = emulated_float8_on_cpu() if fp8_blocks and device.type == "cpu" else contextlib.nullcontext()
    with emulated:
        trainer = Trainer(cfg, train_dataset=RandomTokens(shape["vocab_size"], seq), callbacks=[timer, *callbacks])
        trainer.save_checkpoint = lambda **_: None  # measure the loop, not the final checkpoint write
        trainer.fit()
    dt = timer.marks[warmup + steps] - timer.marks[warmup]
    return {
        "tokens_per_s": steps * accum * batch * seq / dt,
        "flops_per_token": trainer.flops_per_token,
        "warmup_steps": warmup,
        "warmup_s": round(timer.marks[warmup] - t0, 1),
        "params": trainer.bare_model.num_parameters(),
    }


def timed_warmup(warmup: int, cuda_graph: bool) -> int:
    """The warm-up steps before the timed ones: with ``train.cuda_graph`` at least the graph's eager steps and the
    step that captures it: the capture and the graph's instantiation are host time that a timed window must not
    hold."""
    from cookmind.train.cuda_graph import GraphedStep

    return max(warmup, GraphedStep.WARMUP + 1) if cuda_graph else warmup


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


GPT2_SMALL = dict(
    vocab_size=50304,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=12,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)


# The MiniMind-3 shape (docs/TARGETS.md): its own model + torch.compile ran at 609k tokens/s at T=340 and
# 859k at T=1024 with B=32 on one H200 (measured elsewhere: that code is not here to run in the same process).
MINIMIND = dict(
    vocab_size=6400,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
MINIMIND_PEER = {340: 609e3, 1024: 859e3}
# A model too small to compute anything: its step time on the CPU is the loop's own host work (Python,
# dispatch, optimizer and clipping bookkeeping), what a GPU waits on when the real model is small or short.
HOST_BOUND = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=8,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)

# The real-size presets of #18 (their shapes read from cookmind/configs/<name>.yaml): micro-batch and T on one H200.
PRESET_RUNS = {"qwen3-0.6b": (8, 2048), "llama-1.3b": (4, 2048)}
# --tiny: a preset's architecture (QK-norm or not, tied or not, GQA 2:1, head_dim set) shrunk to run on a CPU.
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)


def preset_run(name: str, tiny: bool, seq: int | None) -> tuple[dict, int, int]:
    """(model shape, micro-batch, T) of a preset's benchmark; ``tiny`` shrinks it to a CPU check of the code."""
    from cookmind.train.config import TrainConfig

    shape = dict(TrainConfig.load(name).model)
    batch, t = PRESET_RUNS[name]
    if tiny:
        shape.update(TINY)
        batch, t = 2, 32
    return shape, batch, seq or t


def hf_peer_name(shape: dict) -> str:
    """The JSON ``impl`` of the transformers peer for a preset ``shape``."""
    arch = "Qwen3ForCausalLM" if shape.get("qk_norm") else "LlamaForCausalLM"
    return f"transformers {arch}, fused torch AdamW"


@contextlib.contextmanager
def emulated_float8_on_cpu():
    """Within it, ``train.fp8_blocks`` trains on a CPU through torchao's emulated float8 (GEMM operands rounded to
    e4m3 / e5m2 with the same dynamic scales, the matmuls in high precision), as tests/test_fp8_blocks.py does:
    the FP8 code path of a benchmark checked without an FP8 GPU. Outside it the Trainer refuses the CPU."""
    from cookmind.model import float8_blocks

    saved = float8_blocks.fp8_blocks_problem, float8_blocks.convert_blocks_to_float8
    float8_blocks.fp8_blocks_problem = lambda device: None
    float8_blocks.convert_blocks_to_float8 = functools.partial(saved[1], emulate=True)
    try:
        yield
    finally:
        float8_blocks.fp8_blocks_problem, float8_blocks.convert_blocks_to_float8 = saved


# --variants of the Trainer figure, in the order they run: name -> (what the figure's impl adds to "cookmind Trainer",
# bench_cookmind's keywords, the model shape's overrides)
TRAINER_VARIANTS = {
    "torch-adamw": ("optim.impl=torch", {"optim_impl": "torch"}, {}),
    **{
        mode: (f"compile_mode={mode}", {"compile_mode": mode}, {})
        for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    },
    "compile-blocks": ("train.compile_scope=blocks", {"compile_scope": "blocks"}, {}),
    "cuda-graph": ("train.cuda_graph=true", {"cuda_graph": True}, {}),
    "fp8-head": ("train.cuda_graph=true, model.lm_head_fp8=true", {"cuda_graph": True}, {"lm_head_fp8": True}),
    "fp8-blocks": ("train.fp8_blocks=true", {"fp8_blocks": True}, {}),
    "fp8-all": ("train.fp8_blocks=true, model.lm_head_fp8=true", {"fp8_blocks": True}, {"lm_head_fp8": True}),
    "master-weights": ("train.master_weights=true", {"master_weights": True}, {}),
    "master-weights-graph": (
        "train.master_weights=true, train.cuda_graph=true",
        {"master_weights": True, "cuda_graph": True},
        {},
    ),
    "master-weights-fp8": (
        "train.master_weights=true, train.fp8_blocks=true",
        {"master_weights": True, "fp8_blocks": True},
        {},
    ),
    "master-weights-fp8-all": (
        "train.master_weights=true, train.fp8_blocks=true, model.lm_head_fp8=true",
        {"master_weights": True, "fp8_blocks": True},
        {"lm_head_fp8": True},
    ),
    "master-weights-fp8-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "cuda_graph": True},
        {},
    ),
    "master-weights-fp8-all-graph": (
        "train.master_weights=true, train.fp8_blocks=true, model.lm_head_fp8=true, train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "cuda_graph": True},
        {"lm_head_fp8": True},
    ),
    "master-weights-fp8auto-all-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_projections=auto, model.lm_head_fp8=true, "
        "train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "fp8_projections": "auto", "cuda_graph": True},
        {"lm_head_fp8": True},
    ),
    "master-weights-fp8auto": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_projections=auto",
        {"master_weights": True, "fp8_blocks": True, "fp8_projections": "auto"},
        {},
    ),
    "master-weights-fp8fa-graph-autotune": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_fast_accum=all, train.cuda_graph=true, "
        "train.compile_mode=max-autotune-no-cudagraphs",
        {
            "master_weights": True,
            "fp8_blocks": True,
            "fp8_fast_accum": "all",
            "cuda_graph": True,
            "compile_mode": "max-autotune-no-cudagraphs",
        },
        {},
    ),
    "master-weights-fp8fa-all-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_fast_accum=all, model.lm_head_fp8=true, "
        "train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "fp8_fast_accum": "all", "cuda_graph": True},
        {"lm_head_fp8": True},
    ),
    "master-weights-fp8fagi-all-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_fast_accum=output,grad_input, "
        "model.lm_head_fp8=true, train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "fp8_fast_accum": "output,grad_input", "cuda_graph": True},
        {"lm_head_fp8": True},
    ),
    "master-weights-fp8fagi-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_fast_accum=output,grad_input, "
        "train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "fp8_fast_accum": "output,grad_input", "cuda_graph": True},
        {},
    ),
    "master-weights-fp8fa": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_fast_accum=all",
        {"master_weights": True, "fp8_blocks": True, "fp8_fast_accum": "all"},
        {},
    ),
    "master-weights-fp8fa-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_fast_accum=all, train.cuda_graph=true",
        {"master_weights": True, "fp8_blocks": True, "fp8_fast_accum": "all", "cuda_graph": True},
        {},
    ),
    "master-weights-fp8fa-rowwise-graph": (
        "train.master_weights=true, train.fp8_blocks=true, train.fp8_scaling=rowwise, train.fp8_fast_accum=all, "
        "train.cuda_graph=true",
        {
            "master_weights": True,
            "fp8_blocks": True,
            "fp8_scaling": "rowwise",
            "fp8_fast_accum": "all",
            "cuda_graph": True,
        },
        {},
    ),
    "sync-metrics": ("train.defer_metrics=false", {"defer_metrics": False}, {}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--eager-too", action="store_true", help="also measure both without torch.compile")
    ap.add_argument("--run-dir", default="/tmp/cookmind-bench-train")
    ap.add_argument(
        "--shape",
        default=None,
        choices=["gpt2-small", "minimind", "host", *PRESET_RUNS],
        help="CUDA: gpt2-small (default; B=12, T=1024), minimind (the MiniMind-3 shape, B=32, T=--seq), "
        "qwen3-0.6b (B=8, T=2048) or llama-1.3b (B=4, T=2048), the last two against transformers' model; "
        "CPU: the tiny-cpu preset (default), host (8 layers 16 wide, B=1, T=8: the loop's host "
        "overhead per step; compare with --variants raw) or a preset with --tiny",
    )
    ap.add_argument(
        "--accum",
        type=int,
        default=1,
        help="micro-batches per optimizer step for the transformers peer and every Trainer run (preset shapes; "
        "default 1): a global batch of batch x accum rows, as a real pretraining run would use",
    )
    ap.add_argument("--tiny", action="store_true", help="with a preset --shape: its architecture shrunk (any device)")
    ap.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help="the peak FLOP/s MFU is taken against (default: the device's bf16 peak; none on a CPU)",
    )
    ap.add_argument("--seq", type=int, default=None, help="tokens per row (default 1024; presets 2048)")
    ap.add_argument(
        "--extra-backends",
        default="",
        help="also time our model with these attn_backend values "
        "(comma-separated, e.g. flash-triton), after the main figures",
    )
    ap.add_argument("--batch", type=int, default=None, help="micro-batch rows (default: the shape's)")
    ap.add_argument(
        "--no-peer",
        action="store_true",
        help="leave out the peer (to explore variants quickly; the figures to report come with the peer, as ratios)",
    )
    ap.add_argument(
        "--peer-fp8",
        action="store_true",
        help="presets: also time the transformers peer with its decoder layers' linears as torchao float8 linears "
        "(tensorwise, the LM head in bf16), the like-for-like peer of the fp8-blocks variants; needs torchao",
    )
    ap.add_argument(
        "--peer-fp8-fast-accum",
        default="output",
        help="with --peer-fp8: which float8 peers to time, comma-separated: output (torchao's recipe: the forward "
        "GEMM accumulates fast; default), all (every GEMM, the peer of the fp8fa variants)",
    )
    ap.add_argument(
        "--no-plain",
        action="store_true",
        help="leave out the plain Trainer too: only the --variants (each compiles for a minute or two on a GPU)",
    )
    ap.add_argument(
        "--variants",
        default="",
        help="comma-separated extra figures after the main ones: "
        "raw (our model + AdamW in a bare loop, no Trainer), torch-adamw (Trainer with optim.impl=torch), "
        "reduce-overhead / max-autotune / max-autotune-no-cudagraphs (Trainer with that train.compile_mode), "
        "sync-metrics (Trainer reading each step's loss before the next, train.defer_metrics=false), "
        "compile-blocks (Trainer with train.compile_scope=blocks: one compilation for every block; see warmup_s), "
        "cuda-graph (Trainer with train.cuda_graph=true: the whole step one CUDA graph), "
        "fp8-head (cuda-graph with model.lm_head_fp8=true: the LM head's GEMMs in FP8), "
        "fp8-blocks (Trainer with train.fp8_blocks=true: the blocks' projections as torchao float8 linears; "
        "needs torchao), fp8-all (fp8-blocks with model.lm_head_fp8=true too), "
        "master-weights (Trainer with train.master_weights=true: bf16 parameters, fp32 masters in AdamW), "
        "master-weights-graph (master-weights with train.cuda_graph=true), "
        "master-weights-fp8 (master-weights with train.fp8_blocks=true), master-weights-fp8-all(-graph) (and "
        "model.lm_head_fp8=true, and the graph), master-weights-fp8auto(-all-graph) (the same with "
        "train.fp8_projections=auto: projections too small for float8 to gain stay bf16), "
        "master-weights-fp8fa(-all-graph) and master-weights-fp8fagi(-all)-graph (train.fp8_fast_accum=all, or "
        "output,grad_input: the backward's float8 GEMMs accumulate fast too)",
    )
    args = ap.parse_args()
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        ap.error(why)
    device = torch.device(args.device)
    fits = {"cuda": ("gpt2-small", "minimind", *PRESET_RUNS), "cpu": ("host",)}.get(device.type, ())
    if args.tiny:
        if args.shape not in PRESET_RUNS:
            ap.error(f"--tiny shrinks a preset shape: pass --shape {' or '.join(PRESET_RUNS)}")
        fits = (*fits, *PRESET_RUNS)
    if args.shape is not None and args.shape not in fits:
        hint = " (or a preset with --tiny)" if device.type == "cpu" else ""
        ap.error(f"--shape {args.shape} does not run on {device.type}; there choose from {', '.join(fits)}{hint}")
    if args.batch is not None and args.batch < 1:
        ap.error(f"--batch must be at least 1, not {args.batch}")
    if args.accum < 1:
        ap.error(f"--accum must be at least 1, not {args.accum}")
    if args.accum > 1 and args.shape not in PRESET_RUNS:
        given = f"--shape {args.shape}" if args.shape else "the default shape (pass --shape)"
        ap.error(f"--accum applies to the preset shapes ({', '.join(PRESET_RUNS)}), not {given}")
    if args.peer_fp8 and args.shape not in PRESET_RUNS:
        ap.error(f"--peer-fp8 converts the transformers peer of the preset shapes ({', '.join(PRESET_RUNS)}); pass one")
    peer_fp8_fast_accum = [fa.strip() for fa in args.peer_fp8_fast_accum.split(",") if fa.strip()]
    bad = [fa for fa in peer_fp8_fast_accum if fa not in PEER_FP8_FAST_ACCUM]
    if bad or not peer_fp8_fast_accum:
        ap.error(f"--peer-fp8-fast-accum: {', '.join(bad) or 'nothing given'}: use {' or '.join(PEER_FP8_FAST_ACCUM)}")
    if args.peer_fp8_fast_accum != "output" and not args.peer_fp8:
        ap.error("--peer-fp8-fast-accum picks the float8 peers of --peer-fp8: pass --peer-fp8 too")
    unknown = [v for v in args.variants.split(",") if v and v != "raw" and v not in TRAINER_VARIANTS]
    if unknown:
        ap.error(f"--variants: no variant {', '.join(unknown)}; choose from raw, {', '.join(TRAINER_VARIANTS)}")
    if args.no_plain and not any(args.variants.split(",")):
        ap.error("--no-plain leaves only the --variants to run: name at least one")
    if args.accum > 1 and "raw" in args.variants.split(","):
        ap.error("--variants raw is a bare loop without accumulation: leave it out with --accum")
    if args.shape in PRESET_RUNS:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        from cookmind.train.metrics import peak_flops

        shape, batch, seq = preset_run(args.shape, args.tiny, args.seq)
        precision = "bf16" if device.type == "cuda" else "fp32"
        on_gpu = device.type == "cuda"
        steps, warmup = args.steps or (30 if on_gpu else 3), args.warmup or (10 if on_gpu else 1)
        peak = args.peak_flops or peak_flops(device) or (989e12 if on_gpu else None)
        compiled = on_gpu and not args.no_compile
        modes = [compiled] + ([False] if args.eager_too and compiled else [])
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        if args.shape == "minimind":
            shape, batch, seq, precision = MINIMIND, 32, args.seq or 1024, "bf16"
        else:
            shape, batch, seq, precision = GPT2_SMALL, 12, args.seq or 1024, "bf16"
        steps, warmup = args.steps or 30, args.warmup or 10
        from cookmind.train.metrics import peak_flops

        peak = args.peak_flops or peak_flops(device) or 989e12
        modes = [not args.no_compile] + ([False] if args.eager_too and not args.no_compile else [])
    else:
        from cookmind.train.config import TrainConfig

        tiny = TrainConfig.load("tiny-cpu")
        shape = dict(tiny.model, vocab_size=4096)
        batch, seq, precision = tiny.train.micro_batch_size, tiny.data.window_size, "fp32"
        steps, warmup = args.steps or 20, args.warmup or 3
        if args.shape == "host":
            shape, batch, seq = HOST_BOUND, 1, 8
            steps, warmup = args.steps or 300, args.warmup or 50
        peak, modes = args.peak_flops, [False]
    batch = args.batch or batch
    peer = hf_peer_name(shape) if args.shape in PRESET_RUNS else "nanogpt-style reference"
    for compiled in modes:
        results = {}
        common = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "threads": torch.get_num_threads(),
            "batch": batch,
            "accum": args.accum,
            "seq": seq,
            "precision": precision,
            "compiled": compiled,
            "torch": torch.__version__,
            "shape": f"{shape['num_hidden_layers']}L-{shape['hidden_size']}d-{shape['num_attention_heads']}h-"
            f"{shape['num_key_value_heads']}kv-v{shape['vocab_size']}",
        }
        peer_fn = bench_hf if peer != "nanogpt-style reference" else bench_reference
        runs = [] if args.no_peer else [(peer, peer_fn, shape)]
        if args.peer_fp8:
            for fa in peer_fp8_fast_accum:
                label = f"{peer} + torchao float8 layers" + (", every GEMM fast" if fa == "all" else "")
                runs.append((label, functools.partial(bench_hf, fp8=True, fp8_fast_accum=fa), shape))
        if not args.no_plain:
            runs.append(("cookmind Trainer", bench_cookmind, shape))
        if compiled == modes[0]:
            runs += [
                (f"cookmind Trainer, attn_backend={b}", bench_cookmind, dict(shape, attn_backend=b))
                for b in args.extra_backends.split(",")
                if b
            ]
            variants = [v for v in args.variants.split(",") if v]
            if "raw" in variants:
                runs.append(("cookmind model, bare loop", bench_raw_cookmind, shape))
            runs += [
                (f"cookmind Trainer, {label}", functools.partial(bench_cookmind, **kw), dict(shape, **overrides))
                for name, (label, kw, overrides) in TRAINER_VARIANTS.items()
                if name in variants
            ]
        for name, fn, shp in runs:
            base = getattr(fn, "func", fn)
            extra = (args.run_dir,) if base is bench_cookmind else ()
            if base in (bench_cookmind, bench_hf):  # the other runs refuse --accum above (not preset shapes)
                fn = functools.partial(fn, accum=args.accum)
            if device.type == "cuda":  # each figure's own peak: the previous one's memory is gone
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            try:
                results[name] = fn(shp, batch, seq, steps, warmup, device, precision, compiled, *extra)
                if device.type == "cuda":
                    results[name]["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            except Exception as exc:  # report and go on: one failure must not lose the other figures
                print(
                    json.dumps(
                        {
                            "figure": "train tokens/s",
                            "impl": name,
                            "compiled": compiled,
                            "error": f"{type(exc).__name__}: {exc}"[:500],
                        }
                    ),
                    flush=True,
                )
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if name in results:
                r = results[name]
                line = {
                    "figure": "train tokens/s",
                    "impl": name,
                    **common,
                    "tokens_per_s": round(r["tokens_per_s"]),
                    "ms_per_step": round(args.accum * batch * seq / r["tokens_per_s"] * 1e3, 3),
                    "params": r["params"],
                    "flops_per_token": r["flops_per_token"],
                    "warmup_s": r["warmup_s"],
                }
                if "warmup_steps" in r:
                    line["warmup_steps"] = r["warmup_steps"]
                if peak:
                    line["mfu"] = round(r["tokens_per_s"] * r["flops_per_token"] / peak, 4)
                    line["peak_flops"] = peak
                if "peak_mem_gib" in r:
                    line["peak_mem_gib"] = r["peak_mem_gib"]
                print(json.dumps(line), flush=True)
                fp8_peer = f"{peer} + torchao float8 layers"
                # an FP8-blocks variant is also set against each float8 peer that ran: like for like
                fp8_peers = [r for r in results if r.startswith(fp8_peer)] if "fp8_blocks=true" in name else []
                peers = [peer, *fp8_peers]
                for against in peers:
                    ref = results.get(against)
                    if ref is not None and name not in (peer, against):  # printed at once: a cut run keeps it
                        print(
                            json.dumps(
                                {
                                    "figure": "train speedup vs reference",
                                    "impl": name,
                                    "peer": against,
                                    **common,
                                    "ratio": round(r["tokens_per_s"] / ref["tokens_per_s"], 3),
                                }
                            ),
                            flush=True,
                        )
                if shape is MINIMIND and seq in MINIMIND_PEER and name != peer:
                    print(
                        json.dumps(
                            {
                                "figure": "train vs MiniMind's figure in TARGETS.md (another run)",
                                "impl": name,
                                **common,
                                "minimind_tokens_per_s": MINIMIND_PEER[seq],
                                "ratio": round(r["tokens_per_s"] / MINIMIND_PEER[seq], 3),
                            }
                        ),
                        flush=True,
                    )


if __name__ == "__main__":
    main()
