"""FP8 blocks against bf16 on real tokens: does ``train.fp8_blocks=true`` train as well? (#18 item 5)

The same model, from the same seed, on the same real tokens in the same order, trained twice through our Trainer
with a preset's recipe (compiled, fused AdamW, the fused linear-CE loss; B and T as in bench_train.py, no
accumulation): first bf16 autocast, then bf16 with the blocks' projections as torchao float8 linears. One JSON
line per run (final loss = the mean training loss of the last 20 steps, tokens/s after the warm-up steps, peak
GiB) and one comparing them: the relative difference of the final losses, passed when within 1%.

Build the data once, on a CPU, into build/fp8-loss/ (ignored by git; about 20 MB: text 12.6, store 6.9, tokenizer
0.5): real English from ../shared/data (the TinyStories sample, text/corpus.en, GSM8K problems with their
worked answers, MMLU questions with their choices and answer), an 8192-token BPE trained on it (fits every shape's
vocabulary), a seq store of 3.42M tokens (1667 windows of 2048: qwen3-0.6b's 200 x 8 fit without a repeat).

    python bench/bench_fp8_loss.py --build     # the three steps below; --shared DIR or COOKMIND_SHARED_DATA
    # 1. writes build/fp8-loss/text.txt: those documents, <|endoftext|> between them
    # 2. python -m cookmind tokenizer train --input build/fp8-loss/text.txt --vocab-size 8192 \\
    #        --out build/fp8-loss/tok --workers 1
    # 3. python -m cookmind pack --tokenizer build/fp8-loss/tok --train-type seq \\
    #        --input build/fp8-loss/text.txt --out build/fp8-loss/store --quiet

Then, on an FP8 GPU (Hopper, Ada) with build/fp8-loss/ carried along:

    python bench/bench_fp8_loss.py --shape qwen3-0.6b         # B=8, T=2048, 200 steps each, lr 3e-4
    python bench/bench_fp8_loss.py --shape llama-1.3b         # B=4, T=2048, 200 steps each, lr 2e-4
    python bench/bench_fp8_loss.py --shape tiny --device cpu --steps 20   # CPU smoke test: float8 emulated
    ... --baseline-twice      # a third run, the baseline again: its run-to-run noise beside the 1%
    ... --fp8-head            # the FP8 run's LM head in FP8 too (model.lm_head_fp8): at qwen3-0.6b +2.9%, a fail
    ... --runs baseline > a.log; ... --runs fp8 > b.log   # one run a call (a compiled pair can outlast one)
    python bench/bench_fp8_loss.py --compare a.log b.log  # then the verdict from their lines, no training: every
    #     run line of each kind pooled (means, spreads), one verdict per fp8 recipe (e.g. per --fp8-fast-accum)

After each run the trained weights are also scored on up to 64 windows of the store the run never drew
(``heldout_loss``), by a plain model holding them: an FP8 run's training loss is its FP8 forward's, whose rounding can
raise it by itself. On CUDA an FP8 run's held-out windows are scored as it trained too (``heldout_loss_as_trained``),
which says how much of a gap that rounding makes. The verdict compares both ways (``heldout_rel_diff``).

Schedule: the preset's lr and cosine decay to its min_lr_ratio over --steps, after --warmup-steps (20, at most a
tenth of the steps) of linear warm-up: the preset's 2000 would end 200 steps below a tenth of the lr.
train.cuda_graph is off in both runs. On a CPU the float8 GEMMs run through torchao's emulation (operands rounded
to e4m3/e5m2 with the same scales, matmuls in fp32), the baseline is fp32 and the tiny shape's lr is 3e-3: the
code path is checked, the figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_train import PRESET_RUNS, emulated_float8_on_cpu, preset_run  # noqa: E402 (run as a script too)
from cookmind.device import cuda_missing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "build" / "fp8-loss"
DEFAULT_SHARED = Path(os.environ.get("COOKMIND_SHARED_DATA", REPO.parent / "shared" / "data"))  # as the tests
VOCAB = 8192  # more tokens from the same text than a larger vocabulary, and below every shape's
TOLERANCE = 0.01  # #18: loss over 200 steps within 1% of bf16
LAST = 20  # the final loss is the mean of the last LAST steps
HELDOUT = 64  # windows of the store the run never drew, scored after it (qwen3-0.6b: 1667 less 200 x 8, 67; the
# Trainer fetched a batch ahead past the last step until session 30, which left 59: the figures before name 59)
TINY_LR = 3e-3  # the tiny shape's: its loss moves within a smoke test's 20 steps


# -- the data: real text -> tokenizer -> token store, through cookmind's own commands --------------------


def shared_documents(shared: Path) -> list[str]:
    """The real English documents of ``shared`` (the shared data folder), in a fixed order.

    The TinyStories sample (five stories), text/corpus.en (one document), GSM8K train and test (question and
    worked answer), MMLU dev/val/test (question, the four choices, the answer letter).
    """
    docs = [d.strip() for d in (shared / "text" / "tinystories_sample.txt").read_text().split("<|endoftext|>")]
    docs.append((shared / "text" / "corpus.en").read_text().strip())
    for split in ("train", "test"):
        for line in (shared / "gsm8k" / f"{split}.jsonl").read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                docs.append(f"Question: {row['question']}\nAnswer: {row['answer']}")
    for path in sorted((shared / "mmlu").glob("*/*.csv")):
        with open(path, newline="") as f:
            for row in csv.reader(f):
                question, *choices, answer = row
                lettered = "\n".join(f"{letter}. {c}" for letter, c in zip("ABCD", choices))
                docs.append(f"{question}\n{lettered}\nAnswer: {answer}")
    return [d for d in docs if d]


def build_commands(data: Path, overwrite: bool) -> list[list[str]]:
    """The two cookmind commands that turn ``data``/text.txt into ``data``/tok and ``data``/store."""
    py = [sys.executable, "-m", "cookmind"]
    again = ["--overwrite"] if overwrite else []
    text, tok, store = data / "text.txt", data / "tok", data / "store"
    return [
        [*py, "tokenizer", "train", "--input", str(text), "--vocab-size", str(VOCAB), "--out", str(tok)]
        + ["--workers", "1", *again],
        [*py, "pack", "--tokenizer", str(tok), "--train-type", "seq", "--input", str(text), "--out", str(store)]
        + ["--quiet", *again],
    ]


def build(data: Path, shared: Path, overwrite: bool) -> None:
    """Write ``data``/text.txt from ``shared``, then train the tokenizer and pack the store with cookmind."""
    from cookmind.atomic import writing

    if not (shared / "gsm8k").is_dir():
        raise SystemExit(
            f"bench_fp8_loss: no shared data at {shared}; pass --shared DIR or set COOKMIND_SHARED_DATA "
            "(the folder with gsm8k/, mmlu/, text/)"
        )
    text = data / "text.txt"
    if text.exists() and not overwrite:
        raise SystemExit(f"bench_fp8_loss: {text} exists (built before?); pass --overwrite to build it again")
    data.mkdir(parents=True, exist_ok=True)
    docs = shared_documents(shared)
    with writing(text) as f:
        f.write("<|endoftext|>".join(docs))
    print(f"bench_fp8_loss: wrote {len(docs)} documents ({text.stat().st_size / 1e6:.1f} MB) to {text}", flush=True)
    for cmd in build_commands(data, overwrite):
        print("+ " + " ".join(cmd), flush=True)
        done = subprocess.run(cmd, cwd=REPO, env=_env())
        if done.returncode:
            what = " ".join(a for a in cmd[3:5] if not a.startswith("-"))  # tokenizer train, pack
            raise SystemExit(f"bench_fp8_loss: `cookmind {what}` failed (exit {done.returncode}); its message is above")


def _env() -> dict:
    """This process's environment with the repository first on PYTHONPATH, so the commands run this copy."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def store_meta(data: Path) -> dict:
    """The built store's meta.json, or a one-line exit saying how to build it."""
    meta = data / "store" / "meta.json"
    if not meta.is_file() or not (data / "tok").is_dir():
        raise SystemExit(
            f"bench_fp8_loss: no token store at {data / 'store'} (or no tokenizer at {data / 'tok'}); "
            f"build it first: python bench/bench_fp8_loss.py --build --data {data}"
        )
    return json.loads(meta.read_text())


