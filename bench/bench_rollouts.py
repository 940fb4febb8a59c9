"""GRPO throughput: rollout tokens/s and optimizer-step time, one JSON line per figure.

    python bench/bench_rollouts.py --preset gpt2-small --group-size 8 --prompts 8 --new-tokens 256

The peer, measured in the same run, is Hugging Face ``generate`` on the same weights exported to
a ``LlamaForCausalLM`` (sampling, KV cache), when transformers is installed.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = {
    # GPT-2-small-sized Llama-shaped model (12 x 768, 12 heads, vocab 50304)
    "gpt2-small": dict(
        vocab_size=50304,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=1024,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),
}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    """Print rollout tokens/s (ours, and HF generate as peer) and GRPO optimizer-step seconds."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="timed calls of the serving engine (its figure is their median; each is well under a second on a GPU, "
        "so one stall would move a single call's figure by a fifth)",
    )
    args = ap.parse_args(argv)
    from cookmind.align.losses import get_response_log_probs, grpo_microbatch_train_step
    from cookmind.align.rollout import SamplingParams, generate_ids
    from cookmind.model import CookMindConfig, CookMindLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.dtype == "bf16" and device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    cfg = CookMindConfig(**PRESETS[args.preset])
    model = CookMindLM(cfg).to(device)
    n = args.prompts * args.group_size
    prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len,)).tolist() for _ in range(args.prompts)]
    rep = [p for p in prompts for _ in range(args.group_size)]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    gen_model = model.to(dtype).eval()
    generate_ids(gen_model, rep[:2], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))  # warm-up
    _sync(device)
    t = time.perf_counter()
    outs = generate_ids(gen_model, rep, params, batch_size=n, engine="builtin")
    _sync(device)
    dt = time.perf_counter() - t
    new = sum(len(o) for o in outs)
    print(
        json.dumps(
            {
                "figure": "rollout_tokens_per_s",
                "engine": "cookmind.align builtin (KV cache)",
                "preset": args.preset,
                "rollouts": n,
                "new_tokens": new,
                "seconds": round(dt, 3),
                "tokens_per_s": round(new / dt, 1),
                "device": str(device),
                "dtype": str(dtype),
            }
        ),
        flush=True,
    )
    # the serving engine (what engine="auto" uses on CUDA): built once per model, then reused every step
    t = time.perf_counter()
    generate_ids(
        gen_model, rep, params, batch_size=n, engine="serving"
    )  # builds (and on CUDA compiles and captures) the engine
    _sync(device)
    setup = time.perf_counter() - t
    times = []
    for _ in range(max(1, args.repeat)):
        gc.collect()  # a collection of the last call's garbage inside the timed call is host time, not decoding
        t = time.perf_counter()
        outs_serving = generate_ids(gen_model, rep, params, batch_size=n, engine="serving")
        _sync(device)
        times.append(time.perf_counter() - t)
    dt = statistics.median(times)
    new = sum(len(o) for o in outs_serving)
    print(
        json.dumps(
            {
                "figure": "rollout_tokens_per_s",
                "engine": "cookmind serving engine (engine='serving')",
                "preset": args.preset,
                "rollouts": n,
                "new_tokens": new,
                "seconds": round(dt, 3),
                "tokens_per_s": round(new / dt, 1),
                "first_call_s": round(setup, 2),
                "calls": len(times),
                "seconds_min_max": [round(min(times), 3), round(max(times), 3)],
                "device": str(device),
                "dtype": str(dtype),
            }
        ),
        flush=True,
    )
    from cookmind.infer.engine_generate import release_engine

    release_engine()
    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        hf = (
            LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=cfg.vocab_size,
                    hidden_size=cfg.hidden_size,
                    intermediate_size=cfg.intermediate_size,
                    num_hidden_layers=cfg.num_hidden_layers,
                    num_attention_heads=cfg.num_attention_heads,
                    num_key_value_heads=cfg.num_key_value_heads,
                    max_position_embeddings=cfg.max_position_embeddings,
                )
            )
            .to(device, dtype)
            .eval()
        )
        ids = torch.tensor(rep, device=device)
        with torch.no_grad():
            hf.generate(ids[:2], max_new_tokens=4, do_sample=True)
            _sync(device)
            t = time.perf_counter()
            out = hf.generate(
                ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=True, top_k=0
            )
            _sync(device)
        dt = time.perf_counter() - t
        new = int((out.shape[1] - ids.shape[1]) * out.shape[0])
        print(
            json.dumps(
                {
                    "figure": "rollout_tokens_per_s",
                    "engine": "transformers generate (peer)",
                    "preset": args.preset,
                    "rollouts": n,
                    "new_tokens": new,
                    "seconds": round(dt, 3),
                    "tokens_per_s": round(new / dt, 1),
                    "device": str(device),
                    "dtype": str(dtype),
                }
            ),
            flush=True,
        )
        del hf
    except ImportError:
        pass
    # one GRPO optimizer step over the rollout batch (fp32 master weights, autocast on GPU)
    model = model.float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    seqs = torch.tensor([p + o + [0] * (args.new_tokens - len(o)) for p, o in zip(rep, outs)], device=device)
    mask = torch.zeros_like(seqs, dtype=torch.bool)
    mask[:, args.prompt_len :] = True
    adv = torch.randn(n, 1, device=device)
    accum = max(1, n // args.micro_batch)
    for _ in range(2):  # the first is warm-up
        _sync(device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for i in range(0, n, args.micro_batch):
            x = seqs[i : i + args.micro_batch]
            with torch.autocast(
                device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and args.dtype == "bf16"
            ):
                lp = get_response_log_probs(model, x[:, :-1], x[:, 1:])["log_probs"]
            grpo_microbatch_train_step(
                lp,
                mask[i : i + args.micro_batch, 1:],
                accum,
                "grpo_clip",
                advantages=adv[i : i + args.micro_batch],
                old_log_probs=lp.detach(),
                cliprange=0.2,
            )
        opt.step()
        _sync(device)
        dt = time.perf_counter() - t
    print(
        json.dumps(
            {
                "figure": "grpo_optimizer_step_s",
                "preset": args.preset,
                "rollouts": n,
                "seq_len": int(seqs.shape[1]),
                "micro_batch": args.micro_batch,
                "seconds": round(dt, 3),
                "device": str(device),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
