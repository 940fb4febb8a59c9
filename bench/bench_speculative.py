"""Speculative decoding benchmark: batch-1 tokens/s of the engine with and without speculation, same run.

Workloads (greedy, one request at a time, each prompt's whole answer):
  copy: the answer repeats a text given in the prompt, where n-gram (prompt-lookup) drafts pay;
  map:  the answer is a token-by-token transform of the prompt's text (nothing to copy), where they should cost
        nothing (the engine decodes plainly when no draft exists).
Peer: the same engine (CUDA graphs, compiled layers, the paged decode kernel) without speculation, on the same
model and prompts, in the same run. Every figure also says whether the outputs were identical (they must be).

A random model never copies, so without --model the bench first trains, on the device, a small target on the two
synthetic tasks ("BOS text COPY text EOS" and "BOS text MAP f(text) EOS" over token ids) and a smaller draft
model on the same data, and reports how well the target learned to copy (copy_accuracy) so a low speed-up can be
told apart from an unlearned model. --model / --draft-model take cookmind checkpoints instead (prompts then are
token ids of the same synthetic shapes: that only makes sense for a model trained on them).

    python bench/bench_speculative.py                    # CUDA: train ~1 min, then measure (<= 2 min in all)
    python bench/bench_speculative.py --tiny --device cpu  # a smoke run on CPU (the figures mean nothing)

One JSON line per figure: {"figure": "tokens_per_s", "workload", "method", "k", "value", "peer", "speedup",
"acceptance_rate", "tokens_per_step" (of the steps that verified drafts), "speculated_share",
"forced_reads_per_token" (plain steps read before the next launched, for a proposal: overlap given up),
"identical"}; and
{"figure": "engine_build_s", "method", "value"}: seconds to build each engine (compilation, CUDA graph capture).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.device import cuda_missing  # noqa: E402
from cookmind.infer.engine import Engine, TokenEvent  # noqa: E402
from cookmind.infer.sampling import SamplingParams  # noqa: E402
from cookmind.infer.speculative import SpeculativeConfig  # noqa: E402
from cookmind.model import CookMindConfig, CookMindLM, load_model  # noqa: E402

BOS, COPY, MAP, EOS = 0, 1, 2, 3
FIRST = 4  # the text's tokens are FIRST..vocab-1


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def transform(text: torch.Tensor, vocab: int) -> torch.Tensor:
    """The map task's answer: a fixed permutation of the text tokens (7 is coprime to the text vocabulary)."""
    return FIRST + ((text - FIRST) * 7 + 11) % (vocab - FIRST)