# -- the two runs ------------------------------------------------------------------------------------------


def run_config(shape_name: str, vocab: int, steps: int, warmup_steps: int, device: torch.device, args):
    """(TrainConfig, micro-batch, T) of one run: the preset's recipe, ``steps`` steps of one micro-batch each."""
    from cookmind.train import TrainConfig

    preset = "qwen3-0.6b" if shape_name == "tiny" else shape_name
    shape, batch, seq = preset_run(preset, shape_name == "tiny", args.seq)
    if shape_name == "tiny":
        shape["vocab_size"] = vocab  # shrunk: the tokenizer's vocabulary, so every id has a row
        shape["max_position_embeddings"] = max(shape["max_position_embeddings"], seq)
    cfg = TrainConfig.load(preset)
    on_gpu = device.type == "cuda"
    cfg.update(
        {
            "model": shape,
            "data": {
                "train_path": str(args.data / "store"),
                "tokenizer": str(args.data / "tok"),
                "window_size": seq,
                "num_workers": cfg.data.num_workers if on_gpu else 0,
            },
            "optim": {
                "warmup_steps": warmup_steps,
                "lr": args.lr or (TINY_LR if shape_name == "tiny" else cfg.optim.lr),
            },
            "train": {
                "max_steps": steps,
                "micro_batch_size": batch,
                "grad_accum_steps": 1,
                "precision": args.precision or ("bf16" if on_gpu else "fp32"),
                "device": str(device),
                "compile": on_gpu and not args.no_compile,
                "compile_scope": args.compile_scope,
                "cuda_graph": "false",
                "master_weights": "false",  # the presets' auto would turn them on: both runs keep fp32 weights
                "fp8_scaling": args.fp8_scaling,
                "fp8_fast_accum": args.fp8_fast_accum,
                "threads": 0,
            },
            "checkpoint": {"every": 0},
            "eval": {"every": 0, "prompts": []},
            "logging": {"progress": False, "report": False, "log_every": 1000},
        },
        "bench_fp8_loss",
    )
    return cfg, batch, seq


