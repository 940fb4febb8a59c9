"""Where a speculative step's time goes: batch-1 greedy decoding of a repeating prompt, plain vs n-gram drafts.

A random 8-layer 512-wide model (bf16 on CUDA) and a prompt of a 16-token pattern repeated 8 times: the model's
greedy output is whatever it is, but once it repeats itself the n-gram proposer drafts it. Prints, per run, the
milliseconds per engine step and per token, the tokens per verified step, whether the outputs were identical, and
(--profile) cProfile's top functions of the last speculative run (host time: compiled calls, launches, syncs).

Host cost: --split-repeats more runs time every engine step and the device's work inside it (the forwards; with
--cuda-graphs the whole steps CUDA captures, synchronised before and after); the difference is the host's own work
(Python, tensor building, copies). The last line gives the least of those runs, per plain step and per verify
step (a step that verified drafts), host and device apart. On CPU with a tiny model (--device cpu --layers 1
--hidden 64 --cuda-graphs on) that is what the H200's host pays around its graph replays (a plain step's host work
overlaps the device there; a verify step's does not).

--methods plain,ngram,draft adds a draft model (random, --draft-layers 2 --draft-hidden 128, or the target itself
with --draft-self: every draft kept), and the last line then also gives its device time per verify step
(draft_device_ms_...: the draft's forwards and its k steps' replay, inside the verify step's device time).

    python bench/profile_speculative.py                 # CUDA
    python bench/profile_speculative.py --methods plain,ngram,draft --draft-self   # where a draft step's time goes
    python bench/profile_speculative.py --device cpu --layers 2 --hidden 128 --new-tokens 40   # a smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.device import cuda_missing  # noqa: E402
from cookmind.infer.engine import Engine, TokenEvent  # noqa: E402
from cookmind.infer.sampling import SamplingParams  # noqa: E402
from cookmind.infer.speculative import SpeculativeConfig  # noqa: E402
from cookmind.model import CookMindConfig, CookMindLM  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class ForwardClock:
    """Seconds spent in the device's work: the runner's forwards, and with CUDA graphs the whole captured steps with
    their launches (``decode``, the verifier's ``_launch``: a replay on CUDA; on CPU they run eagerly, and what CUDA
    replays as one graph, argmax and acceptance included, is not host work)."""

    def __init__(self, eng: Engine, device: str):
        self.seconds, self.device, self.depth = 0.0, device, 0
        self.on = False  # off: no syncs (they would cost a CUDA engine its overlapped steps), nothing counted
        self.draft_seconds = 0.0  # of those, the draft model's forwards and replays (method "draft")
        self.wrap(eng.runner, "compute")
        if eng.graphs is not None:  # replays (CUDA) or runs eagerly (CPU) a captured step, with its launch
            self.wrap(eng.graphs, "decode")
        if eng.spec is not None and eng.spec.verifier is not None:
            self.wrap(eng.spec.verifier, "_launch")
        proposer = eng.spec.proposer if eng.spec is not None else None
        if hasattr(proposer, "runner"):  # a draft model: its eager forwards, and its k steps' replay
            self.wrap(proposer.runner, "compute", draft=True)
            if proposer.graphs is not None:
                self.wrap(proposer.graphs, "propose", draft=True)

    def wrap(self, owner, name: str, draft: bool = False) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            self.depth += 1
            if self.depth == 1:
                sync(self.device)
                t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    sync(self.device)
                    self.seconds += time.perf_counter() - t0
                    if draft:
                        self.draft_seconds += time.perf_counter() - t0

        setattr(owner, name, timed)


def run(
    eng: Engine,
    clock: ForwardClock,
    prompt: list[int],
    new_tokens: int,
    device: str,
    profile: cProfile.Profile | None = None,
):
    """One request to the end, stepping by hand: (seconds, engine steps, output tokens, and per kind of step, plain
    or verify: [host seconds, device seconds, steps, of the device seconds the draft model's], counted while the
    clock is on)."""
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    sync(device)
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    req = eng.submit(prompt, params)
    steps, split = 0, {"plain": [0.0, 0.0, 0, 0.0], "verify": [0.0, 0.0, 0, 0.0]}
    while eng.has_work():
        verified, forward, drafting = eng.spec.steps if eng.spec is not None else 0, clock.seconds, clock.draft_seconds
        s0 = time.perf_counter()
        eng.step()
        device_s = clock.seconds - forward
        kind = "verify" if eng.spec is not None and eng.spec.steps > verified else "plain"
        if steps > 0:  # the first step prefills
            split[kind][0] += time.perf_counter() - s0 - device_s
            split[kind][1] += device_s
            split[kind][2] += 1
            split[kind][3] += clock.draft_seconds - drafting
        steps += 1
    sync(device)
    if profile is not None:
        profile.disable()
    out = [ev.token_id for ev in req.events(timeout=0) if isinstance(ev, TokenEvent)]
    return time.perf_counter() - t0, steps, out, split


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--k", type=int, default=6, help="drafts per step")
    p.add_argument("--new-tokens", type=int, default=120)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per engine (after one warm-up run)")
    p.add_argument(
        "--split-repeats", type=int, default=3, help="runs per engine with the host/device split (synchronised)"
    )
    p.add_argument(
        "--methods",
        default="plain,ngram",
        help="engines to run, comma-separated: plain, ngram, draft (a draft model: --draft-layers/--draft-hidden, "
        "random like the target so it agrees rarely, or the target itself with --draft-self: every draft kept)",
    )
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-hidden", type=int, default=128)
    p.add_argument("--draft-self", action="store_true", help="method draft: the target drafts for itself")
    p.add_argument("--profile", action="store_true", help="cProfile the last speculative run")
    p.add_argument(
        "--cuda-graphs", choices=["auto", "on", "off"], default="auto", help="on with CPU: the graph path, eagerly"
    )
    p.add_argument(
        "--decode-attention",
        choices=["auto", "kernel", "gather"],
        default="auto",
        help="gather: the verify (and plain) forwards gather keys for SDPA instead of the paged decode kernel",
    )
    args = p.parse_args()
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        p.error(why)
    device = args.device
    if device == "cpu":
        torch.set_num_threads(1)  # a tiny model's forward runs fastest, and steadiest, on one thread
    torch.manual_seed(0)
    vocab, ctx = 512, 16 * 8 + args.new_tokens + 16
    cfg = CookMindConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=ctx,
    )
    model = CookMindLM(cfg).to(device).eval()
    if device.startswith("cuda"):
        model = model.bfloat16()
    prompt = torch.randint(0, vocab, (16,)).tolist() * 8
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - {"plain", "ngram", "draft"})
    if unknown or "plain" not in methods:
        p.error(
            "--methods takes plain (always: the reference), ngram and draft; not "
            + (", ".join(unknown) or "a list without plain")
        )
    engines = {"plain": None, "ngram": SpeculativeConfig("ngram", num_tokens=args.k)}
    if "draft" in methods:
        draft = model
        if not args.draft_self:
            small = dict(cfg.to_dict(), hidden_size=args.draft_hidden, intermediate_size=args.draft_hidden * 11 // 4)
            small.update(num_hidden_layers=args.draft_layers)
            draft = CookMindLM(CookMindConfig.from_dict(small)).to(device).eval()
            draft = draft.bfloat16() if device.startswith("cuda") else draft
        engines["draft"] = SpeculativeConfig("draft", num_tokens=args.k, draft_model=draft)
    outputs, fastest = {}, {}
    for name in ["plain", *[m for m in methods if m != "plain"]]:
        spec = engines[name]
        t0 = time.perf_counter()
        graphs = {"auto": None, "on": True, "off": False}[args.cuda_graphs]
        eng = Engine(
            model,
            num_slots=1,
            max_seq_len=ctx,
            speculative=spec,
            cuda_graphs=graphs,
            overlap=True,
            decode_attention=args.decode_attention,
        )
        clock = ForwardClock(eng, device)
        built = time.perf_counter() - t0
        run(eng, clock, prompt, args.new_tokens, device)  # warm-up: compilation, first uses
        for i in range(args.repeats + args.split_repeats):
            clock.on = i >= args.repeats  # the split's syncs would distort the timed runs on CUDA
            last = i == args.repeats - 1
            prof = cProfile.Profile() if args.profile and spec is not None and last else None
            before = (eng.spec.steps, eng.spec.emitted) if spec is not None else (0, 0)
            seconds, steps, out, split = run(eng, clock, prompt, args.new_tokens, device, prof)
            outputs.setdefault(name, out)
            if clock.on:
                for kind, (host_s, device_s, count, draft_s) in split.items():
                    if count:
                        parts = [("host", host_s), ("device", device_s)] + (
                            [("draft_device", draft_s)] if draft_s else []
                        )
                        for part, value in parts:
                            key = f"{part}_ms_per_{kind}_step_{name}"
                            fastest[key] = min(fastest.get(key, float("inf")), value * 1e3 / count)
                continue
            verified = (eng.spec.steps - before[0], eng.spec.emitted - before[1]) if spec is not None else (0, 0)
            print(
                json.dumps(
                    {
                        "run": name,
                        "i": i,
                        "engine_build_s": round(built, 2),
                        "ms": round(seconds * 1e3, 2),
                        "tokens": len(out),
                        "steps": steps,
                        "ms_per_step": round(seconds * 1e3 / steps, 3),
                        "ms_per_token": round(seconds * 1e3 / len(out), 3),
                        "verified_steps": verified[0],
                        "tokens_per_verified_step": round(verified[1] / verified[0], 2) if verified[0] else None,
                        "identical": out == outputs["plain"],
                        "verify_graphs": len(eng.spec.verifier.graphs) if spec and eng.spec.verifier else None,
                    }
                ),
                flush=True,
            )
            if prof is not None:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
                print(s.getvalue()[:6000])
        del eng
    # the least of the split runs: the host's own cost with the least interference from other processes, and the
    # device's (synchronised around each captured step or forward)
    print(json.dumps({"summary": "split_min", **{k: round(v, 3) for k, v in sorted(fastest.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