def batch_of(n: int, length: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """n training rows, half copy, half map; returns (tokens (n, 2 * length + 3), index of the first answer token)."""
    text = torch.randint(FIRST, vocab, (n, length), generator=gen)
    task = torch.full((n, 1), COPY)
    task[n // 2 :] = MAP
    answer = torch.where(task == COPY, text, transform(text, vocab))
    rows = torch.cat([torch.full((n, 1), BOS), text, task, answer, torch.full((n, 1), EOS)], dim=1)
    return rows, length + 2


def train(model: CookMindLM, args, seconds: float, name: str, device: str) -> None:
    """AdamW on the synthetic tasks (loss on the answers) for `seconds` or args.train_steps steps."""
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    model.train()
    start, step, loss = time.perf_counter(), 0, torch.tensor(0.0)
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.startswith("cuda")
        else torch.autocast("cpu", enabled=False)
    )
    while step < args.train_steps and time.perf_counter() - start < seconds:
        rows, first = batch_of(args.train_batch, args.length, args.vocab, gen)
        rows = rows.to(device)
        labels = rows.clone()
        labels[:, :first] = -100  # learn the answers, not the random texts
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 50)
        with amp:
            loss = model(rows, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
    model.eval()
    emit(
        figure="train",
        model=name,
        steps=step,
        seconds=round(time.perf_counter() - start, 1),
        loss=round(float(loss.detach()), 4),
    )


def build(args, device: str, dtype: torch.dtype) -> tuple[CookMindLM, CookMindLM | None]:
    if args.model:
        target = load_model(args.model, device=device, dtype=dtype).eval()
        draft = load_model(args.draft_model, device=device, dtype=dtype).eval() if args.draft_model else None
        args.vocab = target.config.vocab_size
        return target, draft
    ctx = 2 * args.length + 8

    def make(hidden, layers, heads, kv):
        cfg = CookMindConfig(
            vocab_size=args.vocab,
            hidden_size=hidden,
            intermediate_size=hidden * 3,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=ctx,
            tie_word_embeddings=True,
        )
        return CookMindLM(cfg).to(device)

    torch.manual_seed(0)
    target = make(*args.target_shape)
    draft = make(*args.draft_shape)
    emit(figure="models", target_params=target.num_parameters(), draft_params=draft.num_parameters(), context=ctx)
    train(target, args, args.train_seconds, "target", device)
    train(draft, args, args.train_seconds * args.draft_share, "draft", device)
    return target.to(dtype), draft.to(dtype)


def prompts(args, task: int, count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234 + task)
    text = torch.randint(FIRST, args.vocab, (count, args.length), generator=gen)
    return [[BOS, *row.tolist(), task] for row in text]


def run(engine: Engine, prompt_list: list[list[int]], new_tokens: int, device: str) -> tuple[float, list[list[int]]]:
    """Seconds for the prompts one at a time (batch 1) and their outputs."""
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, stop_token_ids=(EOS,))
    outs, total = [], 0.0
    for prompt in prompt_list:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        req = engine.submit(prompt, params)
        engine.run_until_idle()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        total += time.perf_counter() - t0
        outs.append([ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)])
    return total, outs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a target checkpoint (default: train one on the synthetic tasks)")
    p.add_argument("--draft-model", default=None, help="a draft checkpoint with the target's vocabulary")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) or float32")
    p.add_argument("--k", type=int, nargs="+", default=[6], help="drafted tokens per step to measure (several: each)")
    p.add_argument("--length", type=int, default=128, help="tokens of text in each prompt (and of each answer)")
    p.add_argument("--prompts", type=int, default=6, help="prompts per workload (after one warm-up prompt)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--train-seconds", type=float, default=45.0, help="the target's training budget")
    p.add_argument("--draft-share", type=float, default=0.4, help="the draft's budget, a share of the target's")
    p.add_argument("--train-steps", type=int, default=3000)
    p.add_argument("--train-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (CPU): tiny models, short texts")
    args = p.parse_args()
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        p.error(why)
    args.target_shape, args.draft_shape = (512, 8, 8, 4), (128, 2, 2, 1)  # hidden, layers, heads, kv heads
    if args.tiny:
        args.length, args.vocab, args.prompts, args.k = 12, 40, 2, [3]
        args.train_steps, args.train_batch, args.train_seconds = 20, 16, 8.0
        args.target_shape, args.draft_shape = (32, 2, 4, 2), (16, 1, 2, 1)
    device = args.device
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, None: None}[args.dtype]
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    target, draft = build(args, device, dtype)
    new_tokens = args.length + 1  # the answer and its EOS
    ctx = target.config.max_position_embeddings
    work = {"copy": prompts(args, COPY, args.prompts + 1), "map": prompts(args, MAP, args.prompts + 1)}

    def engine(spec):
        """The engine, and how long building it took (compiling and capturing CUDA graphs, verify ones too)."""
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        t0 = time.perf_counter()
        eng = Engine(target, num_slots=1, max_seq_len=ctx, speculative=spec)
        sync()
        name = "none" if spec is None else spec.method
        emit(figure="engine_build_s", method=name, value=round(time.perf_counter() - t0, 2))
        return eng

    plain = engine(None)
    base = {}
    for name, prompt_list in work.items():
        run(plain, prompt_list[:1], new_tokens, device)  # warm-up: compilation, graph capture
        seconds, outs = run(plain, prompt_list[1:], new_tokens, device)
        base[name] = (seconds, outs)
        n = sum(len(o) for o in outs)
        if name == "copy":  # how well the target learned to copy: answer tokens equal to the prompt's text
            right = sum(a == b for prompt, o in zip(prompt_list[1:], outs) for a, b in zip(o, prompt[1:-1]))
            emit(figure="copy_accuracy", value=round(right / (len(outs) * args.length), 4))
        emit(figure="tokens_per_s", workload=name, method="none", value=round(n / seconds, 1))
    del plain
    methods = [("ngram", None)] + ([("draft", draft)] if draft is not None else [])
    for method, draft_model in methods:
        for k in args.k:
            eng = engine(SpeculativeConfig(method, num_tokens=k, draft_model=draft_model))
            for name, prompt_list in work.items():
                run(eng, prompt_list[:1], new_tokens, device)
                spec = eng.spec
                before = (spec.drafted, spec.accepted, spec.steps, spec.emitted, spec.forced_reads)
                seconds, outs = run(eng, prompt_list[1:], new_tokens, device)
                drafted, accepted, steps, emitted, forced = (
                    now - then
                    for now, then in zip(
                        (spec.drafted, spec.accepted, spec.steps, spec.emitted, spec.forced_reads), before
                    )
                )
                n = sum(len(o) for o in outs)
                peer = sum(len(o) for o in base[name][1]) / base[name][0]
                emit(
                    figure="tokens_per_s",
                    workload=name,
                    method=method,
                    k=k,
                    batch=1,
                    value=round(n / seconds, 1),
                    peer=round(peer, 1),
                    speedup=round(n / seconds / peer, 3),
                    acceptance_rate=round(accepted / drafted, 3) if drafted else None,
                    tokens_per_step=round(emitted / steps, 2) if steps else None,
                    speculated_share=round(emitted / n, 3),  # of the tokens, those from verified steps
                    forced_reads_per_token=round(forced / n, 3),  # steps read in flight for a proposal
                    identical=outs == base[name][1],
                    device=torch.cuda.get_device_name() if device.startswith("cuda") else device,
                )
            del eng
    return 0


if __name__ == "__main__":
    sys.exit(main())