# the FP8 head's loss-gradient format: (dtype name, fixed scale); e4m3 x256 is linear_ce_fp8's own
HEAD_GRAD_FORMATS = {"e4m3": ("float8_e4m3fn", 256.0), "e5m2": ("float8_e5m2", 32768.0)}


def set_head_grad_format(name: str) -> tuple:
    """Set the FP8 head's G format in this process (linear_ce_fp8's module constants, read at each call, as
    bench/probe_fp8_grad_format.py does); returns the previous (dtype, scale)."""
    import cookmind.kernels.linear_ce_fp8 as F8

    before = (F8.GRAD_DTYPE, F8.GRAD_SCALE)
    dtype, scale = HEAD_GRAD_FORMATS[name]
    F8.GRAD_DTYPE, F8.GRAD_SCALE = getattr(torch, dtype), scale
    return before


def heldout_windows(trainer, limit: int = HELDOUT) -> list[int]:
    """The store's windows the run never trained on: the rest of its sampler's first epoch order, at most ``limit``
    ([] when the run began a second epoch)."""
    sampler = trainer.train_loader.sampler
    if sampler.epoch != 0:
        return []
    return sampler.permutation(0)[sampler.consumed :][:limit].tolist()


def trained_weights_in(trainer, fp8_cfg=None, head: bool = False):
    """A fresh model holding the run's trained weights (loaded strictly by name): plain (every GEMM in the
    evaluation's precision, the LM head too) or, with ``fp8_cfg`` (the run's config), run as the run trained
    it: its float8 blocks (torchao) and, with ``head``, the FP8 LM head."""
    from cookmind.model import CookMindLM
    from cookmind.model.float8_blocks import apply_fp8_blocks, fast_accum_gemms
    from cookmind.parallel.fsdp import plain_name

    bare = trainer.bare_model
    config = copy.deepcopy(bare.config)
    config.lm_head_fp8 = head
    state = {plain_name(name): value for name, value in bare.state_dict().items()}  # compiled blocks: plain names
    model = CookMindLM(config).to(next(bare.parameters()).device)
    model.load_state_dict(state, strict=True)  # every name, a tied head's too (the embedding under two names)
    if fp8_cfg is not None:
        model.lm_head_fast_accum = tuple(sorted(fast_accum_gemms(fp8_cfg.train.fp8_fast_accum)))
        apply_fp8_blocks(model, fp8_cfg, next(model.parameters()).device)
    return model.eval()


@torch.no_grad()
def heldout_loss(model, dataset, indices: list[int], batch: int, device: torch.device, precision: str) -> float:
    """The mean next-token loss of ``model`` over the windows ``indices`` of ``dataset`` (every window the same
    length: the mean of the windows' means), in the run's precision (bf16 autocast on CUDA)."""
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    total = 0.0
    for start in range(0, len(indices), batch):
        items = [dataset[i] for i in indices[start : start + batch]]
        ids = torch.stack([x["input_ids"] for x in items]).to(device)
        pos = torch.stack([x["position_ids"] for x in items]).to(device)
        with ctx:
            out = model(ids, labels=ids, position_ids=pos, return_logits=False)
        total += out.loss.float().item() * len(items)
    return total / len(indices)


def train_once(cfg, fp8: bool, device: torch.device, warm: int, head: bool = False) -> dict:
    """Train ``cfg`` (with ``train.fp8_blocks=fp8``, and ``model.lm_head_fp8=head``) in a scratch run directory:
    per-step losses and timing."""
    from cookmind.train import Callback, Trainer

    class Record(Callback):
        def __init__(self):
            self.losses, self.marks = [], {}

        def needs_state_at(self, trainer, step):  # its marks sync; the steps between may be deferred
            return step == warm

        def on_step_end(self, trainer, step, metrics):
            self.losses.append(metrics["loss"])
            if step in (warm, cfg.train.max_steps):
                _sync(device)
                self.marks[step] = time.perf_counter()

    cfg = copy.deepcopy(cfg)  # the Trainer may fill in fields: each run starts from the same config
    cfg.train.fp8_blocks = fp8
    cfg.model["lm_head_fp8"] = head
    record = Record()
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    emulated = emulated_float8_on_cpu() if fp8 and device.type == "cpu" else contextlib.nullcontext()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cookmind-fp8-loss-") as run_dir, emulated:
        cfg.logging.run_dir = run_dir
        trainer = Trainer(cfg, callbacks=[record])
        trainer.save_checkpoint = lambda **_: None  # the losses are the result, not the weights
        summary = trainer.fit()
        windows = len(trainer.train_loader.loader.dataset)
        float8 = sum(type(m).__name__ == "Float8Linear" for m in trainer.bare_model.modules())
        head_fp8 = bool(trainer.bare_model.config.lm_head_fp8)  # what the model ran, not what was asked
        # the trained weights' own quality: the windows the run never drew, scored by a plain model holding them
        # (the training loss of an FP8 run is its FP8 forward's, whose rounding may raise it by itself); on CUDA
        # also as the run trained (float8 blocks, FP8 head), which says how much of a gap that rounding makes
        held = heldout_windows(trainer)
        scores = {}
        if held:
            dataset = trainer.train_loader.loader.dataset
            args = (dataset, held, cfg.train.micro_batch_size, device, cfg.train.precision)
            scores["heldout_loss"] = heldout_loss(trained_weights_in(trainer), *args)
            if fp8 and device.type == "cuda":
                as_trained = trained_weights_in(trainer, fp8_cfg=cfg, head=head_fp8)
                scores["heldout_loss_as_trained"] = heldout_loss(as_trained, *args)
                del as_trained
        del trainer
    out = {
        "losses": record.losses,
        "wall_s": round(time.perf_counter() - t0, 1),
        "skipped_steps": summary["skipped_steps"],
        "windows": windows,
        "float8_linears": float8,
        "lm_head_fp8": head_fp8,
        "heldout_windows": len(held),
        **{k: round(v, 4) for k, v in scores.items()},
    }
    if warm in record.marks and cfg.train.max_steps in record.marks:
        timed = cfg.train.max_steps - warm
        dt = record.marks[cfg.train.max_steps] - record.marks[warm]
        out["tokens_per_s"] = round(timed * cfg.train.micro_batch_size * cfg.data.window_size / dt)
    if device.type == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        torch._dynamo.reset()  # the second run compiles its own graphs, not on top of the first one's
        gc.collect()
        torch.cuda.empty_cache()
    return out


def final_loss(losses: list[float], last: int = LAST) -> float:
    """The mean training loss of the last ``last`` steps (all of them when fewer)."""
    tail = losses[-last:]
    return sum(tail) / len(tail)


def compare(baseline: float, fp8: float, tolerance: float = TOLERANCE) -> dict:
    """The check of #18: the fp8 run's final loss relative to the baseline's (bf16), passed within ``tolerance``."""
    rel = (fp8 - baseline) / baseline
    return {"rel_diff": round(rel, 5), "tolerance": tolerance, "pass": abs(rel) <= tolerance}


RUN_KEYS = ("shape", "device", "torch", "batch", "seq", "steps", "lr", "compiled", "compile_scope", "store_tokens")


def make_verdict(common: dict, ref: dict, f8: dict, ref_final: float, f8_final: float, curves: tuple) -> dict:
    """The comparison line of a baseline run and an fp8 run (their JSON lines; finals and curves as computed)."""
    verdict = {
        "figure": "fp8 blocks loss vs baseline",
        **common,
        "last_steps": min(LAST, common["steps"]),
        "baseline": ref["run"],
        "baseline_loss": ref["final_loss"],
        "fp8_loss": f8["final_loss"],
        **compare(ref_final, f8_final),
        # the widest gap along the way (a tenth of the run at a time), not only at the end
        "curve_max_rel_diff": round(max(abs(f / b - 1) for b, f in zip(*curves)), 5),
    }
    if "heldout_loss" in ref and "heldout_loss" in f8:  # the trained weights, scored alike on unseen windows
        held = compare(ref["heldout_loss"], f8["heldout_loss"])
        verdict |= {
            "heldout_baseline_loss": ref["heldout_loss"],
            "heldout_fp8_loss": f8["heldout_loss"],
            "heldout_rel_diff": held["rel_diff"],
            "heldout_pass": held["pass"],
        }
        if "heldout_loss_as_trained" in f8:  # the same weights run in FP8 as trained: the rounding's own share
            verdict["heldout_fp8_loss_as_trained"] = f8["heldout_loss_as_trained"]
    if "tokens_per_s" in ref and "tokens_per_s" in f8:
        verdict["speedup"] = round(f8["tokens_per_s"] / ref["tokens_per_s"], 3)
    return verdict


def verdict_from_logs(paths: list[Path]) -> list[dict]:
    """The verdicts from the run lines of earlier logs (``--runs baseline`` and ``--runs fp8``, e.g. in several device
    calls): every baseline line (a ``--baseline-twice`` repeat too) against the fp8 lines of each precision (one
    verdict per fp8 recipe, e.g. per fast accumulation), each side's mean final loss and mean curve, and each
    side's spread ((max - min) / mean; 0 for one run), the noise the 1% sits in. All lines must share every
    setting in ``RUN_KEYS``. The losses come as the lines print them (4 decimals), so the relative difference is
    good to about 1e-5."""
    runs: dict[str, list[dict]] = {"baseline": [], "fp8": []}
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"--compare: {path} does not exist; give the logs of the runs to compare")
        for n, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not text.startswith("{"):
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{n}: not a JSON line ({exc.msg}); give this script's own output") from None
            if line.get("figure") != "fp8 loss run" or "error" in line:
                continue
            runs["fp8" if line["run"] == "fp8-blocks" else "baseline"].append(line)
    missing = [k for k in ("baseline", "fp8") if not runs[k]]
    if missing:
        raise SystemExit(
            f"--compare: no {' and no '.join(missing)} run line in {', '.join(map(str, paths))}; "
            "run --runs baseline and --runs fp8 first and give both logs"
        )
    first = runs["baseline"][0]
    for line in runs["baseline"][1:] + runs["fp8"]:
        differ = [k for k in RUN_KEYS if first.get(k) != line.get(k)]
        if differ:
            pairs = ", ".join(f"{k} {first.get(k)!r} vs {line.get(k)!r}" for k in differ)
            raise SystemExit(f"--compare: the runs differ in {pairs}; compare runs of the same settings")
    precisions = list(dict.fromkeys(line["precision"] for line in runs["fp8"]))  # in the order the logs give them

    def mean_of(lines: list[dict]) -> dict:
        finals = [line["final_loss"] for line in lines]
        mean = sum(finals) / len(finals)
        curve = [sum(c) / len(c) for c in zip(*(line["loss_curve"] for line in lines))]
        merged = dict(lines[-1], final_loss=round(mean, 4), loss_curve=curve)
        if len(lines) > 1:
            merged["run"] = f"{lines[0]['run']} (mean of {len(lines)})"
        speeds = [line["tokens_per_s"] for line in lines if "tokens_per_s" in line]
        if speeds:
            merged["tokens_per_s"] = sum(speeds) / len(speeds)
        for key in ("heldout_loss", "heldout_loss_as_trained"):  # over the runs that scored them (older logs did not)
            values = [line[key] for line in lines if key in line]
            merged.pop(key, None)
            if values:
                merged[key] = round(sum(values) / len(values), 4)
        spread = {"spread": round((max(finals) - min(finals)) / mean, 5), "runs": len(lines)}
        if len(finals) > 1:  # the sample standard deviation of the final losses, for the difference's error
            spread["stdev"] = (sum((f - mean) ** 2 for f in finals) / (len(finals) - 1)) ** 0.5
        return merged | spread

    ref, common, verdicts = mean_of(runs["baseline"]), {k: first.get(k) for k in RUN_KEYS}, []
    for precision in precisions:
        f8 = mean_of([line for line in runs["fp8"] if line["precision"] == precision])
        verdict = make_verdict(
            common, ref, f8, ref["final_loss"], f8["final_loss"], (ref["loss_curve"], f8["loss_curve"])
        )
        verdict["fp8_precision"] = precision
        for side, merged in (("baseline", ref), ("fp8", f8)):
            verdict[f"{side}_runs"], verdict[f"{side}_spread"] = merged["runs"], merged["spread"]
        if "stdev" in ref and "stdev" in f8:  # the standard error of the means' difference, relative: the noise
            # the difference sits in (runs of one recipe differ by more than the 1%)
            se = (ref["stdev"] ** 2 / ref["runs"] + f8["stdev"] ** 2 / f8["runs"]) ** 0.5
            verdict["rel_diff_stderr"] = round(se / ref["final_loss"], 5)
        verdicts.append(verdict)
    return verdicts


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="store_true", help="build the tokenizer and token store into --data, then stop")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"built data folder (default {DEFAULT_DATA})")
    ap.add_argument(
        "--shared",
        type=Path,
        default=DEFAULT_SHARED,
        help=f"--build: the shared data folder (default {DEFAULT_SHARED})",
    )
    ap.add_argument("--overwrite", action="store_true", help="--build: replace what an earlier --build made")
    ap.add_argument("--shape", default="tiny", choices=[*PRESET_RUNS, "tiny"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup-steps", type=int, default=20, help="lr warm-up steps (default 20; at most steps/10)")
    ap.add_argument("--lr", type=float, default=None, help=f"peak lr (default: the preset's; tiny {TINY_LR})")
    ap.add_argument("--seq", type=int, default=None, help="tokens per row (default: the shape's, 2048 / tiny 32)")
    ap.add_argument("--precision", default=None, choices=["bf16", "fp32"], help="default bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--fp8-scaling", default="tensorwise", choices=["tensorwise", "rowwise"])
    ap.add_argument(
        "--fp8-fast-accum",
        default="output",
        help="train.fp8_fast_accum of the FP8 run: which float8 GEMMs accumulate fast (default output, torchao's; "
        "all; none; or a list of output, grad_input, grad_weight)",
    )
    ap.add_argument(
        "--fp8-head",
        action="store_true",
        help="the FP8 run's LM head in FP8 as well (model.lm_head_fp8=true, as the FP8 throughput figures run it); "
        "--fp8-fast-accum then covers the head's GEMMs too",
    )
    ap.add_argument(
        "--fp8-head-grad",
        choices=sorted(HEAD_GRAD_FORMATS),
        default=None,
        help="with --fp8-head: the format of the head's loss gradient G (default the head's own, e4m3 x256); e5m2 "
        "x2^15 keeps the small entries e4m3 rounds to zero (bench/probe_fp8_head_tail.py)",
    )
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument(
        "--compile-scope",
        choices=["model", "blocks"],
        default="model",
        help="train.compile_scope of both runs (blocks: one compilation shared by every block, for a shorter start-up)",
    )
    ap.add_argument(
        "--baseline-twice",
        action="store_true",
        help="run the baseline a second time: its own run-to-run difference (bf16 on CUDA is not bit-reproducible "
        "under compile), the noise floor of the check",
    )
    ap.add_argument(
        "--runs",
        default="baseline,fp8",
        help="which runs to train, comma-separated: baseline, fp8 (default both, then the verdict); one alone prints "
        "its line only, for --compare to join with the other's",
    )
    ap.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        metavar="LOG",
        help="no training: print the verdict from the run lines in these logs (a --runs baseline and a --runs fp8)",
    )
    args = ap.parse_args(argv)
    if why := cuda_missing(args.device):  # one line, not torch's traceback from deep inside
        ap.error(why)
    if args.compare:
        for verdict in verdict_from_logs(args.compare):
            print(json.dumps(verdict), flush=True)
        return 0
    wanted = [r for r in args.runs.split(",") if r]
    if not wanted or set(wanted) - {"baseline", "fp8"}:
        ap.error(f"--runs {args.runs!r}: give baseline, fp8 or both (comma-separated)")
    if args.baseline_twice and "baseline" not in wanted:
        ap.error("--baseline-twice repeats the baseline: keep baseline in --runs")
    if args.build:
        build(args.data, args.shared, args.overwrite)
        return 0
    device = torch.device(args.device)
    if device.type != "cuda" and args.shape != "tiny":
        ap.error(f"--shape {args.shape} on {device.type} would take days; there use --shape tiny")
    if args.fp8_head_grad and not args.fp8_head:
        ap.error("--fp8-head-grad sets the FP8 head's gradient format: give --fp8-head too")
    if args.fp8_head and device.type != "cuda":
        ap.error(f"--fp8-head: the FP8 LM head runs only on a CUDA GPU with FP8 tensor cores, not on {device.type}")
    if args.steps < 2:
        ap.error("--steps must be at least 2")
    if args.fp8_head_grad:  # once every refusal above has had its say: a refused call leaves the kernel module as is
        set_head_grad_format(args.fp8_head_grad)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    meta = store_meta(args.data)
    warm = min(10, args.steps // 4) or 1
    warmup_steps = min(args.warmup_steps, args.steps // 10)
    cfg, batch, seq = run_config(args.shape, meta["vocab_size"], args.steps, warmup_steps, device, args)
    common = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": batch,
        "seq": seq,
        "steps": args.steps,
        "lr": cfg.optim.lr,
        "compiled": cfg.train.compile,
        "compile_scope": cfg.train.compile_scope,
        "store_tokens": meta["num_tokens"],
    }
    results, finals, curves = {}, {}, {}
    base = cfg.train.precision  # bf16 on CUDA: the baseline of #18
    runs = [(base, False)] if "baseline" in wanted else []
    runs += [("fp8-blocks", True)] if "fp8" in wanted else []
    runs += [(f"{base} again", False)] if args.baseline_twice else []
    for name, fp8 in runs:
        try:
            r = train_once(cfg, fp8, device, warm, head=fp8 and args.fp8_head)
        except Exception as exc:  # reported as a line; the comparison needs both
            print(json.dumps({"figure": "fp8 loss run", "run": name, **common, "error": f"{exc}"[:500]}), flush=True)
            return 2
        fast = "" if args.fp8_fast_accum == "output" else f", fast accumulation: {args.fp8_fast_accum}"
        precision = cfg.train.precision + (f" + float8 blocks ({args.fp8_scaling}{fast})" if fp8 else "")
        if fp8 and args.fp8_head:
            precision += " + FP8 LM head" + (f" (G {args.fp8_head_grad})" if args.fp8_head_grad else "")
        if fp8 and device.type == "cpu":
            precision += ", emulated"
        line = {"figure": "fp8 loss run", "run": name, "precision": precision, **common}
        finals[name] = final_loss(r["losses"])
        line["final_loss"] = round(finals[name], 4)
        # the curve: mean loss of each tenth of the run
        chunk = max(1, args.steps // 10)
        curves[name] = [final_loss(r["losses"][i : i + chunk], chunk) for i in range(0, args.steps, chunk)]
        line["loss_curve"] = [round(x, 4) for x in curves[name]]
        for k in (
            "tokens_per_s",
            "peak_mem_gib",
            "skipped_steps",
            "wall_s",
            "windows",
            "float8_linears",
            "lm_head_fp8",
            "heldout_windows",
            "heldout_loss",
            "heldout_loss_as_trained",
        ):
            if r.get(k) is not None:
                line[k] = r[k]
        if batch * args.steps > r["windows"]:
            line["windows_repeated"] = batch * args.steps - r["windows"]  # the store ran out: an epoch began again
        results[name] = line
        print(json.dumps(line), flush=True)
    if base not in results or "fp8-blocks" not in results:
        return 0  # one run alone: --compare joins it with the other's line
    ref, f8 = results[base], results["fp8-blocks"]
    verdict = make_verdict(common, ref, f8, finals[base], finals["fp8-blocks"], (curves[base], curves["fp8-blocks"]))
    if args.baseline_twice:
        verdict["baseline_repeat_rel_diff"] = compare(finals[base], finals[f"{base} again"])["rel_diff"]
    print(json.dumps(verdict), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
